#!/bin/bash
# run 57 call 6: Nsight Compute warp-state / scheduler / shared-memory tables of the 64-head warp-specialised kernel
# (mma64ws) and of kernel_f8.cuh (w0: as tested; w4: every conversion ablated) at b = 128, h_q 64, extra 512
export DSV4_KERNEL_FORCE=1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
echo "ncu: $NCU"
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis_Tables --section LaunchStats --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,smsp__inst_executed.sum"
for x in ${SETS:-w0:mma64ws w0:mma64f8 w4:mma64f8}; do set -- ${x/:/ }
  echo "=================== $1 $2"
  DSV4_KERNEL_LIB=build/r57/$1.so timeout 150 $NCU $S -k regex:"sparse_decode_(ws|f8)" --launch-skip 2 --launch-count 1 \
    python docs/sparse_decode_runs/h100_run57_ncu_driver.py $2 2>&1 | grep -v '^\[deepseek\|^==PROF==\|^ *$'
done > $OUT/ncu.log 2>&1
grep -i 'stall\|l1tex\|inst_executed\|Issued Warp\|No Eligible\|Eligible Warps\|Active Warps\|bank\|Duration\|====\|Warp Cycles Per Issued\|ncu:' $OUT/ncu.log | awk '$NF+0 > 0.005 || !/stalled/' | head -n 150
