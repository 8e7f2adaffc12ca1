#!/bin/bash
# run 58 call 3: call 2 with the head-row bound 2^-8 (||ref|| + 2 row_spread) + 1e-5 (call 2's 2^-8 ||ref|| + 1e-5 failed
# 3 of 400 fuzz seeds, 1.06x at most, rows of a few tokens): the GPU sparse-decode tests, call 2's failing seeds,
# 1000 new fuzz seeds, every _check call's margin recorded (h100_run58_check_margins.py); main.so = 4a04a8f's kernels.
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r58/main.so PYTHONPATH=docs/sparse_decode_runs
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
echo "== tests"; timeout 200 python -m pytest -q -p h100_run58_check_margins $T 2>&1 | tail -n 8
echo "== call 2's failing seeds"; for s in 58186 58211 58397; do DSV4_FUZZ_CASES=1 DSV4_FUZZ_SEED=$s timeout 60 python -m pytest -q -p h100_run58_check_margins $T -k fuzz 2>&1 | tail -n 6; done
echo "== fuzz 1000"; DSV4_FUZZ_CASES=1000 DSV4_FUZZ_SEED=58400 timeout 330 python -m pytest -q -p h100_run58_check_margins $T -k fuzz 2>&1 | tail -n 12
