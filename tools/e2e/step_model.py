"""Arithmetic of the served decode step (pure: no GPU, no SGLang): the bytes each op must read per step, their floor at
a measured copy bandwidth, each server's memory and how many fit on the GPU at once, and the depth at which the
step's GPU time dominates at one stream.

Shapes are read from the model config (model_config.make_config) and follow SGLang 0.5.17's modules
(srt/models/deepseek_v4.py, srt/layers/attention/dsv4/{compressor,indexer}.py, srt/models/deepseek_v2.py MoEGate):
per layer, dense FP8 (e4m3, fp32 128x128 block scales): wq_a, wkv (replicated), wq_b (column-parallel), wo_b
(row-parallel), the shared expert's gate_up and down (TP-sharded; SGLang does not fuse it into the routed experts for
DeepSeek-V4), the C4 indexer's wq_b (replicated); bf16: wo_a (column-parallel; bf16 in every setup:
SGLANG_OPT_FP8_WO_A_GEMM is turned off on SM120 and, unless set explicitly, on sm90), the router (256 x hidden), the
compressors' wkv_gate (C4: 2*2*512 rows, C128: 2*512, the indexer's: 2*2*128) and the indexer's weights_proj
(64 rows); fp32: the two mHC mixing matrices (24 x 4*hidden each); routed experts MXFP4 (two e2m1 a byte, a UE8M0
scale per 32). Once per step: lm_head (vocab-parallel, bf16) and the hc head (4 x 4*hidden fp32).

Floors are bytes / copy bandwidth (read + write bytes of a 1 GiB device copy over its time, measured in the same
run); "% of floor" = floor / measured time. MoE bytes are an estimate: the expected number of distinct experts a
layer's T tokens touch under uniform routing, E * (1 - (1 - k/E)^T), times one expert's bytes.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence

FP8_BLOCK = 128
SCALE_BYTES = 4            # fp32 weight_scale_inv per 128x128 block (what SGLang's FP8 linear stores and reads)
MXFP4_GROUP = 32
KV_ROW_BYTES = 584         # one token of the sparse-MLA cache: 448 FP8 nope + 64 bf16 rope + scales
INDEX_ROW_BYTES = 132      # one compressed token of the indexer cache: 128 FP8 + an fp32 scale
GIB = float(1 << 30)


def _fp8(rows: int, cols: int) -> int:
    return rows * cols + math.ceil(rows / FP8_BLOCK) * math.ceil(cols / FP8_BLOCK) * SCALE_BYTES


def _hd(config: Mapping) -> int:
    return int(config["hidden_size"])


def layer_weight_bytes(config: Mapping, ratio: int, tp: int = 1) -> Dict[str, int]:
    """Bytes of one decoder layer's dense weights on one TP rank, by the op whose kernels read them
    (fp8_linear, bf16_linear, mhc); the routed experts are separate (expert_bytes)."""
    h, heads, hd = _hd(config), int(config["num_attention_heads"]), int(config["head_dim"])
    q_rank, o_rank, groups = int(config["q_lora_rank"]), int(config["o_lora_rank"]), int(config["o_groups"])
    inter = int(config["moe_intermediate_size"]) * int(config.get("n_shared_experts", 1) or 0)
    fp8 = (_fp8(q_rank, h) + _fp8(hd, h)                              # wq_a, wkv (replicated)
           + _fp8(heads * hd // tp, q_rank)                           # wq_b (column-parallel)
           + _fp8(h, groups * o_rank // tp)                           # wo_b (row-parallel)
           + _fp8(2 * inter // tp, h) + _fp8(h, inter // tp))         # shared expert gate_up, down
    bf16 = (groups * o_rank // tp) * (heads * hd // groups) * 2      # wo_a
    bf16 += int(config["n_routed_experts"]) * h * 2                  # router
    if ratio == 4:
        ihd, iheads = int(config["index_head_dim"]), int(config["index_n_heads"])
        fp8 += _fp8(iheads * ihd, q_rank)                             # indexer wq_b (replicated)
        bf16 += (2 * 2 * hd) * h * 2 + (2 * 2 * ihd) * h * 2 + iheads * h * 2  # compressor, indexer compressor, w_proj
    elif ratio == 128:
        bf16 += (2 * hd) * h * 2                                      # compressor (no overlap)
    hc = int(config["hc_mult"])
    mhc = 2 * (2 + hc) * hc * hc * h * 4                              # hc_attn_fn, hc_ffn_fn (fp32)
    return {"fp8_linear": fp8, "bf16_linear": bf16, "mhc": mhc}


def expert_bytes(config: Mapping, tp: int = 1, scale_bytes: int = 1) -> int:
    """One routed expert on one TP rank (the intermediate dimension is split): gate_up and down in MXFP4."""
    h, inter = _hd(config), int(config["moe_intermediate_size"]) // tp
    elems = 2 * inter * h + h * inter
    return elems // 2 + elems // MXFP4_GROUP * scale_bytes


def once_per_step_bytes(config: Mapping, tp: int = 1) -> Dict[str, int]:
    """lm_head (bf16, vocab-parallel) and the hc head (fp32)."""
    h, hc = _hd(config), int(config["hc_mult"])
    return {"bf16_linear": int(config["vocab_size"]) // tp * h * 2, "mhc": hc * hc * h * 4}


def expected_distinct_experts(tokens: int, experts: int = 256, top_k: int = 6) -> float:
    """Distinct experts T tokens touch in one layer if each picks top_k of ``experts`` uniformly (an estimate: the
    real router is not uniform, and hash-routed layers route by token id)."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


