#!/usr/bin/env bash
# One device iteration for indexer_logits: GPU tests + bench (+ config sweep). Logs/JSON into $OUT.
set -u
OUT=${OUT:-/tmp/indexer_logits_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python - <<'PY' >> "$OUT/gpu.txt" 2>&1
import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())
PY
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 150 python -m pytest -q -x tests/test_indexer_logits.py -rs > "$OUT/tests.log" 2>&1
  echo "tests rc=$?" | tee -a "$OUT/tests.log"
  tail -5 "$OUT/tests.log"
fi
timeout 200 python benchmarks/bench_indexer_logits.py --out "$OUT" ${BENCH_ARGS:---sweep} > "$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/bench.log"
cat "$OUT/bench.log" | grep -v "^sweep fail" | tail -40
