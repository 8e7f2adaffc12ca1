#!/usr/bin/env bash
# One device iteration for sparse_decode: build the extension (sm_120a + sm_90a) unless a carried _C.so
# is there and REBUILD is unset, GPU tests per kernel, bench (first of BENCH_IMPLS = "ours"), optional
# Nsight Compute profile of one shape. At most 6 files land in $OUT (the device tool returns 8).
# Usage on the device machine (repo root): OUT=/some/dir bash scripts/device_sparse_decode.sh
#   IMPLS="mma mma64"          kernels to run the GPU tests with (DSV4_SPARSE_DECODE_IMPL)
#   BENCH_IMPLS=mma64,mma      kernels to time; QUICK=1: b in {1, 128} only; REPS (default 20)
#   NCU="128,64,1,512"         also profile that shape (b,h_q,s_q,extra) of the first bench impl
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(pwd)/build/sparse_decode_out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__)"; } > "$OUT/build.log" 2>&1
cat "$OUT/build.log"
if [ ! -f deepseek_v4_kernel/_C.so ] || [ -n "${REBUILD:-}" ]; then
  DSV4_KERNEL_EXTRA_ARCHS=90a bash scripts/build_ext.sh >> "$OUT/build.log" 2>&1; echo "build rc=$?"; tail -3 "$OUT/build.log"
fi
for impl in ${IMPLS:-mma mma64}; do
  echo "=== pytest DSV4_SPARSE_DECODE_IMPL=$impl" | tee -a "$OUT/pytest.log"
  DSV4_SPARSE_DECODE_IMPL=$impl timeout ${TEST_TIMEOUT:-180} python -m pytest -q -rs tests/test_sparse_decode.py \
      tests/test_extension_build.py -p no:cacheprovider 2>&1 | tail -40 | tee -a "$OUT/pytest.log"
  echo "pytest ($impl) rc=${PIPESTATUS[0]}" | tee -a "$OUT/pytest.log"
done
timeout ${BENCH_TIMEOUT:-300} python scripts/bench_sparse_decode.py --out "$OUT" --reps ${REPS:-20} ${QUICK:+--quick} \
    --impls ${BENCH_IMPLS:-mma64,mma} 2>&1 | tee "$OUT/bench.log"
echo "bench rc=${PIPESTATUS[0]}"
if [ -n "${NCU:-}" ]; then
  if command -v ncu >/dev/null 2>&1; then
    first=${BENCH_IMPLS:-mma64,mma}; first=${first%%,*}
    timeout ${NCU_TIMEOUT:-120} ncu --kernel-name regex:sparse_decode --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
        python scripts/bench_sparse_decode.py --out "$OUT/ncu_tmp" --reps 1 --impls "$first" --only "$NCU" \
        > "$OUT/ncu.log" 2>&1
    echo "ncu rc=$?"; grep -E "Duration|Throughput|Registers|Achieved Occupancy|Warp Cycles Per Issued|Stall" "$OUT/ncu.log" | head -40
    rm -rf "$OUT/ncu_tmp"
  else
    echo "ncu not found"
  fi
fi
