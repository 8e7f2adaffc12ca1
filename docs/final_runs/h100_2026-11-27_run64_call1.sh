#!/bin/bash
# run 64 call 1 (head a4daefa + scripts/bench_latency_floor.py): the README main command on a fresh machine (build
# sm_120a + sm_90a, doctor, forced); the sparse-decode GPU tests with that library (a4daefa's `_tiles` helper was not
# GPU-run); the README sparse-decode bench (SGLang 0.5.23's Triton fallback carried); the per-call floor of bare
# kernels in a CUDA graph by the same timing method (scripts/bench_latency_floor.py).
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; grep -E "PASS|FAIL|^real" $OUT/main_command.log | cut -c1-160
LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
( time DSV4_KERNEL_LIB=$LIB timeout 280 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_decode.py ) > $OUT/pytest_sparse_decode.log 2>&1
echo "pytest rc=$?"; tail -n 4 $OUT/pytest_sparse_decode.log
mkdir -p $OUT/bench
DSV4_KERNEL_LIB=$LIB timeout 300 python3 scripts/bench_sparse_decode.py --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -v "^\[deepseek" $OUT/bench.log | tail -n 50 | cut -c1-200
timeout 120 python3 scripts/bench_latency_floor.py --out $OUT/floor.json > $OUT/floor.log 2>&1; echo "floor rc=$?"
cat $OUT/floor.log | tail -n 12
