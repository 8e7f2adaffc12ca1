#!/bin/bash
# run 59 call 4 (two H100s; the tree of the head: csrc/ of 6774cc8, the launch model as functions, the fit tool):
# the README main command (build sm_120a + sm_90a, doctor, forced), then with that library test_sparse_decode.py and
# the two-GPU tests (test_multi_gpu.py)
nvidia-smi --query-gpu=name --format=csv,noheader
export DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; grep -E "PASS|FAIL|SKIP|^real" $OUT/main_command.log | cut -c1-160
LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
DSV4_KERNEL_LIB=$LIB timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_decode.py > $OUT/pytest_sparse_decode.log 2>&1
echo "test_sparse_decode rc=$?"; tail -n 1 $OUT/pytest_sparse_decode.log
DSV4_KERNEL_LIB=$LIB timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_multi_gpu.py > $OUT/pytest_multi_gpu.log 2>&1
echo "test_multi_gpu rc=$?"; tail -n 1 $OUT/pytest_multi_gpu.log
