#!/bin/bash
# run 55 call 5: the README benches on the library of cc14eaa (final.so): the 44-row sparse-decode table and the
# TP-rank table, SGLang 0.5.23's Triton fallback from the wheel's source (carried)
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/r55/final.so
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/bench $OUT/tp
timeout 320 python3 scripts/bench_sparse_decode.py --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
tail -n 50 $OUT/bench.log | cut -c1-200
timeout 220 python3 scripts/bench_sparse_decode_tp_heads.py --out $OUT/tp > $OUT/bench_tp.log 2>&1; echo "tp rc=$?"
tail -n 50 $OUT/bench_tp.log | cut -c1-200
