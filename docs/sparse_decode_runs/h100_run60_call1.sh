#!/bin/bash
# run 60 call 1: scripts/trace_sparse_decode.py as rewritten in run 60 (the warp-specialised kernels instrumented, the
# trace buffer poisoned before each traced call, ablation builds), on the head's kernels (csrc/ of 6774cc8):
#  - base.so: the untraced library (graph times to set the traced ones against; the tool prints no trace there);
#  - trace.so: every point with per-tile clock64 counters, the six default shapes; then IMPL=mma64 (the 8-warp kernel's
#    report) and IMPL=mma (a kernel without trace points: the tool must say so);
#  - nocyc.so: the block timeline only (less perturbation);
#  - noissue / nodeq / nopv / nos .so: run 54's ablations (timeline only; outputs wrong) on today's kernels, b = 128
#    h_q 64 / 16 / 32 extra 512 and b = 32 h_q 64.
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
R=scripts/trace_sparse_decode.py
run() { L=$1; shift; env DSV4_KERNEL_LIB=build/r60/$L.so TAG=$L "$@" timeout 150 python3 $R run 2>&1 | grep -v "^\[deepseek_v4_kernel"; echo "rc=${PIPESTATUS[0]}"; }
echo "== base (untraced)"; run base
echo "== trace (cycles)"; run trace
echo "== trace, IMPL=mma64"; run trace IMPL=mma64 SHAPES="128,64,512;1,64,512;32,64,512"
echo "== trace, IMPL=mma (not instrumented)"; run trace IMPL=mma SHAPES="8,64,512"
echo "== nocyc (timeline only)"; run nocyc
S="128,64,512;128,16,512;128,32,512;32,64,512"
echo "== base, ablation shapes"; run base SHAPES="$S"
for a in noissue nodeq nopv nos; do echo "== ablation $a"; run $a SHAPES="$S"; done
