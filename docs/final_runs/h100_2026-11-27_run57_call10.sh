#!/bin/bash
# run 57 call 10 (a6aa920 + docs): the README main command on the device (build + doctor, forced), then the whole suite on
# the GPU with that library and the tree of main (the sm_120a AOT compiles and the two-GPU tests deselected)
nvidia-smi --query-gpu=name --format=csv,noheader
export DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; tail -n 12 $OUT/main_command.log | cut -c1-220
DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so timeout 420 python3 -m pytest -q -rs -p no:cacheprovider tests \
  -k "not sm120_aot and not test_multi_gpu" > $OUT/pytest_suite.log 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_suite.log
