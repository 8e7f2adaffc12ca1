#!/usr/bin/env bash
# One device iteration for sparse_decode: (re)use the carried _C.so (build here if missing and nvcc exists),
# GPU tests, bench. Usage on the device machine (repo root): OUT=/some/dir bash scripts/device_sparse_decode.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(pwd)/build/sparse_decode_out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ ! -f deepseek_v4_kernel/_C.so ] || [ -n "${REBUILD:-}" ]; then
  DSV4_KERNEL_EXTRA_ARCHS=90a bash scripts/build_ext.sh > "$OUT/build.log" 2>&1; echo "build rc=$?"; tail -5 "$OUT/build.log"
fi
for impl in ${IMPLS:-simt mma}; do
  DSV4_SPARSE_DECODE_IMPL=$impl timeout ${TEST_TIMEOUT:-180} python -m pytest -q -rs tests/test_sparse_decode.py \
      tests/test_sparse_decode_build.py -p no:cacheprovider --junitxml="$OUT/pytest_$impl.xml" 2>&1 | tail -60 \
      | tee "$OUT/pytest_$impl.log"
  echo "pytest ($impl) rc=${PIPESTATUS[0]}"
done
timeout ${BENCH_TIMEOUT:-300} python scripts/bench_sparse_decode.py --out "$OUT" --reps ${REPS:-20} ${QUICK:+--quick} \
    2>&1 | tee "$OUT/bench.log"
echo "bench rc=${PIPESTATUS[0]}"
