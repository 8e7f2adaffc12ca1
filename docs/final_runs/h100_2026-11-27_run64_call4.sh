#!/bin/bash
# run 64 call 4 (head e539267: bench_latency_floor.py takes the cache layout and MAIN_TOKENS from the project): the
# script's test on the GPU and the script itself (its kernels compiled for sm_90; H100 defaults for ours / fallback).
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_sparse_decode.py -k latency_floor > $OUT/pytest_floor.log 2>&1
echo "pytest rc=$?"; tail -n 1 $OUT/pytest_floor.log
timeout 120 python3 scripts/bench_latency_floor.py > $OUT/floor.log 2>&1; echo "floor rc=$?"; tail -n 9 $OUT/floor.log
