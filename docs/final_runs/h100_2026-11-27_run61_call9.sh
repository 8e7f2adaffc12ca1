#!/bin/bash
# run 61 call 9 (the session's head tree): the README main command on a fresh machine (build sm_120a + sm_90a, doctor,
# forced), then the README sparse-decode bench with that library (44 rows, SGLang 0.5.23's Triton fallback carried).
nvidia-smi --query-gpu=name --format=csv,noheader
export DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; grep -E "PASS|FAIL|^real" $OUT/main_command.log | cut -c1-160
LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
mkdir -p $OUT/bench
DSV4_KERNEL_LIB=$LIB timeout 300 python3 scripts/bench_sparse_decode.py --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
grep -v "^\[deepseek" $OUT/bench.log | tail -n 50 | cut -c1-200
