#!/bin/bash
# run 61 call 1: batches beyond one wave of blocks cut into two calls (ops/sparse_decode.batch_parts; csrc/ unchanged,
# the library built on the dev machine from it, carried as build/r61/base.so): test_sparse_decode.py (the new cut
# test included), then the cut sweep (scripts/sweep_sparse_decode_waves.py, 2 rounds) -> $OUT.
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r61/base.so
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_decode.py 2>&1 | tail -n 15 | tee $OUT/pytest.log
timeout 330 python3 scripts/sweep_sparse_decode_waves.py --rounds 2 --out $OUT/sweep_waves.json 2>&1 \
  | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once" | tee $OUT/sweep_waves.log
echo "sweep rc=${PIPESTATUS[0]}"
