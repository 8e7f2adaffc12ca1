#!/bin/bash
# run 61 call 4: the cut measured as a decode step calls the op, between other kernels (--separator: a one-element
# torch kernel after every call, its own time subtracted), with each cut's parts also timed as calls of their own
# (--parts); the library of call 3 (build/r61/plain.so: the cut's first grid a plain launch), and for comparison
# DSV4_SPARSE_DECODE_PDL=0 (every grid a plain launch), quick shape set.
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r61/plain.so
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 330 python3 scripts/sweep_sparse_decode_waves.py --separator --parts --rounds 2 --out $OUT/sweep_waves_sep.json \
  2>&1 | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once" | tee $OUT/sweep_waves_sep.log
echo "sweep rc=${PIPESTATUS[0]}"
echo "== DSV4_SPARSE_DECODE_PDL=0"
DSV4_SPARSE_DECODE_PDL=0 timeout 200 python3 scripts/sweep_sparse_decode_waves.py --quick --separator --parts --rounds 2 \
  --out $OUT/sweep_waves_sep_pdl0.json 2>&1 | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once" \
  | tee $OUT/sweep_waves_sep_pdl0.log
