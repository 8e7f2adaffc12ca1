"""Which op of the decode step a GPU kernel belongs to, and what a torch.profiler trace says per step (pure: json,
gzip and re only; no GPU, no SGLang).

Classification is by kernel name, first matching rule wins (RULES, in order). A decode step under CUDA graphs replays
kernels that no CPU op launched in the trace, so the name is all there is; the rules are written from the names the
kernels carry in SGLang 0.5.17's sources and its bundled libraries (tests/e2e/test_kernel_ops.py holds a table of
real names per setup and where each comes from). Where a name cannot tell two owners apart the rule says which one
it is counted under (the "why" of each rule):

* fp32 GEMMs/GEMVs (cuBLAS names carry the types: ``sgemm``, ``_sss_``, ``f32f32_f32f32``, ``gemv*<..., float, float,
  float, float``) are mHC's: the step's only fp32 x fp32 products are the mHC pre-GEMM on SGLang's torch path (setup
  (a): ``hc_pre_torch_impl``, ``F.linear`` in fp32) and the hc head (``hc_head_torch``). bf16 x bf16 -> fp32 GEMMs
  (``linear_bf16_fp32``: the compressors' ``wkv_gate``, the router above 16 rows) have bf16 inputs (``_tss_``) and
  are bf16 linears. cuBLAS's split-K reduce carries no input type: counted as a bf16 linear.
* SwiGLU activation kernels (``act_and_mul``, ``silu_mul_clamp``) serve the routed experts and the shared expert
  alike: counted under MoE. The shared expert's GEMMs are dense FP8 (``fp8_linear``).
* KV-cache writes and the compressors (``flash_c4_decode``, ``fused_store_flashmla_cache``, ...) are their own bucket,
  ``kv_cache``: they serve sparse MLA and the indexer together.
* Generic torch kernels (``at::native::elementwise_kernel``, ``reduce_kernel``, cub sorts) and inductor kernels whose
  fused ops name no owner stay in ``other``; the report lists the largest of them.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

# the buckets of the breakdown, in table order
OPS = ("moe_experts", "fp8_linear", "bf16_linear", "sparse_mla", "indexer", "mhc", "kv_cache", "norm_quant_rope",
       "communication", "other")

OP_TITLES = {
    "moe_experts": "MoE experts incl. routing and SwiGLU",
    "fp8_linear": "dense FP8 linears (attention, shared expert)",
    "bf16_linear": "bf16 linears (wo_a, lm_head, router, compressor gates)",
    "sparse_mla": "sparse MLA",
    "indexer": "indexer (logits, top-k)",
    "mhc": "mHC (pre-GEMM, Sinkhorn, post, head)",
    "kv_cache": "KV cache writes and compressors",
    "norm_quant_rope": "norms / activation quant / rope",
    "communication": "communication",
    "other": "other (generic torch, sampling)",
}

_FP32_GEMM = (r"sgemm|_sss_|f32f32_f32f32|ffma.*gemm|gemm.*ffma|"
              r"gem[mv]\w*(::kernel)?<[^>]*?\bfloat, float, float, float")

# (op, pattern on the lower-cased name, why); first match wins
RULES: Tuple[Tuple[str, str, str], ...] = (
    ("communication", r"nccl|all_?reduce|allgather|all_gather|reduce_scatter|cross_device|custom_ar|one_shot|two_shot|"
                      r"lamport", "collectives (TP > 1)"),
    # before anything that says "quant", "norm" or "rope": the compressors and the cache stores
    ("kv_cache", r"store_flashmla_cache|store_indexer_cache|flash_c4_|flash_c128_|c128_online|plan_compress|"
                 r"plan_c128|_c4_decode|_c128_decode|_c4_prefill|_c128_prefill|compress_norm_rope|fused_ape_pool|"
                 r"quant_k_cache|set_k_and_s|store_kvcache|set_mla_kv|_swa_scatter|k_norm_rope_flashmla|"
                 r"fill_compress_tail", "SGLang's DeepSeek-V4 compressors and cache writes (kernels/jit/csrc/"
                                        "deepseek_v4, kernels/ops/attention/dsv4)"),
    ("mhc", r"hc_prenorm|mhc_|_mhc|sinkhorn|hc_head|hc_pre|hc_post|hc_split|^_fn_split_kernel$|tf32_hc|" + _FP32_GEMM,
     "SGLang's TileLang / Triton mHC kernels, DeepGEMM's tf32_hc_prenorm_gemm, ours (ops/hc_prenorm), and fp32 GEMMs "
     "(the torch mHC pre-GEMM and the hc head)"),
    ("indexer", r"mqa_logits|paged_mqa|fp8_index|indexer|^_paged_kernel$|^_flat_kernel$|topk_transform|clean_logits",
     "TileLang / DeepGEMM / torch paged MQA logits, ours (ops/indexer_logits: _paged_kernel, _flat_kernel), the "
     "top-512 selection (topk_transform_kernel)"),
    ("sparse_mla", r"sparse_decode|flash_?mla|sparse_mla|sparse_attn|splitkv_mla|mla_combine|_tiled_sparse_decode|"
                   r"_paged_decode_(fused|split|reduce)|dsv4_attn|flash_fwd|_sm120_flashmla|^_page_split_kernel$|"
                   r"^_page_mark_kernel$|merge_attn_states",
     "ours (dsv4::sparse_decode_*), FlashMLA (sm90::decode::sparse_fp8, smxx::decode combine), SGLang's Triton SM120 "
     "fallback (_tiled_sparse_decode_kernel)"),
    ("moe_experts", r"marlin|fp4_moe|fp4moe|moe|expert|topk_?gating|^_gemm[12]_kernel$|^_route_\w*kernel$|"
                    r"^_swiglu_kernel$|^_count_kernel$|^_layout_kernel$|^_reduce_kernel$|act_and_mul|silu_and_mul|"
                    r"silu_mul|situ_and_mul|swiglu|hash_topk|grouped_topk|count_and_sort|shuffle_?rows|"
                    r"shuffle_mul_sum|_unpack_packed_topk|softplus",
     "SGLang's Marlin MXFP4 runner (device::marlin_moe::Marlin), routing (moe_hash_topk_fused, moe_fused_gate, the "
     "compiled sqrt-softplus top-k), ours (ops/fp4_moe)"),
    ("fp8_linear", r"fp8_linear|w8a8|block_fp8|fp8_gemm|fp8_blockwise|fp8_fp4_gemm|e4m3\w*gemm|gemm\w*e4m3|"
                   r"scaled_mm|cutlass\w*fp8|fp8\w*cutlass|sm90_fp8_gemm|qmma",
     "SGLang's Triton _w8a8_block_fp8_matmul, DeepGEMM sm90_fp8_gemm_*, CUTLASS FP8, ours (fp8_linear)"),
    ("bf16_linear", r"nvjet|gemm|gemv|cublas|cutlass|xmma|matmul|splitkreduce|router_gemm|bf16_gemm",
     "cuBLAS (nvjet_*_tst_/_tss_), CUTLASS and DeepGEMM bf16 GEMMs, sgl_kernel's router_gemm_kernel"),
    ("norm_quant_rope", r"rmsnorm|rms_norm|norm|quant|rope|rotary|hadamard", "norms, activation quant, rope"),
)
_COMPILED = [(op, re.compile(p)) for op, p, _ in RULES]


def classify_kernel(name: str) -> str:
    low = name.lower()
    for op, pattern in _COMPILED:
        if pattern.search(low):
            return op
    return "other"


# ------------------------------------------------------------------------------------------------- traces
KERNEL_CATS = ("kernel", "Kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_NAMES = ("cudaGraphLaunch", "cudaGraphLaunch_v10000", "cuGraphLaunch")


def load_trace(path: str) -> List[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    return trace.get("traceEvents", trace if isinstance(trace, list) else [])


def kernels(events: Iterable[dict]) -> List[dict]:
    """GPU kernel / memcpy / memset events: {name, ts, dur, corr} (us)."""
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in KERNEL_CATS:
            args = e.get("args") or {}
            out.append({"name": e.get("name", "?"), "ts": float(e.get("ts", 0.0)), "dur": float(e.get("dur", 0.0)),
                        "corr": args.get("correlation")})
    return out


def graph_launches(events: Iterable[dict]) -> List[dict]:
    """cudaGraphLaunch runtime calls: {ts, corr}."""
    out = []
    for e in events:
        if e.get("ph") == "X" and e.get("name") in LAUNCH_NAMES:
            out.append({"ts": float(e.get("ts", 0.0)), "corr": (e.get("args") or {}).get("correlation")})
    return sorted(out, key=lambda x: x["ts"])


def merged_busy(intervals: Sequence[Tuple[float, float]], lo: float = float("-inf"),
                hi: float = float("inf")) -> float:
    """Length of the union of [start, end) intervals clipped to [lo, hi): the time the GPU ran any kernel
    (kernels overlap on several streams; summing their durations would count that time twice)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals):
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def step_window(kerns: List[dict], launches: List[dict], fallback_steps: int) -> Dict[str, object]:
    """The profiled decode steps: with CUDA graphs each step is one replay of the decode graph, whose kernels carry the
    correlation id of their cudaGraphLaunch. Complete replays are those with the most kernels (the profiler's start
    and stop may cut the first and the last; other graphs have fewer); the window runs from the first kernel of the
    first complete replay to the first kernel of the last, so ``steps`` whole steps lie inside it. Without graph
    launches: the span of all kernels and the profiler's own step count."""
    by_corr: Dict[object, List[dict]] = {}
    for k in kerns:
        by_corr.setdefault(k["corr"], []).append(k)
    sizes = [len(by_corr.get(l["corr"], ())) for l in launches]
    biggest = max(sizes) if sizes else 0
    starts = sorted(min(k["ts"] for k in by_corr[l["corr"]]) for l, n in zip(launches, sizes)
                    if biggest and n == biggest)
    if len(starts) >= 3:
        return {"start": starts[0], "end": starts[-1], "steps": len(starts) - 1, "method": "graph replays",
                "kernels_per_replay": biggest}
    if not kerns:
        return {"start": 0.0, "end": 0.0, "steps": 0, "method": "no kernels"}
    return {"start": min(k["ts"] for k in kerns), "end": max(k["ts"] + k["dur"] for k in kerns),
            "steps": fallback_steps, "method": "kernel span / profiler steps"}


