#!/usr/bin/env bash
# One device iteration for sparse_decode: build the extension (sm_120a + sm_90a) unless a carried _C.so
# is there and REBUILD is unset, GPU tests per kernel, bench (first of BENCH_IMPLS = "ours"), optional
# Nsight Compute profile of one shape, the per-call floor of bare kernels (tools/latency_floor.py). Up to 9
# files land in $OUT (build, build_ref, pytest, bench log / JSON / PNG, floor, ab, ncu); the device tool returns 8,
# so REF_CSRC and NCU do not go together in one call.
# Usage on the device machine (repo root): OUT=/some/dir bash tools/device_sparse_decode.sh
#   IMPLS="mma mma64"          kernels to run the GPU tests with (DSV4_SPARSE_DECODE_IMPL); TEST_FILES: which files
#   BENCH_IMPLS=mma64,mma      kernels to time; QUICK=1: b in {1, 128} only; REPS (default 20)
#   NCU="128,64,1,512"         also profile that shape (b,h_q,s_q,extra) of the first bench impl
#   REF_CSRC=build/ref/csrc    A/B: another csrc/ tree (made here with `git archive <commit> csrc | tar -x -C
#                              build/ref`, carried) built into build/ref.so (unless carried and REBUILD is
#                              unset); after the main bench, AB_ROUNDS
#                              (default 2) alternating quick benches of this tree's library and the ref one
#                              (AB_IMPLS, default mma64; no competitors), per-shape table in $OUT/ab.log
#   AB_VARIANTS="new ref x:VAR=1"  A/B variants (default "new ref" with REF_CSRC); NAME:VAR=VALUE runs this
#                              tree's library with that environment; AB_BS="1,8,32" b values (default --quick)
#   SKIP_BENCH=1               no main bench (e.g. an A/B-only call)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(pwd)/build/sparse_decode_out}
mkdir -p "$OUT"
{ nvidia-smi -L; python -c "import torch, triton, sys; print(sys.version); print(torch.__version__, triton.__version__)"; } > "$OUT/build.log" 2>&1
cat "$OUT/build.log"
if [ -n "${REF_CSRC:-}" ] && { [ ! -f build/ref.so ] || [ -n "${REBUILD:-}" ]; }; then
  DSV4_CSRC=$(cd "$REF_CSRC" && pwd) DSV4_KERNEL_EXTRA_ARCHS=90a NVCC_THREADS=8 bash scripts/build_ext.sh build/ref.so \
      > "$OUT/build_ref.log" 2>&1 &
fi
if [ ! -f deepseek_v4_kernel/_C.so ] || [ -n "${REBUILD:-}" ]; then
  DSV4_KERNEL_EXTRA_ARCHS=90a NVCC_THREADS=8 bash scripts/build_ext.sh >> "$OUT/build.log" 2>&1; echo "build rc=$?"; tail -3 "$OUT/build.log"
fi
wait
for impl in ${IMPLS:-mma mma64}; do
  echo "=== pytest DSV4_SPARSE_DECODE_IMPL=$impl" | tee -a "$OUT/pytest.log"
  DSV4_SPARSE_DECODE_IMPL=$impl timeout ${TEST_TIMEOUT:-180} python -m pytest -q -rs \
      ${TEST_FILES:-tests/test_sparse_decode.py tests/test_sparse_decode_gpu.py tests/test_sparse_decode_launch.py tests/test_extension_build.py} -p no:cacheprovider 2>&1 | tail -40 | tee -a "$OUT/pytest.log"
  echo "pytest ($impl) rc=${PIPESTATUS[0]}" | tee -a "$OUT/pytest.log"
done
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout ${BENCH_TIMEOUT:-300} python benchmarks/bench_sparse_decode.py --out "$OUT" --reps ${REPS:-20} ${QUICK:+--quick} \
      --impls ${BENCH_IMPLS:-mma64,mma} 2>&1 | tee "$OUT/bench.log"
  echo "bench rc=${PIPESTATUS[0]}"
  # what a split call costs with no compute on this GPU, against 1/100 of the fallback's b = 1 time 
  [ -f "$OUT/bench_sparse_decode.json" ] && timeout 120 python tools/latency_floor.py \
      --from-bench "$OUT/bench_sparse_decode.json" 2>&1 | tee "$OUT/floor.log"
