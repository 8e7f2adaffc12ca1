#!/bin/bash
# run 62 call 13 (the session's head tree, 7c38379): the README main command on a fresh machine (build sm_120a +
# sm_90a, doctor with its new Triton-dependent-choices line, forced), then with that library test_doctor.py,
# test_fp4_moe.py and test_hc_prenorm.py on the GPU under the device's triton 3.6.0 (AOT deselected).
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; grep -E "PASS|FAIL|Triton-dependent|^real" $OUT/main_command.log | cut -c1-160
export DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_doctor.py tests/test_fp4_moe.py tests/test_hc_prenorm.py \
  -k "not sm120_aot" > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; tail -n 2 $OUT/pytest.log | cut -c1-200
