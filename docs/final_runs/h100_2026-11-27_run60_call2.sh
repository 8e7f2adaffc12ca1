#!/bin/bash
# run 60 call 2 (the tree of 3db7b17 + this script; csrc/ = 6774cc8's): the README main command on a fresh machine (build
# sm_120a + sm_90a, doctor, forced), the whole suite on the GPU with that library (the sm_120a AOT compiles and the
# two-GPU tests deselected, as in run 59 call 2), then scripts/trace_sparse_decode.py run with the traced build of call 1
# (carried; its kernels are csrc/'s) now that the traced call is the last of a graph replay.
nvidia-smi --query-gpu=name --format=csv,noheader
export DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; tail -n 12 $OUT/main_command.log | cut -c1-220
LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
DSV4_KERNEL_LIB=$LIB timeout 400 python3 -m pytest -q -rs -p no:cacheprovider tests \
  -k "not sm120_aot and not test_multi_gpu" > $OUT/pytest_suite.log 2>&1
echo "pytest rc=$?"; tail -n 3 $OUT/pytest_suite.log
DSV4_KERNEL_LIB=build/r60/trace.so TAG=trace SHAPES="1,64,512;8,64,512;32,64,512;128,16,512" timeout 100 \
  python3 scripts/trace_sparse_decode.py run 2>&1 | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once" > $OUT/trace.log
echo "trace rc=${PIPESTATUS[0]}"; cat $OUT/trace.log
