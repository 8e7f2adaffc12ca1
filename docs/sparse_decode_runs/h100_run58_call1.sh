#!/bin/bash
# run 58 call 1: split partials stored as bf16 (bf16.so, -DDSV4_PART_BF16; an experiment) against main's library
# (main.so, 4a04a8f): tests with bf16.so, the output error of both against the float64 reference (split and unsplit),
# an A/B of split launches (h100_run56_time_shapes.py "small", alternating processes, two rounds), and the launch sweep
# of four small-b shapes with each library.
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
echo "== bf16 tests"; DSV4_KERNEL_LIB=build/r58/bf16.so timeout 150 python -m pytest -q -x $T 2>&1 | tail -n 5
for L in main bf16; do DSV4_KERNEL_LIB=build/r58/$L.so timeout 120 python docs/sparse_decode_runs/h100_run58_partials_error.py $L 2>&1 | grep -v "^\[deepseek\|^JSON"; done | tee $OUT/error.log
for set in small small; do for L in main bf16; do
  DSV4_KERNEL_LIB=build/r58/$L.so timeout 90 python docs/sparse_decode_runs/h100_run56_time_shapes.py $L $set 2>&1 | grep -v "^\[deepseek"
done; done > $OUT/ab.log 2>&1
python3 - $OUT/ab.log <<'PY'
import json, sys
res = {}
for line in open(sys.argv[1]):
    if line.startswith("JSON"):
        for k, v in json.loads(line[5:]).items():
            for s, t in v.items(): res.setdefault(s, {}).setdefault(k, []).append(t)
    elif "us" not in line: print(line.rstrip())
for s, d in res.items():
    h = min(d.get("main", [float("nan")]))
    print(f"{s:18s} main {h:8.2f}  " + "  ".join(f"{k} {min(v):8.2f} ({min(v) / h:.3f})" for k, v in d.items() if k != "main"))
PY
for L in main bf16; do echo "== sweep $L"; DSV4_KERNEL_LIB=build/r58/$L.so timeout 150 python scripts/sweep_sparse_decode.py --out $OUT/sweep_$L --bs 1,8 --hs 64 --sqs 1 --extras 512,2048 --reps 8 2>&1 | grep -v "^\[deepseek" | tail -n 40; done
