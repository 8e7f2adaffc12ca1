#!/bin/bash
# run 61 call 5: where the cut's ~10-20 us over its parts' own times goes when the second part is a many-split call
# (b = 1 / 8 rows left: call 4). Quick set, --separator --parts, the library of call 3 (first grid of the cut a plain
# launch): (a) as shipped, (b) the second part launched first (--tail-first, a switch of this call's tree only, the
# op's WAVE_CUT_TAIL_FIRST; the order it tested is the shipped one since call 6), (c) (b) with
# DSV4_SPARSE_DECODE_PDL=0.
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r61/plain.so
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
run() {
  echo "== $*"
  timeout 150 python3 scripts/sweep_sparse_decode_waves.py --quick --separator --rounds 2 "$@" 2>&1 \
    | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once"
}
{
run --out $OUT/a.json
run --tail-first --out $OUT/b.json
DSV4_SPARSE_DECODE_PDL=0 run --tail-first --out $OUT/c.json
} | tee $OUT/order.log
