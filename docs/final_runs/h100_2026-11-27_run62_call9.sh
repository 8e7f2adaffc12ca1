#!/bin/bash
# run 62 call 9 (inline command, recorded here): the MXFP4 MoE's Triton impls over 64-4096 tokens (E = 256, top-6,
# hidden 4096, I 2048), mma.sync builds (DISABLE_MMA_V3=1), triton 3.6.0 and 3.8.0 alternating, twice each, same
# machine as calls 6-8. Logs: h100_2026-11-27_run62_call9_fp4_moe_sweep_triton<version>_mma_round<k>.log.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/run62.so DISABLE_MMA_V3=1
T=64,96,128,192,256,384,512,768,1024,2048,4096
for v in 36 38 36 38; do
  if [ $v = 38 ]; then export PYTHONPATH=/tmp/t38 TRITON_CACHE_DIR=/tmp/tcache38; else unset PYTHONPATH; export TRITON_CACHE_DIR=/tmp/tcache36; fi
  mkdir -p /tmp/s$v
  timeout 140 python3 scripts/bench_fp4_moe.py --out /tmp/s$v --tokens $T --impls dequant,dot_scaled,mxfp8 --no-baselines \
    > $OUT/sweep${v}_fp4_moe_$RANDOM.log 2>&1
  echo "== triton $v rc=$?"; grep "^|" $(ls -t $OUT/sweep${v}_fp4_moe_*.log | head -1) | cut -c1-150
done
