#!/usr/bin/env bash
# fp8_linear on the GPU test machine (H200): its GPU tests (each GPU test once per kernel: ring, regs), then the bench
# (ours: the ring kernel, its int decode and the first "regs" kernel, vs SGLang's Triton block-FP8 GEMM,
# natively and as mma.sync, DeepGEMM's native kernel, cuBLAS bf16 for wo_a), results under $OUT/fp8_linear/.
# Usage (repo root, library built by `DSV4_KERNEL_EXTRA_ARCHS=90a scripts/build.sh` into build/dsv4; SGLang 0.5.17 and
# DeepGEMM from the e2e bundle at $DSV4_E2E_SITE, default /tmp/e2e/site, transformers from its sibling tf/):
#   OUT=/some/dir bash tools/gpu_fp8_linear.sh [extra bench args, e.g. --tp 2]
# Bounded: tests <= 45 s, bench <= 105 s (its mma.sync child <= 40 s of that); ~155 s in all. Prints the pytest tail
# and the bench's summary table last (per shape and M: ours µs, % of the byte floor, the int decode, the regs kernel and
# its ratio to ours, Triton native /
# mma.sync, DeepGEMM with / without its activation quant, cuBLAS bf16 for wo_a, and the split count).
set -uo pipefail
OUT=${OUT:?set OUT to a directory for the results}/fp8_linear
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
SITE=${DSV4_E2E_SITE:-/tmp/e2e/site}
TF=$(dirname "$SITE")/tf
LIB=${DSV4_KERNEL_LIB:-$PWD/build/dsv4/deepseek_v4_kernel/_C.so}
if [ ! -f "$LIB" ]; then
  LIB=$PWD/build/fp8_linear/_C.so
  echo "gpu_fp8_linear: no build/dsv4 library; building $LIB (sm_120a + sm_90a)"
  DSV4_KERNEL_EXTRA_ARCHS=90a NVCC_THREADS=8 bash scripts/build_ext.sh "$LIB" > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
fi
export DSV4_KERNEL_LIB=$LIB
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/env.txt"
t0=$(date +%s)
PYTHONPATH=$PWD timeout 45 python3 -m pytest -q -rs -p no:cacheprovider tests/test_fp8_linear.py \
  -k "not test_every_model_shape or tp1 or tp8" --junitxml="$OUT/pytest.xml" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? ($(( $(date +%s) - t0 )) s)"; tail -15 "$OUT/pytest.log"
t0=$(date +%s)
PP=$PWD
[ -d "$SITE" ] && PP=$TF:$SITE:$PWD || echo "gpu_fp8_linear: no $SITE: SGLang / DeepGEMM competitors will say why they are missing"
PYTHONPATH=$PP timeout 105 python3 benchmarks/bench_fp8_linear.py --out "$OUT" --sweep-splits --budget-s 35 --child-timeout 40 "$@" \
  > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - t0 )) s)"
grep -v '^{' "$OUT/bench.log" | tail -80
