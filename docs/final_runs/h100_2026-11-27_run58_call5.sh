#!/bin/bash
# run 58 call 5 (the tree of the head after the out-bound commits): the README main command on the device (build +
# doctor, forced: the sparse-decode self-test now checks the rounding bounds too), then the whole suite on the GPU with
# that library (the sm_120a AOT compiles and the two-GPU tests deselected, as in run 57 call 10)
nvidia-smi --query-gpu=name --format=csv,noheader
export DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; tail -n 12 $OUT/main_command.log | cut -c1-220
DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so timeout 420 python3 -m pytest -q -rs -p no:cacheprovider tests \
  -k "not sm120_aot and not test_multi_gpu" > $OUT/pytest_suite.log 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_suite.log
