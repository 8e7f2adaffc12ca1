#!/bin/bash
# run 57 call 12: token_row by shift and mask for power-of-two page sizes (pw.so, this tree) against main's library
# (head2.so = call 8's final.so): tests with pw.so (two non-power-of-two page sizes added to the per-kernel test), fuzz, then
# an A/B of the two libraries (h100_run56_time_shapes.py, alternating processes; narrow set two rounds, wide set one).
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
echo "== pw tests"; DSV4_KERNEL_LIB=build/r57/pw.so timeout 120 python -m pytest -q $T 2>&1 | tail -n 3
echo "== pw fuzz"; DSV4_KERNEL_LIB=build/r57/pw.so DSV4_FUZZ_CASES=150 DSV4_FUZZ_SEED=57200 timeout 70 python -m pytest -q $T -k fuzz 2>&1 | tail -n 2
for set in narrow narrow wide; do for L in head2 pw; do
  DSV4_KERNEL_LIB=build/r57/$L.so timeout 90 python docs/sparse_decode_runs/h100_run56_time_shapes.py $L $set 2>&1 | grep -v "^\[deepseek"
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
    h = min(d.get("head2", [float("nan")]))
    print(f"{s:18s} head2 {h:8.2f}  " + "  ".join(f"{k} {min(v):8.2f} ({min(v) / h:.3f})" for k, v in d.items() if k != "head2"))
PY
