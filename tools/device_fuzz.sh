#!/usr/bin/env bash
# Randomised GPU checks of every op: the test files' test_gpu_fuzz* with many seeds, against the float64
# references, on both instruction classes where the Triton kernels differ (native, and DISABLE_MMA_V3=1: the
# mma.sync class SM120 has). One log per part in $OUT; a failure names its seed, which reproduces alone:
#   DSV4_FUZZ_SEED=<seed> DSV4_FUZZ_CASES=1 pytest tests/test_<op>.py -k fuzz
# Usage (device machine, repo root): OUT=/some/dir bash tools/device_fuzz.sh [parts...]
#   parts: sparse_decode hc_prenorm hc_prenorm_mma indexer_logits indexer_logits_mma fp4_moe fp4_moe_mma (default all)
#   FUZZ_CASES (default 60) calls per test, FUZZ_SEED (default 1000) the first seed, FUZZ_TIMEOUT (s, default 240) per
#   part (H100, cold Triton cache: 60 MoE calls ~125 s, 60 hc_prenorm ~50 s, 800 sparse-decode calls ~110 s; all
#   parts at the defaults ~7-8 min, within one 10-minute device call; but hc_prenorm's seeds 7000-7038 took 150 s
#   per part on 2026-11-25, ~3.8 s a call: the Triton configs a seed draws decide it, so 60 may need ~240 s)
set -u
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
OUT=${OUT:-$(pwd)/build/device_out}
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/fuzz_summary.log"; }
if [ ! -f deepseek_v4_kernel/_C.so ] && [ -z "${DSV4_KERNEL_LIB:-}" ]; then
    log "building the extension here (sm_90a + sm_120a)"
    DSV4_KERNEL_EXTRA_ARCHS=90a bash scripts/build_ext.sh deepseek_v4_kernel/_C.so > "$OUT/fuzz_build.log" 2>&1
    log "build rc=$?"
fi
parts=${*:-sparse_decode hc_prenorm hc_prenorm_mma fp4_moe fp4_moe_mma indexer_logits indexer_logits_mma}
for part in $parts; do
    op=${part%_mma}
    mma=; [ "$op" != "$part" ] && mma=1
    t0=$(date +%s)
    env ${mma:+DISABLE_MMA_V3=1} DSV4_FUZZ_CASES=${FUZZ_CASES:-60} DSV4_FUZZ_SEED=${FUZZ_SEED:-1000} \
        timeout ${FUZZ_TIMEOUT:-240} python3 -m pytest -q -rfE -p no:cacheprovider "tests/test_$op.py" -k fuzz \
        > "$OUT/fuzz_$part.log" 2>&1
    rc=$?
    log "$part rc=$rc ($(( $(date +%s) - t0 )) s): $(tail -1 "$OUT/fuzz_$part.log")"
    grep -E "^(FAILED|ERROR)" "$OUT/fuzz_$part.log" | head -20 | tee -a "$OUT/fuzz_summary.log"
done
