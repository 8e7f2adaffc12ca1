#!/usr/bin/env bash
# What the sparse decode waits on, on the GPU at hand: the measurements docs/sparse_decode.md (section 8,
# items 1 and 3) asks for first on an SM120 card, in one run. Timings and diagnostics only (no test, no assert):
#   1. libraries built here from csrc/ (this GPU's arch + sm_120a): untraced, traced (per-tile clock64 counters),
#      timeline-only, and the four ablations of tools/trace_sparse_decode.py (no row copies / no dequantisation /
#      no P V loop / no S loop after the prologue: timing-only builds WHOSE OUTPUTS ARE WRONG; they stay in $OUT/libs
#      and are never installed);
#   2. trace_sparse_decode.py run with each (default shapes; the ablations at b = 128 and 32);
#   3. the launch sweep on the kernels "auto" launches (sweep_sparse_decode.py --auto-kernels) and
#      fit_launch_model.py on it: whether other weights than the shipped M64_COST pick faster launches here; and the
#      sweep of batches just beyond whole waves of blocks (sweep_sparse_decode_waves.py): whether the op's cut of such
#      batches (batch_parts, WAVE_CUT_GAIN) gains here where the model says it does.
# Usage (repo root, a GPU, nvcc): OUT=/some/dir bash tools/device_sparse_decode_diag.sh
#   SKIP_SWEEP=1: steps 1-2 only (the sweep takes ~2 min on an H100); ABL_SHAPES="b,h_q,extra;...": step 2's shapes for
#   the ablations. Everything lands in $OUT (logs, sweep JSON, fit JSON); summary.log last.
set -u
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/build/sparse_decode_diag}
mkdir -p "$OUT/libs"
log() { echo "== $*" | tee -a "$OUT/summary.log"; }
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
[ -n "$cc" ] || { log "no GPU found (nvidia-smi)"; exit 1; }
nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | tee "$OUT/gpu.txt"
# this GPU's arch-specific target beside sm_120a: sm_90a on an H100 / H200, nothing more on an SM120 card; the library
# serves no other GPU
case "$cc" in
  120) extra="" ;;
  90) extra="90a" ;;
  *) log "compute capability $cc: the library is built for sm_120a (and sm_90a as a proxy) only"; exit 1 ;;
esac
export DSV4_KERNEL_EXTRA_ARCHS=$extra NVCC_THREADS=${NVCC_THREADS:-2}

log "building 7 libraries (sm_120a${extra:+ + sm_$extra})"
DSV4_CSRC=$ROOT/csrc bash scripts/build_ext.sh "$OUT/libs/base.so" > "$OUT/build_base.log" 2>&1 &
b1=$!
# the traced builds beside it, each from its own instrumented copy of csrc/ (JOBS at a time, default 3)
pids=()
for v in "trace:" "nocyc:--no-cycles" "noissue:--no-cycles --ablate noissue" "nodeq:--no-cycles --ablate nodeq" \
         "nopv:--no-cycles --ablate nopv" "nos:--no-cycles --ablate nos"; do
  n=${v%%:*}
  # shellcheck disable=SC2086
  python3 tools/trace_sparse_decode.py build "$OUT/libs/$n.so" ${v#*:} --src "$ROOT/build/trace_src_$n" > "$OUT/build_$n.log" 2>&1 &
  pids+=("$!:$n")
  while [ "$(jobs -rp | wc -l)" -gt "${JOBS:-3}" ]; do sleep 1; done
done
wait $b1 || log "untraced build failed (build_base.log)"
for pn in "${pids[@]}"; do wait "${pn%%:*}" || log "traced build ${pn#*:} failed (build_${pn#*:}.log)"; done
ls "$OUT/libs" | tee -a "$OUT/summary.log"

trace() {   # trace TAG [VAR=VALUE ...]
  local tag=$1; shift
  [ -f "$OUT/libs/$tag.so" ] || { log "no library $tag"; return; }
  env DSV4_KERNEL_LIB="$OUT/libs/$tag.so" TAG=$tag "$@" timeout 300 python3 tools/trace_sparse_decode.py H100>&1 \
    | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once" >> "$OUT/trace.log"
  log "trace $tag rc=${PIPESTATUS[0]}"
}
trace base
trace trace
trace nocyc
S=${ABL_SHAPES:-"128,64,512;128,16,512;128,32,512;32,64,512"}
trace base SHAPES="$S"
for a in noissue nodeq nopv nos; do trace $a SHAPES="$S"; done

if [ -z "${SKIP_SWEEP:-}" ] && [ -f "$OUT/libs/base.so" ]; then
  mkdir -p "$OUT/sweep"
  DSV4_KERNEL_LIB="$OUT/libs/base.so" timeout 900 python3 tools/sweep_sparse_decode.py --auto-kernels --out "$OUT/sweep" \
    > "$OUT/sweep.log" 2>&1
  log "sweep rc=$?"
  python3 tools/fit_launch_model.py "$OUT/sweep/sweep_sparse_decode.json" --json "$OUT/fit.json" > "$OUT/fit.log" 2>&1
  log "fit rc=$?"
  tail -n 25 "$OUT/fit.log"
  DSV4_KERNEL_LIB="$OUT/libs/base.so" timeout 600 python3 tools/sweep_sparse_decode_waves.py --separator --parts \
    --out "$OUT/sweep_waves.json" > "$OUT/sweep_waves.log" 2>&1
  log "waves sweep rc=$?"
  grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once" "$OUT/sweep_waves.log" | tail -n 40
fi
cat "$OUT/trace.log"
cat "$OUT/summary.log"
