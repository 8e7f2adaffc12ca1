#!/usr/bin/env bash
# The test command (README, CI): in its own virtual environment, fetch the real SGLang wheels the patch tests run
# against and run the whole suite. GPU tests skip (with the reason) where there is no CUDA device; Triton kernels then
# run in interpreter mode. Extra arguments go to pytest (e.g. scripts/test.sh -k patch).
#
# The environment: .venv-test/ (git-ignored), created on the first run by python3 (or $PYTHON) and reused; the test
# requirements (requirements-test.txt: torch, Triton, ...) are installed into it, again only when that file changes.
# Nothing is installed into the python3 that created it.
# Without extra arguments, the Triton-kernel tests then run once more under each Triton version of
# requirements-triton-compat.txt (the ones newer SGLang images ship), each in a venv under .venv-triton/ that sees the
# test environment's other packages; DSV4_TRITON_COMPAT=0 skips that pass.
# Env: PYTHON              the interpreter that creates the environment (default python3)
#      DSV4_TEST_VENV      its directory (default .venv-test); "none": run in $PYTHON itself and install nothing
#                          (an environment you prepared)
#      DSV4_SKIP_INSTALL=1 no pip install into the environment
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
BASE=${PYTHON:-python3}
VENV=${DSV4_TEST_VENV:-.venv-test}
if [ "$VENV" = none ]; then
    PY=$BASE
else
    if [ ! -x "$VENV/bin/python" ]; then
        echo "scripts/test.sh: creating the test environment $VENV ($("$BASE" -c 'import sys; print(sys.executable)'))"
        "$BASE" -m venv "$VENV"
    fi
    PY=$VENV/bin/python
    stamp=$VENV/.requirements-test.sha256
    want=$(sha256sum requirements-test.txt | cut -c1-64)
    if [ -z "${DSV4_SKIP_INSTALL:-}" ] && [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
        echo "scripts/test.sh: installing requirements-test.txt into $VENV"
        "$PY" -m pip install -q --disable-pip-version-check -r requirements-test.txt
        echo "$want" > "$stamp"
    fi
fi
PYTHON=$PY bash scripts/fetch_sglang_wheels.sh
rc=0
"$PY" -m pytest -ra -q tests "$@" || rc=$?
[ "$#" -eq 0 ] && [ "${DSV4_TRITON_COMPAT:-1}" != 0 ] || exit $rc
TRITON_TESTS=(tests/test_indexer_logits.py tests/test_hc_prenorm.py tests/test_hc_prenorm_kernels.py tests/test_hc_prenorm_sums.py
              tests/test_hc_prenorm_dispatch.py tests/test_fp4_moe.py tests/test_fp4_moe_dispatch.py
              tests/test_fp4_moe_gpu.py tests/test_fp4_moe_ids.py tests/test_op_arguments.py)
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
for pin in $(grep -oE '^triton==[^[:space:]]+' requirements-triton-compat.txt); do
    venv=.venv-triton/${pin#triton==}
    if [ ! -x "$venv/bin/python" ]; then
        "$PY" -m venv "$venv"
    fi
    # the test environment's packages after the venv's own (its Triton first); site.addsitedir also reads their .pth
    "$venv/bin/python" -c 'import os, sys, sysconfig
with open(os.path.join(sysconfig.get_paths()["purelib"], "dsv4-test-environment.pth"), "w") as f:
    f.write(f"import site; site.addsitedir({sys.argv[1]!r})\n")' "$(site_of "$PY")"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "$pin"
    have=$("$venv/bin/python" -c 'import triton; print(triton.__version__)')
    if [ "$have" != "${pin#triton==}" ]; then   # the venv must shadow the test environment's Triton
        echo "scripts/test.sh: $venv imports triton $have, expected ${pin#triton==}" >&2
        exit 1
    fi
    echo "== Triton-kernel tests under triton $have ($pin, requirements-triton-compat.txt)"
    "$venv/bin/python" -m pytest -ra -q "${TRITON_TESTS[@]}" || rc=$?
done
exit $rc
