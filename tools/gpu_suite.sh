#!/usr/bin/env bash
# The README's main command and the whole test suite on a GPU machine that is not SM12x (the H100 / H200 of the
# device machine), in one call: build for sm_120a + sm_90a, the doctor with its self-tests (DSV4_KERNEL_FORCE=1),
# then pytest with that library. The sm_120a AOT compiles (CPU tests, CI runs them) and the two-GPU tests (a
# machine of one GPU) are deselected unless DSV4_SUITE_ALL=1.
# Usage (repo root): OUT=/some/dir bash tools/gpu_suite.sh [extra pytest args]
# Writes $OUT/main_command.log and $OUT/pytest_suite.log; prints a short summary.
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( time (DSV4_KERNEL_EXTRA_ARCHS=${DSV4_KERNEL_EXTRA_ARCHS:-90a} scripts/build.sh \
        && PYTHONPATH=build/dsv4 python3 -m deepseek_v4_kernel doctor) ) > "$OUT/main_command.log" 2>&1
rc_main=$?
echo "main command rc=$rc_main"
grep -E "PASS|FAIL|extension|patch layer|^real" "$OUT/main_command.log" | cut -c1-200
export DSV4_KERNEL_LIB=$PWD/build/dsv4/deepseek_v4_kernel/_C.so
select=(-k "not sm120_aot and not test_multi_gpu")
[ "${DSV4_SUITE_ALL:-0}" = 1 ] && select=()
( time timeout "${SUITE_TIMEOUT:-480}" python3 -m pytest -q -rs -p no:cacheprovider tests "${select[@]}" "$@" ) \
    > "$OUT/pytest_suite.log" 2>&1
rc_suite=$?
echo "pytest rc=$rc_suite"
grep -E "passed|failed|error|^real" "$OUT/pytest_suite.log" | tail -5 | cut -c1-200
exit $(( rc_main || rc_suite ))
