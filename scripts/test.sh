#!/usr/bin/env bash
# The test command (README, CI): install what the tests need, fetch the real SGLang wheels
# the patch tests run against, run the whole suite. GPU tests skip (with the reason) where
# there is no CUDA device; Triton kernels then run in interpreter mode.
# Extra arguments go to pytest (e.g. scripts/test.sh -k patch).
# Without extra arguments, the Triton-kernel tests then run once more under each Triton version of
# requirements-triton-compat.txt (the ones newer SGLang images ship), each in a venv under .venv-triton/
# that reuses this environment's other packages; DSV4_TRITON_COMPAT=0 skips that pass.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PY=${PYTHON:-python3}
if [ -z "${DSV4_SKIP_INSTALL:-}" ]; then
    $PY -m pip install -q --disable-pip-version-check -r requirements-test.txt
fi
bash scripts/fetch_sglang_wheels.sh
rc=0
$PY -m pytest -ra -q tests "$@" || rc=$?
[ "$#" -eq 0 ] && [ "${DSV4_TRITON_COMPAT:-1}" != 0 ] || exit $rc
TRITON_TESTS=(tests/test_indexer_logits.py tests/test_hc_prenorm.py tests/test_hc_prenorm_kernels.py tests/test_hc_prenorm_sums.py
              tests/test_hc_prenorm_dispatch.py tests/test_fp4_moe.py)
for pin in $(grep -oE '^triton==[^[:space:]]+' requirements-triton-compat.txt); do
    venv=.venv-triton/${pin#triton==}
    if [ ! -x "$venv/bin/python" ]; then
        $PY -m venv --system-site-packages "$venv"
    fi
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$pin"
    have=$("$venv/bin/python" -c 'import triton; print(triton.__version__)')
    if [ "$have" != "${pin#triton==}" ]; then   # the venv must shadow this environment's Triton
        echo "scripts/test.sh: $venv imports triton $have, expected ${pin#triton==}" >&2
        exit 1
    fi
    echo "== Triton-kernel tests under triton $have ($pin, requirements-triton-compat.txt)"
    "$venv/bin/python" -m pytest -ra -q "${TRITON_TESTS[@]}" || rc=$?
done
exit $rc
