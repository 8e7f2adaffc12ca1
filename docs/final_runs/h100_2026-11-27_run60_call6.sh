#!/bin/bash
# run 60 call 6 (the tree of bb4dc2e + this script, the session's head): the README main command on a fresh machine
# (build sm_120a + sm_90a, doctor, forced), the README sparse-decode bench with that library (44 rows, SGLang 0.5.23's
# Triton fallback carried), then the whole suite on the GPU with it (the sm_120a AOT compiles and the two-GPU tests
# deselected, as in run 59 call 2)
nvidia-smi --query-gpu=name --format=csv,noheader
export DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; tail -n 8 $OUT/main_command.log | cut -c1-220
LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
mkdir -p $OUT/bench
DSV4_KERNEL_LIB=$LIB timeout 170 python3 scripts/bench_sparse_decode.py --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -v "^\[deepseek" $OUT/bench.log | tail -n 50 | cut -c1-200
DSV4_KERNEL_LIB=$LIB timeout 330 python3 -m pytest -q -rs -p no:cacheprovider tests \
  -k "not sm120_aot and not test_multi_gpu" > $OUT/pytest_suite.log 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_suite.log
