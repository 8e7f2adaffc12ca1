#!/bin/bash
# run 59 call 3: the launch sweep with every point on the kernel "auto" runs for it (sweep_sparse_decode.py
# --auto-kernels, new; run 47's 80 shapes: b 1-16, h_q 16-128, s_q 1-2, extra 512 / 2048), the data
# scripts/fit_launch_model.py fits the launch rule's weights to; library built here from the tree's csrc/ (6774cc8's)
export DSV4_KERNEL_FORCE=1
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/sweep
DSV4_KERNEL_LIB=build/r59/frags.so timeout 560 python3 scripts/sweep_sparse_decode.py --auto-kernels --out $OUT/sweep \
  > $OUT/sweep.log 2>&1; echo "sweep rc=$?"
grep -c "^b=" $OUT/sweep.log; tail -n 3 $OUT/sweep.log | cut -c1-200
python3 scripts/fit_launch_model.py $OUT/sweep/sweep_sparse_decode.json \
  docs/sparse_decode_runs/h100_run47_launch_sweep_cold.json 2>&1 | grep -v "^\[deepseek"
