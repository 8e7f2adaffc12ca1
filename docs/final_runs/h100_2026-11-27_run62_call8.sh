#!/bin/bash
# run 62 call 8: call 6's Triton-op benches (DISABLE_MMA_V3=1) under triton 3.8.0 (kept from call 7), same machine.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/run62.so DISABLE_MMA_V3=1
export PYTHONPATH=/tmp/t38 TRITON_CACHE_DIR=/tmp/tcache38
python3 -c "import triton; print('triton', triton.__version__, triton.__file__)" || exit 3
for op in indexer_logits hc_prenorm fp4_moe; do
  mkdir -p /tmp/b38/$op
  ( time timeout 175 python3 scripts/bench_$op.py --out /tmp/b38/$op ) > $OUT/bench38_$op.log 2>&1
  echo "$op rc=$?"; grep -v "^\[deepseek" $OUT/bench38_$op.log | tail -n 22 | cut -c1-180
done
