#!/bin/bash
# run 62 call 14: the first piece of the trimmed triton 3.8.0 kept for call 15 (as call 1); A/B of the MoE's "dequant"
# kernel under the device's triton 3.6.0, mma.sync builds (DISABLE_MMA_V3=1): build/ab_old = the committed op (07663bc,
# carried) against the working tree's (docs/fp4_moe_runs/run62/dequant_split_asm_separate_loads.diff on 07663bc, not
# kept: the dequantisation as two one-output inline-asm calls, the activations loaded
# once per GEMM of gemm1), two rounds alternating; then test_fp4_moe.py on the working tree.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DISABLE_MMA_V3=1 TRITON_CACHE_DIR=/tmp/tcache36
mkdir -p /tmp/t38parts && cp .whl/t38.0 /tmp/t38parts/
T=64,128,192,256,512
for r in 1 2; do for side in old new; do
  S=scripts/bench_fp4_moe.py; [ $side = old ] && S=build/ab_old/scripts/bench_fp4_moe.py
  mkdir -p /tmp/ab36_$side$r
  timeout 100 python3 $S --out /tmp/ab36_$side$r --tokens $T --impls dequant,dot_scaled --no-baselines > $OUT/ab36_${side}_r$r.log 2>&1
  echo "== 3.6 $side round $r rc=$?"; grep "^| [0-9]" $OUT/ab36_${side}_r$r.log | cut -d'|' -f2,5,6
done; done
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_fp4_moe.py -k "not sm120_aot and not cuda_decode" > $OUT/pytest_fp4_36.log 2>&1
echo "pytest rc=$?"; tail -n 1 $OUT/pytest_fp4_36.log
