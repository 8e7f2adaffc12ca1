#!/bin/bash
# run 64 call 2: the per-call floor of bare kernels in a CUDA graph (scripts/bench_latency_floor.py, now with a
# parallel one-round-trip merge and PDL variants) next to ours and SGLang 0.5.23's Triton fallback at b = 1 timed in
# the same call (README bench, b = 1 rows only; the library carried: build/run63_sm90a.so, csrc unchanged since
# d4bf30a).
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export PYTHONUNBUFFERED=1
mkdir -p $OUT/bench
DSV4_KERNEL_LIB=$PWD/build/run63_sm90a.so timeout 200 python3 scripts/bench_sparse_decode.py --bs 1 --out $OUT/bench > $OUT/bench_b1.log 2>&1; echo "bench rc=$?"
grep -v "^\[deepseek" $OUT/bench_b1.log | tail -n 14 | cut -c1-200
for r in 1 2; do
  timeout 120 python3 scripts/bench_latency_floor.py --from-bench $OUT/bench/bench_sparse_decode.json --out $OUT/floor_r$r.json > $OUT/floor_r$r.log 2>&1; echo "floor round $r rc=$?"
  tail -n 9 $OUT/floor_r$r.log
done
