#!/bin/bash
# run 59 call 1: the S / P V loops' ldmatrix lane addresses written once (M64KFrags / M64VFrags in kernel_mma64.cuh,
# frags.so) against the head's library (base.so, 294375b): every mma64 kernel's SASS is identical; on sm_90a only the
# 16-head warp-specialised kernel (not deep) differs (instruction order, same count), so: the sparse-decode tests with
# frags.so, and an A/B of the split launches (h100_run56_time_shapes.py "small", which launch that kernel; alternating
# processes, two rounds, min per row).
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
echo "== frags tests"; DSV4_KERNEL_LIB=build/r59/frags.so timeout 150 python -m pytest -q -x $T 2>&1 | tail -n 3
for set in small small; do for L in base frags; do
  DSV4_KERNEL_LIB=build/r59/$L.so timeout 100 python docs/sparse_decode_runs/h100_run56_time_shapes.py $L $set 2>&1 | grep -v "^\[deepseek"
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
    h = min(d.get("base", [float("nan")]))
    print(f"{s:18s} base {h:8.2f}  " + "  ".join(f"{k} {min(v):8.2f} ({min(v) / h:.3f})" for k, v in d.items() if k != "base"))
PY
