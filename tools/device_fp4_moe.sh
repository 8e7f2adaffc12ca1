#!/usr/bin/env bash
# One device iteration for fp4_moe: GPU tests + bench (+ optional tile sweep), logs under $OUT.
# Usage on the device machine (repo root): OUT=/some/dir [SWEEP=1 SWEEP_BUDGET=90] [QUICK=1]
#   [TEST_K='expr'] [IMPLS=dequant,cuda_decode] [TOKENS=1,2,4] [REF_CSRC=build/ref/csrc]
#   [VARIANT_FLAGS='-DDSV4_FP4_MOE_STAGES=4;-DDSV4_FP4_MOE_MIN_BLOCKS=4'] bash tools/device_fp4_moe.sh
# The extension (csrc/, for the cuda_decode impl) is built here first unless deepseek_v4_kernel/_C.so exists.
# A/B in one call: REF_CSRC (another csrc/ tree, e.g. made here with `git archive main csrc | tar -x -C
# build/ref` and carried) and each VARIANT_FLAGS entry (-D overrides of this tree) are built into their own
# library, tested (the cuda_decode cases of test_fp4_moe.py) and benched again after the main bench (DSV4_KERNEL_LIB;
# impls dequant,cuda_decode, so each has its same-process competitor), all logged to $OUT/variants.log
# (names ref, variant<i>). E.g. VARIANT_FLAGS=-DDSV4_FP4_MOE_EARLY_WEIGHTS=0 (csrc/fp4_moe/kernel.cuh).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(pwd)/build/fp4_moe_out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
BUILD="env DSV4_KERNEL_EXTRA_ARCHS=90a NVCC_THREADS=4 bash scripts/build_ext.sh"
mkdir -p build/variants
if [ ! -f deepseek_v4_kernel/_C.so ]; then
    $BUILD deepseek_v4_kernel/_C.so > "$OUT/build.log" 2>&1 &
fi
if [ -n "${REF_CSRC:-}" ]; then
    DSV4_CSRC=$(cd "$REF_CSRC" && pwd) $BUILD build/variants/ref.so > build/variants/build_ref.log 2>&1 &
fi
IFS=';' read -r -a VARIANTS <<< "${VARIANT_FLAGS:-}"
for i in "${!VARIANTS[@]}"; do
    DSV4_NVCC_FLAGS="${VARIANTS[$i]}" $BUILD "build/variants/variant$i.so" > "build/variants/build_variant$i.log" 2>&1 &
done
wait
ls -la deepseek_v4_kernel/_C.so build/variants/*.so 2>&1
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-150} python -m pytest -q -rs tests/test_fp4_moe.py -p no:cacheprovider \
    --durations=12 ${TEST_K:+-k "$TEST_K"} --junitxml="$OUT/pytest.xml" > "$OUT/pytest_full.log" 2>&1
echo "pytest rc=$? ($(( $(date +%s) - t0 )) s)"
tail -60 "$OUT/pytest_full.log" | tee "$OUT/pytest.log"
t0=$(date +%s)
timeout ${BENCH_TIMEOUT:-200} python benchmarks/bench_fp4_moe.py --out "$OUT" \
    ${QUICK:+--quick} ${SWEEP:+--sweep --sweep-budget ${SWEEP_BUDGET:-90}} ${IMPLS:+--impls $IMPLS} ${TOKENS:+--tokens $TOKENS} ${BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
grep -v '^sweep' "$OUT/bench.log" | tail -40
grep '^sweep' "$OUT/bench.log" | cut -c1-400
bench_lib() {  # name, library: the cuda_decode GPU tests against it, then the bench; all into variants.log
    local log=build/variants/$1.log
    t0=$(date +%s)
    DSV4_KERNEL_LIB=$2 timeout ${TEST_TIMEOUT:-150} python -m pytest -q -rs tests/test_fp4_moe.py -p no:cacheprovider \
        -k "cuda_decode or default or uint8_scales" > "$log" 2>&1
    echo "pytest $1 (cuda_decode tests) rc=$? ($(( $(date +%s) - t0 )) s): $(tail -1 "$log")"
    t0=$(date +%s)
    DSV4_KERNEL_LIB=$2 timeout ${BENCH_TIMEOUT:-200} python benchmarks/bench_fp4_moe.py --out "build/variants/$1" \
        --impls dequant,cuda_decode ${TOKENS:+--tokens $TOKENS} --no-baselines >> "$log" 2>&1
    echo "bench $1 rc=$? ($(( $(date +%s) - t0 )) s)"
    tail -14 "$log"
    { echo "===== $1 ($2)"; cat "$log"; } >> "$OUT/variants.log"
}
[ -n "${REF_CSRC:-}" ] && bench_lib ref "$(pwd)/build/variants/ref.so"
for i in "${!VARIANTS[@]}"; do
    echo "variant$i: ${VARIANTS[$i]}"
    bench_lib "variant$i" "$(pwd)/build/variants/variant$i.so"
done
true
