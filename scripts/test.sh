#!/usr/bin/env bash
# The test command (README, CI): install what the tests need, fetch the real SGLang wheels
# the patch tests run against, run the whole suite. GPU tests skip (with the reason) where
# there is no CUDA device; Triton kernels then run in interpreter mode.
# Extra arguments go to pytest (e.g. scripts/test.sh -k patch).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PY=${PYTHON:-python3}
if [ -z "${DSV4_SKIP_INSTALL:-}" ]; then
    $PY -m pip install -q --disable-pip-version-check -r requirements-test.txt
fi
bash scripts/fetch_sglang_wheels.sh
exec $PY -m pytest -ra -q tests "$@"