def kv_rows_per_token(config: Mapping, ratio: int, context: int) -> Dict[str, int]:
    """Cache rows one decode token reads in one layer: sparse MLA's window (128) plus, on C4 layers, the top-512
    compressed rows (all of them below 512) and, on C128 layers, every compressed row; the indexer's rows (C4
    layers: every compressed row)."""
    window = min(int(config["window_size"]), context)
    rows = {"sparse_mla": window, "indexer": 0}
    if ratio == 4:
        compressed = context // 4
        rows["sparse_mla"] += min(int(config["index_topk"]), compressed)
        rows["indexer"] = compressed
    elif ratio == 128:
        rows["sparse_mla"] += context // 128
    return rows


def step_bytes(config: Mapping, streams: int, context: float, tp: int = 1) -> Dict[str, float]:
    """Bytes each op must read in one decode step of ``streams`` tokens at ``context`` tokens each, on one TP rank."""
    ratios = [int(r) for r in config["compress_ratios"]]
    out: Dict[str, float] = {"fp8_linear": 0.0, "bf16_linear": 0.0, "mhc": 0.0, "moe_experts": 0.0,
                             "sparse_mla": 0.0, "indexer": 0.0}
    ctx = int(round(context))
    per_expert = expert_bytes(config, tp)
    distinct = expected_distinct_experts(streams, int(config["n_routed_experts"]), int(config["num_experts_per_tok"]))
    for ratio in ratios:
        for op, b in layer_weight_bytes(config, ratio, tp).items():
            out[op] += b
        out["moe_experts"] += distinct * per_expert
        rows = kv_rows_per_token(config, ratio, ctx)
        out["sparse_mla"] += streams * rows["sparse_mla"] * KV_ROW_BYTES
        out["indexer"] += streams * rows["indexer"] * INDEX_ROW_BYTES
    for op, b in once_per_step_bytes(config, tp).items():
        out[op] += b
    return out


def floors(bytes_by_op: Mapping[str, float], us_by_op: Mapping[str, float],
           copy_bytes_per_s: Optional[float]) -> Dict[str, dict]:
    """Per op: bytes, floor (us at the copy bandwidth), measured us and % of floor (floor / measured)."""
    out = {}
    for op in sorted(set(bytes_by_op) | set(us_by_op)):
        b, us = bytes_by_op.get(op), us_by_op.get(op)
        floor_us = b / copy_bytes_per_s * 1e6 if b is not None and copy_bytes_per_s else None
        out[op] = {"bytes": b, "floor_us": floor_us, "us": us,
                   "pct_of_floor": 100.0 * floor_us / us if floor_us is not None and us else None}
    return out


# ------------------------------------------------------------------------------------------------- memory
# Weights a server held after loading ("Load weight end ... mem usage", GiB), 4-layer model, setups' eager sessions
# of the 2026-11-29 H200 run (benchmarks/results/e2e.json): above the parameters' own bytes by the loader's cached
# temporaries and the runners' layouts (setup b keeps the experts' scales in fp32).
MEASURED_4_LAYER_WEIGHTS_GIB = {"a": 17.21, "b": 18.72, "c": 17.22}
EXPERT_SCALE_BYTES = {"a": 1, "b": 4, "c": 1}   # Marlin: float8_e8m0fnu; Triton runner (ours): fp32 2^e
# Beyond the weights, per server (stated, not measured per part): the KV pool at the --max-total-tokens cap, CUDA
# graphs for 3 batch sizes, a prefill chunk's activations, the CUDA context and the allocator's cache.
SERVER_OVERHEAD_GIB = 7.0
GPU_GIB = 140.0          # H200: 143771 MiB
GPU_RESERVE_GIB = 10.0   # never planned: fragmentation, the harness's own CUDA use, drift
MAX_SERVERS_AT_ONCE = 4  # start-up is CPU compilation: more servers than this only compete for 16 cores


def weight_bytes(config: Mapping, setup: str, tp: int = 1) -> int:
    """Parameter bytes of the whole model on one rank (embedding and lm_head included), as setup ``setup`` stores
    the experts."""
    h = _hd(config)
    total = int(config["vocab_size"]) // tp * h * 2 * 2 + int(config["hc_mult"]) * int(config["hc_mult"]) * h * 4
    per_expert = expert_bytes(config, tp, EXPERT_SCALE_BYTES[setup])
    for ratio in config["compress_ratios"]:
        total += sum(layer_weight_bytes(config, int(ratio), tp).values())
        total += int(config["n_routed_experts"]) * per_expert
    return total


