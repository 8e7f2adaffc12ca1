#!/bin/bash
# run 64 call 3 (the session's head tree, bd1cd95): the README main command on a fresh machine (build sm_120a + sm_90a, doctor,
# forced) and the GPU suite under the device's triton 3.6.0 with that library (AOT compiles and two-GPU tests
# deselected, as in runs 59-63; the new test of scripts/bench_latency_floor.py runs its Triton kernels compiled here).
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; grep -E "PASS|FAIL|Triton-dependent|^real" $OUT/main_command.log | cut -c1-160
export DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
( time timeout 420 python3 -m pytest -q -rs -p no:cacheprovider tests -k "not sm120_aot and not test_multi_gpu" ) > $OUT/pytest_suite.log 2>&1
echo "pytest rc=$?"; grep -E "passed|failed|^real" $OUT/pytest_suite.log | cut -c1-200