def analyse(events: List[dict], fallback_steps: int, top: int = 30) -> Dict[str, object]:
    """Per-op GPU time per step, the merged GPU busy time per step and the trace's own step period."""
    kerns = kernels(events)
    win = step_window(kerns, graph_launches(events), fallback_steps)
    lo, hi, steps = win["start"], win["end"], max(1, int(win["steps"]))
    inside = [k for k in kerns if lo <= k["ts"] < hi] if hi > lo else kerns
    by_op: Dict[str, float] = {}
    by_name: Dict[str, float] = {}
    for k in inside:
        op = classify_kernel(k["name"])
        by_op[op] = by_op.get(op, 0.0) + k["dur"]
        by_name[k["name"]] = by_name.get(k["name"], 0.0) + k["dur"]
    busy = merged_busy([(k["ts"], k["ts"] + k["dur"]) for k in inside], lo, hi)
    span = hi - lo
    total = sum(by_op.values())
    return {
        "steps": steps, "step_method": win["method"],
        "window_us": span,
        "trace_us_per_step": span / steps if span > 0 else None,
        "gpu_busy_us_per_step": busy / steps,
        "kernel_us_per_step": total / steps,
        "gpu_busy_fraction_in_trace": busy / span if span > 0 else None,
        "us_per_step": {op: by_op[op] / steps for op in OPS if op in by_op},
        "share": {op: by_op[op] / total for op in OPS if op in by_op} if total else {},
        "top_kernels": [{"name": n[:160], "us_per_step": us / steps, "op": classify_kernel(n)}
                        for n, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:top]],
    }


def analyse_files(paths: Sequence[str], fallback_steps: int) -> Optional[Dict[str, object]]:
    """The trace of TP rank 0 (the first file) analysed; None without files."""
    if not paths:
        return None
    return analyse(load_trace(paths[0]), fallback_steps)
