#!/bin/bash
# run 59 call 8: call 5's 1000 fuzz seeds (59500..60499) with the head-row bound over distinct slots (call 7's fuzz ran
# past its timeout: the reference's slot grouping by torch.unique(dim=0), now a 1-D key), every _check call's margin
# recorded; the library of 6774cc8's csrc/ (the head's)
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r59/frags.so PYTHONPATH=docs/sparse_decode_runs
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== fuzz 1000"; DSV4_FUZZ_CASES=1000 DSV4_FUZZ_SEED=59500 timeout 450 python -m pytest -q -p h100_run58_check_margins \
  tests/test_sparse_decode.py -k fuzz 2>&1 | tail -n 8
