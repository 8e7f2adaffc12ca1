#!/bin/bash
# run 62 call 6: the first piece of the trimmed triton 3.8.0 kept for call 7 (as call 1); meanwhile the Triton-op
# benches under the device's triton 3.6.0 with DISABLE_MMA_V3=1 (mma.sync, SM120's instruction class), the baseline
# of call 8's run of the same benches under 3.8.0 on this machine.
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/run62.so DISABLE_MMA_V3=1
mkdir -p /tmp/t38parts && cp .whl/t38.0 /tmp/t38parts/
python3 -c "import triton; print('triton', triton.__version__)"
for op in indexer_logits hc_prenorm fp4_moe; do
  mkdir -p /tmp/b36/$op
  ( time timeout 175 python3 scripts/bench_$op.py --out /tmp/b36/$op ) > $OUT/bench36_$op.log 2>&1
  echo "$op rc=$?"; grep -v "^\[deepseek" $OUT/bench36_$op.log | tail -n 22 | cut -c1-180
done
