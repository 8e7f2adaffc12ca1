#!/bin/bash
# run 59 call 6: call 5's two largest head-row margins (seeds 59768, 59568) with the head's library before the
# lane-address helpers (base.so, 294375b's csrc/) and after (frags.so, 6774cc8's): the same margins = the same outputs
export DSV4_KERNEL_FORCE=1 PYTHONPATH=docs/sparse_decode_runs
nvidia-smi --query-gpu=name --format=csv,noheader
for L in base frags; do for s in 59768 59568; do
  echo "== $L seed $s"; DSV4_KERNEL_LIB=build/r59/$L.so DSV4_FUZZ_CASES=1 DSV4_FUZZ_SEED=$s timeout 60 python -m pytest -q \
    -p h100_run58_check_margins tests/test_sparse_decode.py -k fuzz 2>&1 | grep -E "per element|per head row|passed|failed"
done; done
