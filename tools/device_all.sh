#!/usr/bin/env bash
# The one GPU run: build (if no extension was carried), doctor with self-test, the whole test
# suite on the GPU, every benchmark. Everything lands in $OUT/results.tar.gz (benches' JSON/PNG,
# logs) plus $OUT/summary.log; the tables print last.
# Usage (device machine, repo root): OUT=/some/dir bash tools/device_all.sh [bench ops...]
#   DEVICE_TESTS=0 skips doctor + tests; ARGS_<op>="..." passes extra arguments to bench_<op>.py;
#   BENCH_TIMEOUT_<op> / BENCH_TIMEOUT: seconds per bench (default 150, sparse_decode 240)
set -u
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
OUT=${OUT:-$(pwd)/build/device_out}
work=$(mktemp -d)
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$work/summary.log"; }
{ nvidia-smi -L; python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"; } \
    2>&1 | tee "$work/env.txt"

if [ -n "${DSV4_KERNEL_LIB:-}" ] && [ -f "$DSV4_KERNEL_LIB" ]; then
    log "using the carried extension $DSV4_KERNEL_LIB"
elif [ ! -f deepseek_v4_kernel/_C.so ]; then
    log "building the extension here (sm_90a + sm_120a)"
    DSV4_KERNEL_EXTRA_ARCHS=90a bash scripts/build_ext.sh deepseek_v4_kernel/_C.so > "$work/build.log" 2>&1
    log "build rc=$?"
fi

if [ "${DEVICE_TESTS:-1}" != 0 ]; then   # DEVICE_TESTS=0: benches only (a second call within the 10-minute limit)
    log "doctor"
    timeout 180 python3 -m deepseek_v4_kernel doctor 2>&1 | tee "$work/doctor.txt"
    log "doctor rc=${PIPESTATUS[0]}"

    log "tests"
    timeout ${TEST_TIMEOUT:-420} python3 -m pytest -q -rs -p no:cacheprovider tests ${PYTEST_ARGS:-} > "$work/pytest.log" 2>&1
    log "pytest rc=$?"
    tail -15 "$work/pytest.log" | tee -a "$work/summary.log"
fi

ops=${*:-sparse_decode sparse_decode_tp_heads indexer_logits hc_prenorm fp4_moe}
for op in $ops; do
    [ -f "benchmarks/bench_$op.py" ] || { log "no bench for $op"; continue; }
    mkdir -p "$work/bench_$op"
    log "bench $op"
    extra_var="ARGS_$op"  # e.g. ARGS_sparse_decode="--quick": per-bench extra arguments
    # per-bench limit: BENCH_TIMEOUT_<op>, else BENCH_TIMEOUT, else 150 s; the sparse-decode table takes ~150 s on
    # an H100 since its competitors run on every input set at small b (2026-11-25), so it gets 240 s
    tmo_var="BENCH_TIMEOUT_$op"; tmo_default=150; [ "$op" = sparse_decode ] && tmo_default=240
    timeout ${!tmo_var:-${BENCH_TIMEOUT:-$tmo_default}} python3 "benchmarks/bench_$op.py" --out "$work/bench_$op" ${!extra_var:-} \
        > "$work/bench_$op/bench.log" 2>&1
    log "bench $op rc=$?"
done
tar -C "$work" -czf "$OUT/results.tar.gz" .
cp "$work/summary.log" "$OUT/summary.log"
for op in $ops; do [ -f "$work/bench_$op/bench.log" ] && { echo "---- $op"; tail -30 "$work/bench_$op/bench.log"; }; done
