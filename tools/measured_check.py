"""One worker's start-up decision, in-process, on a GPU (tools/gpu_measured.sh runs it twice: the first start times
and writes the cache, the second reads it).

A stand-in of SGLang's ModelRunner (DeepSeek-V4-Flash's config, TP 1, CUDA-graph batch sizes 1-32, chunked prefill
8192) goes through bench/startup.decide_at_model_load exactly as the load_model wrapper calls it; then every decided
class is put to patch/measured.check, which must keep SGLang's kernel exactly where the measurement chose it.
Writes one JSON line to --out: the decision line's numbers, the wall time of the decision, the per-class checks.
"""

import argparse
import json
import logging
import os
import sys
import time
import types

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--tag", required=True)
args = ap.parse_args()
t_import = time.monotonic()
import torch  # noqa: E402

from deepseek_v4_kernel.bench import startup  # noqa: E402
from deepseek_v4_kernel.errors import KeepOriginal  # noqa: E402
from deepseek_v4_kernel.patch import decisions, measured  # noqa: E402

t_import = time.monotonic() - t_import
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")   # the per-class lines with seconds
torch.cuda.init()
hf = types.SimpleNamespace(num_attention_heads=64, index_topk=512, moe_intermediate_size=2048)
sa = types.SimpleNamespace(cuda_graph_config=types.SimpleNamespace(decode=types.SimpleNamespace(bs=[1, 2, 4, 8, 16, 32])),
                           speculative_algorithm=None, chunked_prefill_size=8192, tp_size=1)
runner = types.SimpleNamespace(server_args=sa, tp_size=1,
                               model_config=types.SimpleNamespace(hf_config=hf, context_len=65536))
t0 = time.monotonic()
a = startup.decide_at_model_load(runner)
wall = time.monotonic() - t0
rec = {"tag": args.tag, "torch_import_s": round(t_import, 2), "decide_wall_s": round(wall, 4)}
if a is None:
    rec["error"] = "no decision (see stderr)"
else:
    wanted = startup.wanted_cases(startup.server_shapes(runner), startup.OPS_AT_START,
                                  torch.cuda.get_device_properties(0).multi_processor_count)
    rec.update(source=a.source, path=a.path, read=a.read_count, measured=a.measured_count, seconds=round(a.seconds, 4),
               notes=a.notes, wanted=sum(len(v) for v in wanted.values()), undecided=a.undecided,
               undecided_count=a.undecided_count, line=a.line())
    checks, bad = [], []
    originals = {"indexer_logits": "tilelang", "hc_prenorm": "deep_gemm", "sparse_decode": "flashinfer",
                 "fp8_linear": None}
    for op, classes in a.classes.items():
        for label, v in classes.items():
            try:
                measured.check(op, label, original=measured._kind(v.get("sglang")) or originals.get(op))
                runs = "ours"
            except KeepOriginal:
                runs = "sglang"
            want = "sglang" if v.get("winner") == "sglang" and v.get("handback_runnable") else "ours"
            checks.append({"op": op, "class": label, "runs": runs, "winner": v.get("winner"),
                           "ours_us": v.get("ours_us"), "sglang": v.get("sglang"), "sglang_us": v.get("sglang_us"),
                           "why": v.get("why", "")})
            if runs != want:
                bad.append(f"{op} {label}: runs {runs}, the measurement says {want}")
    rec.update(checks=checks, mismatches=bad)
with open(args.out, "a") as f:
    f.write(json.dumps(rec) + "\n")
print(json.dumps({k: v for k, v in rec.items() if k != "checks"}))
sys.exit(1 if a is None or rec.get("mismatches") else 0)
