#!/bin/bash
# run 55 call 8: the launch rule against every heads-per-block x split point of a TP rank's heads, the 16-head points on
# the deep-gather variant (scripts/sweep_sparse_decode.py --ws --deep; run 53 call 11's shapes), library of f19be8d
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/r55/final2.so
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 480 python3 scripts/sweep_sparse_decode.py --ws --deep --bs 4,8,16,32,64 --hs 8,16,32 --sqs 1 \
  --extras 512,2048 --out $OUT/sweep > $OUT/sweep.log 2>&1; echo "sweep rc=$?"
cut -c1-150 $OUT/sweep.log | tail -n 32
