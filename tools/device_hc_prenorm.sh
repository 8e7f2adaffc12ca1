#!/usr/bin/env bash
# One device iteration for hc_prenorm: GPU tests + bench (+ tile sweep, diagnostics).
# Usage on the device machine (repo root):
#   OUT=/some/dir SWEEP=1 DIAG=1 TABLE=1 MMA_SYNC=1 bash tools/device_hc_prenorm.sh
# SWEEP=1 times every candidate config per m (each checked against float64 first),
# TABLE=1 then times the main rows with the table made of the sweep's winners.
# The bench runs once as Triton builds for this GPU ($OUT/native) and, with MMA_SYNC=1,
# once more with DISABLE_MMA_V3=1 ($OUT/mma_sync): on an H100 that swaps wgmma for
# mma.sync, the instruction class SM120 has (the "mma" tile table is tuned there).
# SWEEP / TABLE apply to the MMA_SYNC pass when it runs, else to the native one.
# BENCH_ARGS: more bench_hc_prenorm.py arguments for both passes (e.g. "--ms 128,512 --cuda-sweep").
# PYTEST_MMA_SYNC=1 (or MMA_SYNC=1): the GPU tests once more under DISABLE_MMA_V3=1; SKIP_BENCH=1: no bench.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(pwd)/build/hc_prenorm_out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout ${TEST_TIMEOUT:-150} python -m pytest -q -rs tests/test_hc_prenorm.py tests/test_hc_prenorm_kernels.py tests/test_hc_prenorm_sums.py tests/test_hc_prenorm_dispatch.py -p no:cacheprovider \
    --durations=5 ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -60 > "$OUT/pytest.log"
echo "pytest rc=${PIPESTATUS[0]}"
tail -12 "$OUT/pytest.log"
if [ -n "${MMA_SYNC:-}${PYTEST_MMA_SYNC:-}" ]; then   # the GPU tests again where Triton builds mma.sync (SM120's class)
    DISABLE_MMA_V3=1 timeout ${TEST_TIMEOUT:-150} python -m pytest -q -rs tests/test_hc_prenorm.py tests/test_hc_prenorm_kernels.py tests/test_hc_prenorm_sums.py tests/test_hc_prenorm_dispatch.py -p no:cacheprovider \
        -m gpu ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tail -30 > "$OUT/pytest_mma_sync.log"
    echo "pytest (DISABLE_MMA_V3=1) rc=${PIPESTATUS[0]}"
    tail -3 "$OUT/pytest_mma_sync.log"
fi
bench() {  # $1: out dir, rest: extra args
    local d=$1; shift
    mkdir -p "$d"
    timeout ${BENCH_TIMEOUT:-200} python benchmarks/bench_hc_prenorm.py --out "$d" --reps ${REPS:-30} \
        ${DIAG:+--diag} ${BENCH_ARGS:-} "$@" > "$d/bench.log" 2>&1
    echo "bench $d rc=$?"
    rm -f "$d"/*.png
    grep -v "^  sweep" "$d/bench.log" | grep -v '^{"m"' | tail -30
}
SW="${SWEEP:+--sweep} ${TABLE:+--table-from-sweep} ${SWEEP_MS:+--sweep-ms $SWEEP_MS}"
if [ -n "${SKIP_BENCH:-}" ]; then
    :   # A/B-only call
elif [ -n "${MMA_SYNC:-}" ]; then
    bench "$OUT/native"
    DISABLE_MMA_V3=1 bench "$OUT/mma_sync" $SW
else
    bench "$OUT/native" $SW
fi
# A/B of compiled libraries: AB_LIBS="build/ref.so build/new.so" (carried; the first is the baseline), AB_ROUNDS
# (default 2) alternating processes, each a --cuda-sweep of AB_MS (every sub-split count P, num_splits None and
# SGLang's split count, each call checked against float64 first), or with AB_SWEEP=small a --small-sweep of AB_MS
# (the few-rows kernel at every rows-per-block R); per (m, S, P or variant) table in $OUT/ab.log
if [ -n "${AB_LIBS:-}" ]; then
    for r in $(seq 1 ${AB_ROUNDS:-2}); do
        for lib in $AB_LIBS; do
            name=$(basename "$lib" .so)
            DSV4_KERNEL_LIB=$(pwd)/$lib timeout ${BENCH_TIMEOUT:-200} python benchmarks/bench_hc_prenorm.py \
                --out "build/ab_${name}_$r" --ms "" --impls cuda --reps ${REPS:-30} \
                --${AB_SWEEP:-cuda}-sweep ${AB_MS:-256,512,1024,2048} > "build/ab_${name}_$r.log" 2>&1
            echo "ab $name round $r rc=$?"
        done
    done
    python - "${AB_ROUNDS:-2}" $AB_LIBS <<'PY' 2>&1 | tee "$OUT/ab.log"
import json, os, sys
rounds, names = int(sys.argv[1]), [os.path.basename(v)[:-3] for v in sys.argv[2:]]
def load(n, r):
    d = json.load(open(f"build/ab_{n}_{r}/bench_hc_prenorm.json"))
    if "small_sweep" in d:
        return {(x["m"], x["S"], x["variant"].replace(" ", "")): x for x in d["small_sweep"]}
    return {(x["m"], x["S"], f'{x["P"]}{" " + x["sum"] if x.get("sum") else ""}'): x for x in d["cuda_sweep"]}
data = {n: [load(n, r) for r in range(1, rounds + 1)] for n in names}
base = names[0]
print(json.load(open(f"build/ab_{base}_1/bench_hc_prenorm.json"))["meta"])
print(f"{'m':>5} {'S':>4} {'P':>10} | " + " | ".join(f"{n + ' us (rounds) %fl err':>34}" for n in names)
      + " | " + " ".join(f"{n + '/' + base:>10}" for n in names[1:]))
for k in data[base][0]:
    if any(k not in d for n in names for d in data[n]):
        continue
    mins = {n: min(d[k]["us"] for d in data[n]) for n in names}
    cells = []
    for n in names:
        err = max(d[k]["rel_err"] for d in data[n])
        pct = max(d[k]["floor_pct"] for d in data[n])
        pick = "*" if data[n][0][k]["picked"] else " "
        times = " ".join(f"{d[k]['us']:7.2f}" for d in data[n])
        cells.append(f"{times} {pct:3.0f} {err:.0e}{pick}")
    print(f"{k[0]:>5} {k[1]:>4} {k[2]:>10} | " + " | ".join(f"{c:>34}" for c in cells)
          + " | " + " ".join(f"{mins[n] / mins[base]:>10.3f}" for n in names[1:]))
PY
fi
