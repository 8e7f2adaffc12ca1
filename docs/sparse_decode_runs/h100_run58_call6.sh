#!/bin/bash
# run 58 call 6, on the tree of the head (3b51db5 + this script): the README sparse-decode bench (44 rows, SGLang
# 0.5.23's Triton fallback carried) with build/r58/main.so, built here from the head's csrc/ (unchanged since 4a04a8f)
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/bench
DSV4_KERNEL_LIB=build/r58/main.so timeout 330 python3 scripts/bench_sparse_decode.py --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
cat $OUT/bench.log
