#!/bin/bash
# run 62 call 4: the first piece of the trimmed triton 3.8.0 kept for call 5 (as call 1), and
# scripts/stress_hc_prenorm.py under the device's triton 3.6.0, native (wgmma) and DISABLE_MMA_V3=1 (mma.sync), as
# the baseline for call 5's run under 3.8.0 (call 3's test_hc_prenorm.py failure: a graph replay's bits differed
# from the eager call's once, triton 3.8.0, m = 512 presplit config, not reproduced alone).
export PYTHONUNBUFFERED=1 DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/run62.so
mkdir -p /tmp/t38parts && cp .whl/t38.0 /tmp/t38parts/
python3 scripts/stress_hc_prenorm.py --budget 110 --rounds 100000 --seed 1 > $OUT/stress36_native.log 2>&1
echo "native rc=$?"; tail -n 24 $OUT/stress36_native.log | cut -c1-230
DISABLE_MMA_V3=1 python3 scripts/stress_hc_prenorm.py --budget 110 --rounds 100000 --seed 2 > $OUT/stress36_mma.log 2>&1
echo "mma rc=$?"; tail -n 24 $OUT/stress36_mma.log | cut -c1-230
