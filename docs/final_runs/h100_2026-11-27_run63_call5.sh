#!/bin/bash
# run 63 call 5 (the session's head tree, after the doctor's newest-checked-Triton clause, ec8c4df): the README main
# command on a fresh machine (build sm_120a + sm_90a, doctor, forced) and test_doctor.py with that library.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
( time (DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > $OUT/main_command.log 2>&1
echo "main command rc=$?"; grep -E "PASS|FAIL|Triton-dependent|^real" $OUT/main_command.log | cut -c1-160
DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_doctor.py > $OUT/pytest_doctor.log 2>&1
echo "pytest rc=$?"; tail -n 1 $OUT/pytest_doctor.log
