#!/usr/bin/env bash
# One device iteration for hc_prenorm: GPU tests + bench (+ optional tile sweep).
# Usage on the device machine (repo root): OUT=/some/dir SWEEP=1 bash scripts/device_hc_prenorm.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(pwd)/build/hc_prenorm_out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout ${TEST_TIMEOUT:-150} python -m pytest -q -rs tests/test_hc_prenorm.py -p no:cacheprovider \
    --junitxml="$OUT/pytest.xml" 2>&1 | tail -40 | tee "$OUT/pytest.log"
echo "pytest rc=${PIPESTATUS[0]}"
timeout ${BENCH_TIMEOUT:-200} python scripts/bench_hc_prenorm.py --out "$OUT" --reps ${REPS:-30} \
    ${SWEEP:+--sweep} 2>&1 | tee "$OUT/bench.log"
echo "bench rc=${PIPESTATUS[0]}"
