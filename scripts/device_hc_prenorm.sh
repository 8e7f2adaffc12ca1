#!/usr/bin/env bash
# One device iteration for hc_prenorm: GPU tests + bench (+ tile sweep, diagnostics).
# Usage on the device machine (repo root):
#   OUT=/some/dir SWEEP=1 DIAG=1 TABLE=1 MMA_SYNC=1 bash scripts/device_hc_prenorm.sh
# SWEEP=1 times every candidate config per m (each checked against float64 first),
# TABLE=1 then times the main rows with the table made of the sweep's winners.
# The bench runs once as Triton builds for this GPU ($OUT/native) and, with MMA_SYNC=1,
# once more with DISABLE_MMA_V3=1 ($OUT/mma_sync): on an H100 that swaps wgmma for
# mma.sync, the instruction class SM120 has (the "mma" tile table is tuned there).
# SWEEP / TABLE apply to the MMA_SYNC pass when it runs, else to the native one.
# BENCH_ARGS: more bench_hc_prenorm.py arguments for both passes (e.g. "--ms 128,512 --cuda-sweep").
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(pwd)/build/hc_prenorm_out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout ${TEST_TIMEOUT:-150} python -m pytest -q -rs tests/test_hc_prenorm.py -p no:cacheprovider \
    --durations=5 ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -60 > "$OUT/pytest.log"
echo "pytest rc=${PIPESTATUS[0]}"
tail -12 "$OUT/pytest.log"
bench() {  # $1: out dir, rest: extra args
    local d=$1; shift
    mkdir -p "$d"
    timeout ${BENCH_TIMEOUT:-200} python scripts/bench_hc_prenorm.py --out "$d" --reps ${REPS:-30} \
        ${DIAG:+--diag} ${BENCH_ARGS:-} "$@" > "$d/bench.log" 2>&1
    echo "bench $d rc=$?"
    rm -f "$d"/*.png
    grep -v "^  sweep" "$d/bench.log" | grep -v '^{"m"' | tail -30
}
SW="${SWEEP:+--sweep} ${TABLE:+--table-from-sweep} ${SWEEP_MS:+--sweep-ms $SWEEP_MS}"
if [ -n "${MMA_SYNC:-}" ]; then
    bench "$OUT/native"
    DISABLE_MMA_V3=1 bench "$OUT/mma_sync" $SW
else
    bench "$OUT/native" $SW
fi
