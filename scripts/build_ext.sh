#!/usr/bin/env bash
# Build the C-ABI CUDA library deepseek_v4_kernel/_C.so from csrc/ (no torch needed, no GPU needed).
#   scripts/build_ext.sh [OUTPUT_PATH]
# env: NVCC (compiler, default nvcc on PATH or /usr/local/cuda/bin/nvcc),
#      DSV4_KERNEL_EXTRA_ARCHS (space/comma separated, e.g. "90a"): extra -gencode targets besides sm_120a,
#      NVCC_THREADS (default 2), DSV4_CSRC (source tree, default csrc/; tools/trace_sparse_decode.py
#      builds an instrumented copy with it), DSV4_NVCC_FLAGS (extra nvcc flags, e.g. -D overrides of tile
#      constants for an experiment).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTPUT=${1:-$ROOT/deepseek_v4_kernel/_C.so}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
ARCHS="120a ${DSV4_KERNEL_EXTRA_ARCHS:-}"
ARCHS=${ARCHS//,/ }
GENCODE=()
LIST=""
for a in $ARCHS; do
  GENCODE+=(-gencode "arch=compute_${a},code=sm_${a}")
  LIST="${LIST:+$LIST,}sm_${a}"
done
mkdir -p "$(dirname "$OUTPUT")"
CSRC=${DSV4_CSRC:-$ROOT/csrc}
SRCS=("$CSRC/api.cu" "$CSRC"/sparse_decode/*.cu "$CSRC"/fp4_moe/*.cu "$CSRC"/hc_prenorm/*.cu "$CSRC"/fp8_linear/*.cu)
set -x
"$NVCC" -shared -Xcompiler -fPIC -cudart static -O3 -std=c++17 --threads "${NVCC_THREADS:-2}" \
  "${GENCODE[@]}" -DDSV4_BUILD_ARCHS="\"$LIST\"" -I"$CSRC" ${DSV4_NVCC_FLAGS:-} \
  "${SRCS[@]}" -o "$OUTPUT.tmp"
mv -f "$OUTPUT.tmp" "$OUTPUT"
