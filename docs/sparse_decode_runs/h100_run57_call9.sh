#!/bin/bash
# run 57 call 9: the README benches on the library built on the device in call 8 (final.so, tree a6aa920): the 44-row sparse-decode table and the
# TP-rank table, SGLang 0.5.23's Triton fallback from the wheel's source (carried)
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=$PWD/build/r57/final.so
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p $OUT/bench $OUT/tp
timeout 320 python3 scripts/bench_sparse_decode.py --out $OUT/bench > $OUT/bench.log 2>&1; echo "bench rc=$?"
tail -n 50 $OUT/bench.log | cut -c1-200
timeout 220 python3 scripts/bench_sparse_decode_tp_heads.py --out $OUT/tp > $OUT/bench_tp.log 2>&1; echo "tp rc=$?"
tail -n 50 $OUT/bench_tp.log | cut -c1-200
