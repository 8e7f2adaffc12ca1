#!/bin/bash
# run 61 call 7 (two H100s; the session's head tree): the README main command on a fresh machine (build sm_120a +
# sm_90a, doctor, forced; its library used for the rest), then the GPU tests of what this session touched: sparse
# decode (the cut of batches beyond one wave, the C ABI's plain_launch), the doctor, the patch targets, the extension
# and the two-GPU tests (a cut batch on cuda:1 with cuda:0 current).
nvidia-smi --query-gpu=name --format=csv,noheader
export DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; grep -E "PASS|FAIL|^real" $OUT/main_command.log | cut -c1-160
export DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
timeout 420 python3 -m pytest -q -rs -p no:cacheprovider tests/test_sparse_decode.py tests/test_multi_gpu.py \
  tests/test_doctor.py tests/test_patch_targets.py tests/test_extension_build.py -k "not sm120_aot" > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; tail -n 4 $OUT/pytest.log
