#!/bin/bash
# run 61 call 2: why the cut's second call costs more than the same rows alone (call 1: b = 133 / 140, h_q 64, extra
# 512: 26 / 37 us after the first 132 rows, against ~7.5 / ~13 us for b = 1 / 8 alone). Hypothesis: in the bench's
# graph of back-to-back calls the next call's first grid (132 blocks, each a whole SM's registers) gets resident
# through PDL while the second part's combine still has blocks to place, and starves it. Same shapes with
# DSV4_SPARSE_DECODE_PDL=0 (plain launches), and the tails alone, each in the same process as "one" and "cut".
export DSV4_KERNEL_FORCE=1 DSV4_KERNEL_LIB=build/r61/base.so
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
cat > /tmp/tails.py <<'PY'
import sys, torch
sys.path.insert(0, "scripts"); sys.path.insert(0, ".")
import bench_sparse_decode as B
import deepseek_v4_kernel.ops.sparse_decode as sd
inp = B.DecodeInputs(torch.Generator(device="cuda").manual_seed(0))
for b, e in [(1, 512), (8, 512), (33, 512), (132, 512), (1, 2048), (8, 2048), (33, 2048), (132, 2048)]:
    sets = inp.sets(b, 64, 1, e)
    t = min(B.time_fn(lambda x: sd.sparse_decode(**x), sets, 15)[0] for _ in range(2))
    print(f"alone b={b:4d} h_q=64 extra={e:4d} {t:8.2f} us  plan {sd.launch_plan(b, 1, 64, 128 + e, 132)}", flush=True)
    del sets
PY
for PDL in 1 0; do
  echo "== DSV4_SPARSE_DECODE_PDL=$PDL"
  DSV4_SPARSE_DECODE_PDL=$PDL timeout 100 python3 /tmp/tails.py 2>&1 | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once"
  DSV4_SPARSE_DECODE_PDL=$PDL timeout 150 python3 scripts/sweep_sparse_decode_waves.py --quick --rounds 2 \
    --out $OUT/sweep_waves_pdl$PDL.json 2>&1 | grep -v "^\[deepseek_v4_kernel\|UserWarning\|_warn_once"
done 2>&1 | tee $OUT/pdl_tails.log
