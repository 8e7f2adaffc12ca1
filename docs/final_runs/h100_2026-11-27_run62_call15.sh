#!/bin/bash
# run 62 call 15: triton 3.8.0 assembled (as call 2); A/B of the MoE's "dequant"
# kernel under triton 3.8.0, mma.sync builds (DISABLE_MMA_V3=1): build/ab_old = the committed op (07663bc,
# carried) against the working tree's (docs/fp4_moe_runs/run62/dequant_split_asm_separate_loads.diff on 07663bc, not
# kept: the dequantisation as two one-output inline-asm calls, the activations loaded
# once per GEMM of gemm1), two rounds alternating; then test_fp4_moe.py on the working tree.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DISABLE_MMA_V3=1 TRITON_CACHE_DIR=/tmp/tcache38
cp .whl/t38.1 /tmp/t38parts/ 2>/dev/null
cat /tmp/t38parts/t38.0 /tmp/t38parts/t38.1 > /tmp/t38.tar.xz
echo "$(cut -d' ' -f1 .whl/t38.sha256)  /tmp/t38.tar.xz" | sha256sum -c - || exit 3
rm -rf /tmp/t38 && mkdir -p /tmp/t38 && tar -C /tmp/t38 -xJf /tmp/t38.tar.xz || exit 4
sed -i "/amd/d" /tmp/t38/triton-3.8.0.dist-info/entry_points.txt   # the trimmed tree has no AMD backend
export PYTHONPATH=/tmp/t38
python3 -c "import triton; print('triton', triton.__version__)"
T=64,128,192,256,512
for r in 1 2; do for side in old new; do
  S=scripts/bench_fp4_moe.py; [ $side = old ] && S=build/ab_old/scripts/bench_fp4_moe.py
  mkdir -p /tmp/ab38_$side$r
  timeout 100 python3 $S --out /tmp/ab38_$side$r --tokens $T --impls dequant,dot_scaled --no-baselines > $OUT/ab38_${side}_r$r.log 2>&1
  echo "== 3.8 $side round $r rc=$?"; grep "^| [0-9]" $OUT/ab38_${side}_r$r.log | cut -d'|' -f2,5,6
done; done
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_fp4_moe.py -k "not sm120_aot and not cuda_decode" > $OUT/pytest_fp4_38.log 2>&1
echo "pytest rc=$?"; tail -n 1 $OUT/pytest_fp4_38.log