def server_gib(config: Mapping, setup: str, reference_config: Mapping, tp: int = 1) -> float:
    """One server's GPU memory: the weights scaled by what the 4-layer run measured against the same arithmetic
    (``reference_config``: the 4-layer config), plus SERVER_OVERHEAD_GIB."""
    factor = MEASURED_4_LAYER_WEIGHTS_GIB[setup] * GIB / weight_bytes(reference_config, setup, 1)
    return weight_bytes(config, setup, tp) * factor / GIB + SERVER_OVERHEAD_GIB


def servers_at_once(footprints_gib: Sequence[float], gpu_gib: float = GPU_GIB) -> int:
    """How many of the largest server fit side by side, leaving GPU_RESERVE_GIB."""
    biggest = max(footprints_gib)
    return max(1, min(MAX_SERVERS_AT_ONCE, int((gpu_gib - GPU_RESERVE_GIB) // biggest)))


def mem_fraction_static(n_servers: int, biggest_gib: float, gpu_gib: float = GPU_GIB) -> float:
    """SGLang 0.5.17 sizes the KV pool as free memory after loading minus free-before-loading x (1 - fraction)
    (kv_cache_configurator._profile_available_bytes) and fails when that is <= 0. With servers loading side by side
    a server's "free before" may predate the others' weights: the slack it subtracts must stay under half of what the
    round leaves free. The pool itself is capped by --max-total-tokens."""
    headroom = gpu_gib - n_servers * biggest_gib
    fraction = 1.0 - max(0.0, headroom / 2.0) / gpu_gib
    return round(min(0.95, max(0.7, fraction)), 3)


# ------------------------------------------------------------------------------------------------- depth
# One stream, CUDA graphs, SGLang's overlap scheduler (on for DeepSeek-V4): the host prepares step n+1 while the GPU
# runs step n, so a step lasts max(host, GPU) and the GPU's share of it is GPU / max(host, GPU).
# host: 2600 us, the slowest one-stream step at 4 layers (issue 59's run: (b) 385 tok/s = 2.6 ms; (a) 394 tok/s with
#   ~1 ms more GPU work per step, so both were host-bound at ~2.6 ms; the 2026-11-29 run's (c) 711 tok/s puts it
#   at <= 1.4 ms there).
# gpu per step outside the layers: lm_head (1.06 GB at ~85 % of 4.3 TB/s) and sampling, embedding, the hc head.
# gpu per layer at one token, from the op benches (docs/performance.md, H200 4.3 TB/s, H100 times scaled by
#   bandwidth where the op is bandwidth-bound) and the bytes above: MoE 6 experts ~35 us (ours cuda_decode 50 us on
#   an H100), dense FP8 ~110 MB at ~50 % (43-60 us), bf16 (wo_a, compressors) ~90 MB at ~70 % (28 us), sparse MLA
#   (ours 7.5, FlashMLA 12.6, SGLang's Triton fallback 275 us), indexer (C4 layers only) ~2-3 us, mHC ~12 us, and
#   ~25 small kernels (norms, quant, rope, compressors, routing) at ~2.4 us each (60 us).
DEPTH_MODEL = {
    "host_us": 2600.0,
    "gpu_fixed_us": 310.0,
    "gpu_per_layer_us": {"a": 35 + 60 + 28 + 275 + 2.5 + 12 + 60,   # 472
                         "b": 35 + 60 + 28 + 7.5 + 2.5 + 12 + 60,   # 205
                         "c": 35 + 43 + 28 + 12.6 + 2 + 12 + 60},   # 193
    "uncertainty": 0.2,      # the per-layer estimates may be this much too high
    "target": 0.8,
}


def gpu_fraction(layers: int, setup: str, model: Mapping = DEPTH_MODEL, pessimistic: bool = True) -> float:
    g = model["gpu_per_layer_us"][setup] * ((1.0 - model["uncertainty"]) if pessimistic else 1.0)
    gpu = model["gpu_fixed_us"] + layers * g
    return gpu / max(model["host_us"], gpu)


def choose_depth(pattern_len: int = 4, model: Mapping = DEPTH_MODEL, max_layers: int = 64) -> int:
    """The fewest layers, a whole number of layer-kind patterns (so every kind keeps its share), whose pessimistic GPU
    fraction at one stream reaches the target in every setup."""
    for layers in range(pattern_len, max_layers + 1, pattern_len):
        if all(gpu_fraction(layers, s, model) >= model["target"] for s in model["gpu_per_layer_us"]):
            return layers
    raise ValueError(f"no depth up to {max_layers} layers reaches {model['target']:.0%} of GPU time")


def depth_table(layers: Sequence[int], model: Mapping = DEPTH_MODEL) -> List[dict]:
    return [{"layers": n, **{f"{s}_fraction": round(gpu_fraction(n, s, model), 3) for s in model["gpu_per_layer_us"]}}
            for n in layers]
