#!/bin/bash
# run 59 call 7: the head-row bound with the copies of a slot counted as one weight (reference row_spread over distinct
# slots): test_sparse_decode.py (with the new GPU test of rows of repeated, nearly cancelling slots, every kernel),
# then call 5's 1000 fuzz seeds (59500..60499) again with every _check call's margin recorded; the library of
# 6774cc8's csrc/ (the head's)
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r59/frags.so PYTHONPATH=docs/sparse_decode_runs
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
echo "== tests"; timeout 150 python -m pytest -q -p h100_run58_check_margins $T 2>&1 | tail -n 8
echo "== fuzz 1000"; DSV4_FUZZ_CASES=1000 DSV4_FUZZ_SEED=59500 timeout 360 python -m pytest -q -p h100_run58_check_margins \
  $T -k fuzz 2>&1 | tail -n 8
echo "== the new GPU test with the reference before this change (each copy of a slot counted as independent)"
# last step: this machine's copy of the tree gets 6ea489f's reference (carried as build/r59/old_ref_sparse_decode.py)
cp build/r59/old_ref_sparse_decode.py deepseek_v4_kernel/reference/sparse_decode.py
timeout 120 python -m pytest -q -p h100_run58_check_margins $T -k "gpu_repeated_slots" 2>&1 \
  | grep -E "x the bound|passed|failed|per head row" | cut -c1-200 | head -n 14
