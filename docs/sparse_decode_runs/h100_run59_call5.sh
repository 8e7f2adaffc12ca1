#!/bin/bash
# run 59 call 5: 1000 new fuzz seeds (59500..60499) of test_sparse_decode.py with the library of 6774cc8's csrc/ (the
# head's; the warp-specialised kernels' instructions reordered by the lane-address helpers), every _check call's margin
# recorded (h100_run58_check_margins.py)
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r59/frags.so PYTHONPATH=docs/sparse_decode_runs
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== fuzz 1000"; DSV4_FUZZ_CASES=1000 DSV4_FUZZ_SEED=59500 timeout 400 python -m pytest -q -p h100_run58_check_margins \
  tests/test_sparse_decode.py -k fuzz 2>&1 | tail -n 12
