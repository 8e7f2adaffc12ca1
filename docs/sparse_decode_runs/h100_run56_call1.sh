#!/bin/bash
# run 56 call 1: the lazy running max in the warp-specialised kernels (lazy.so; noskip.so: the lazy max without
# skipping the O rescale; head.so: the head's kernels, SASS identical to run 55's library): tests with auto and with
# each warp-specialised kernel forced, fuzz, then an A/B of the three libraries (alternating processes, two rounds)
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
L=build/r56/lazy.so
{
for impl in auto mma64ws mma64wsh32 mma64wsh16deep; do
  echo "== $impl"; DSV4_KERNEL_LIB=$L DSV4_SPARSE_DECODE_IMPL=$impl timeout 90 python -m pytest -q $T 2>&1 | tail -n 3
done
echo "== mma64wsh16 growing"; DSV4_KERNEL_LIB=$L DSV4_SPARSE_DECODE_IMPL=mma64wsh16 timeout 60 python -m pytest -q $T -k "growing or sink or split" 2>&1 | tail -n 2
echo "== fuzz"; DSV4_KERNEL_LIB=$L DSV4_FUZZ_CASES=200 DSV4_FUZZ_SEED=58000 timeout 70 python -m pytest -q $T -k fuzz 2>&1 | tail -n 3
} > $OUT/pytest.log 2>&1
grep -v "^\.\.\.\." $OUT/pytest.log | tail -n 30
for r in 1 2; do for L in head lazy noskip; do
  DSV4_KERNEL_LIB=build/r56/$L.so timeout 60 python build/r56/time_shapes.py $L narrow 2>&1 | grep -v "^\[deepseek"
done; done > $OUT/ab_narrow.log 2>&1
python3 - $OUT/ab_narrow.log <<'PY'
import json, sys
res = {}
for line in open(sys.argv[1]):
    if line.startswith("JSON"):
        for k, v in json.loads(line[5:]).items():
            for s, t in v.items(): res.setdefault(s, {}).setdefault(k, []).append(t)
    elif "us" not in line: print(line.rstrip())
for s, d in res.items():
    h = min(d.get("head", [float("nan")]))
    print(f"{s:18s} head {h:8.2f}  " + "  ".join(f"{k} {min(v):8.2f} ({min(v) / h:.3f})" for k, v in d.items() if k != "head"))
PY