fi
# A/B variants: "new" (this tree's library), "ref" (REF_CSRC's), any NAME with a (carried) build/NAME.so, and
# "NAME:VAR=VALUE" (that library, or this tree's, with an environment switch), e.g.
# AB_VARIANTS="new ref nopdl:DSV4_SPARSE_DECODE_PDL=0"
if [ -n "${REF_CSRC:-}${AB_VARIANTS:-}" ]; then
  variants=${AB_VARIANTS:-new ref}
  for r in $(seq 1 ${AB_ROUNDS:-2}); do
    for var in $variants; do
      name=${var%%:*}; envset=""; [ "$name" != "$var" ] && envset=${var#*:}
      lib=$(pwd)/deepseek_v4_kernel/_C.so; [ -f "build/$name.so" ] && lib=$(pwd)/build/$name.so
      env DSV4_KERNEL_LIB=$lib $envset timeout ${BENCH_TIMEOUT:-300} python benchmarks/bench_sparse_decode.py \
          --out "build/ab_${name}_$r" --reps ${REPS:-20} ${AB_BS:+--bs $AB_BS} --quick --max-b-competitors 0 \
          --impls ${AB_IMPLS:-mma64} > "build/ab_${name}_$r.log" 2>&1
      echo "ab $name round $r rc=$?"
    done
  done
  python - "${AB_ROUNDS:-2}" $variants <<'PY' 2>&1 | tee "$OUT/ab.log"
import json, sys
rounds, names = int(sys.argv[1]), [v.split(":")[0] for v in sys.argv[2:]]
def load(v, r):
    return {(x["b"], x["h_q"], x["s_q"], x["extra"]): (x["ours_us"], x["splits"])
            for x in json.load(open(f"build/ab_{v}_{r}/bench_sparse_decode.json"))["rows"]}
data = {n: [load(n, r) for r in range(1, rounds + 1)] for n in names}
base = names[0]
print(f"{'b':>5} {'h':>4} {'sq':>3} {'extra':>6} {'split':>5} | " + " | ".join(f"{n + ' us (rounds)':>22}" for n in names)
      + " | " + " ".join(f"{n + '/' + base:>10}" for n in names[1:]))
for k in data[base][0]:
    mins = {n: min(d[k][0] for d in data[n]) for n in names}
    print(f"{k[0]:>5} {k[1]:>4} {k[2]:>3} {k[3]:>6} {data[base][0][k][1]:>5} | "
          + " | ".join(f"{' '.join(f'{d[k][0]:7.1f}' for d in data[n]):>22}" for n in names)
          + " | " + " ".join(f"{mins[n] / mins[base]:>10.3f}" for n in names[1:]))
PY
  head -3 build/ab_new_1.log >> "$OUT/ab.log" 2>/dev/null
fi
if [ -n "${NCU:-}" ]; then
  if command -v ncu >/dev/null 2>&1; then
    first=${BENCH_IMPLS:-mma64,mma}; first=${first%%,*}
    timeout ${NCU_TIMEOUT:-120} ncu --kernel-name regex:sparse_decode --launch-skip 4 --launch-count 2 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section SchedulerStats \
        python benchmarks/bench_sparse_decode.py --out "$OUT/ncu_tmp" --reps 1 --impls "$first" --only "$NCU" \
        > "$OUT/ncu.log" 2>&1
    echo "ncu rc=$?"; grep -E "Duration|Throughput|Registers|Achieved Occupancy|Warp Cycles Per Issued|Stall" "$OUT/ncu.log" | head -40
    rm -rf "$OUT/ncu_tmp"
  else
    echo "ncu not found"
  fi
fi
