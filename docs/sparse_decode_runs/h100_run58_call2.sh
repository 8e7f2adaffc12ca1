#!/bin/bash
# run 58 call 2: the GPU sparse-decode tests with the tighter _check (per element 2^-7 (out_abs + |ref|) + 1e-5, per
# head row 2^-8 ||ref|| + 1e-5) on main's library (main.so = 4a04a8f's kernels), every _check call's margin recorded
# (h100_run58_check_margins.py); then 400 fuzz cases (seed 58000).
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r58/main.so PYTHONPATH=docs/sparse_decode_runs
nvidia-smi --query-gpu=name --format=csv,noheader
T=tests/test_sparse_decode.py
echo "== tests"; timeout 240 python -m pytest -q -p h100_run58_check_margins $T 2>&1 | tail -n 12
echo "== fuzz 400"; DSV4_FUZZ_CASES=400 DSV4_FUZZ_SEED=58000 timeout 300 python -m pytest -q -p h100_run58_check_margins $T -k fuzz 2>&1 | tail -n 12
