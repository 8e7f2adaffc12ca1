#!/usr/bin/env bash
# One device iteration for fp4_moe: GPU tests + bench (+ optional tile sweep), logs under $OUT.
# Usage on the device machine (repo root): OUT=/some/dir [SWEEP=1 SWEEP_BUDGET=90] [QUICK=1]
#   [TEST_K='expr'] [IMPLS=dequant,cuda_decode] [TOKENS=1,2,4] bash scripts/device_fp4_moe.sh
# The extension (csrc/, for the cuda_decode impl) is built here first unless deepseek_v4_kernel/_C.so exists.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(pwd)/build/fp4_moe_out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ ! -f deepseek_v4_kernel/_C.so ]; then
    DSV4_KERNEL_EXTRA_ARCHS=90a NVCC_THREADS=8 bash scripts/build_ext.sh deepseek_v4_kernel/_C.so > "$OUT/build.log" 2>&1
    echo "extension build rc=$?"
fi
t0=$(date +%s)
timeout ${TEST_TIMEOUT:-150} python -m pytest -q -rs tests/test_fp4_moe.py -p no:cacheprovider \
    --durations=12 ${TEST_K:+-k "$TEST_K"} --junitxml="$OUT/pytest.xml" > "$OUT/pytest_full.log" 2>&1
echo "pytest rc=$? ($(( $(date +%s) - t0 )) s)"
tail -60 "$OUT/pytest_full.log" | tee "$OUT/pytest.log"
t0=$(date +%s)
timeout ${BENCH_TIMEOUT:-200} python scripts/bench_fp4_moe.py --out "$OUT" \
    ${QUICK:+--quick} ${SWEEP:+--sweep --sweep-budget ${SWEEP_BUDGET:-90}} ${IMPLS:+--impls $IMPLS} ${TOKENS:+--tokens $TOKENS} ${BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
grep -v '^sweep' "$OUT/bench.log" | tail -40
grep '^sweep' "$OUT/bench.log" | cut -c1-400
