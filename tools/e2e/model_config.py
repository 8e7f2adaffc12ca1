"""DeepSeek-V4-Flash at its real widths with few layers, as the config.json SGLang 0.5.17 loads with
``--load-format dummy`` (the model directory holds only this file).

    python3 tools/e2e/model_config.py OUT_DIR [--layers 12] [--compress-ratios 0,4,128,4] [--hash-layers 3] [--mtp 1]

The depth is a parameter (``--layers``); the layer kinds repeat the pattern of ``--compress-ratios``
(``DEFAULT_PATTERN`` 0 / 4 / 128 / 4) to that depth, so every kind keeps its share. The default depth,
``DEFAULT_LAYERS`` (12), is step_model.choose_depth(): the fewest whole patterns at which the decode step's GPU time
stays >= 80 % of its wall time at one stream in every setup (the harness measures and reports the fraction).
Every layer kind of the real model is present: compress ratio 0 (sliding window only), 4 (compressed KV + the C4
indexer) and 128; hash-routed MoE (``num_hash_layers``: SGLang 0.5.17 reads that name, deepseek_v2.py:603
``getattr(config, "num_hash_layers", 0)``; ``n_hash_layers``, the name of its DeepSeekV4Config dataclass, is read by
nothing, so a config with only that name has no hash-routed layer) and learned-gate MoE (the layers from
``num_hash_layers`` on); the MTP layer through ``num_nextn_predict_layers`` (loaded as DeepseekV4ForCausalLMNextN by
the EAGLE draft worker; it is never hash-routed, deepseek_v2.py:604).

SGLang's DeepSeek-V4 config object is transformers' DeepseekV3Config under model_type deepseek_v4
(srt/utils/hf_transformers/common.py:145): the DeepSeekV4Config dataclass defaults are not applied, so every field the
model reads is written here (the set that loaded on the H200 on 2026-11-29, /work/shared/specs/e2e_bundle.md).

The routed experts are MXFP4 because nothing says otherwise: with no safetensors in the directory,
``try_detect_fp4_experts`` returns None and ``is_fp4_experts`` keeps SGLANG_DSV4_FP4_EXPERTS's default, True
(model_config.py:365-380, environ.py:1157); the harness also sets SGLANG_DSV4_FP4_EXPERTS=1, which skips the probe.
Attention and dense weights are FP8 e4m3 with 128x128 UE8M0 block scales (quantization_config below).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

# The real model's widths (/work/shared/specs/model_facts.md).
WIDTHS: Dict[str, object] = {
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "q_lora_rank": 1024,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "qk_nope_head_dim": 448,
    "qk_rope_head_dim": 64,
    "head_dim": 512,
    "v_head_dim": 512,
    "kv_lora_rank": 512,
    "n_routed_experts": 256,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048,
    "intermediate_size": 2048,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "window_size": 128,
    "sliding_window": 128,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "vocab_size": 129280,
}

# Everything else the 0.5.17 model reads, at DeepSeek-V4-Flash's values.
OTHER_FIELDS: Dict[str, object] = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "max_position_embeddings": 1048576,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                            "scale_fmt": "ue8m0", "weight_block_size": [128, 128]},
    "swiglu_limit": 10.0,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "moe_layer_freq": 1,
    "n_group": 8,
    "topk_group": 8,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "compress_rope_theta": 40000,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",
    "use_cache": True,
    "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
}

DEFAULT_PATTERN = (0, 4, 128, 4)
DEFAULT_COMPRESS_RATIOS = DEFAULT_PATTERN   # the 4-layer model of the earlier runs (one pattern)
DEFAULT_LAYERS = 12                          # step_model.choose_depth() (tests/e2e/test_step_model.py checks it)
DEFAULT_HASH_LAYERS = 3                      # the real model's first 3 layers route by hash
ALLOWED_RATIOS = (0, 4, 128)  # deepseek_v4.py:438 asserts these


def ratios_for_depth(layers: int, pattern: Sequence[int] = DEFAULT_PATTERN) -> List[int]:
    """``layers`` compress ratios: ``pattern`` repeated (and cut) to that depth."""
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    if not pattern:
        raise ValueError("the compress-ratio pattern is empty")
    return [int(pattern[i % len(pattern)]) for i in range(layers)]


def make_config(compress_ratios: Sequence[int] = DEFAULT_COMPRESS_RATIOS, hash_layers: int = DEFAULT_HASH_LAYERS,
                mtp_layers: int = 1, layers: Optional[int] = None) -> Dict[str, object]:
    """The config.json dict; ``layers`` given: ``compress_ratios`` is the pattern repeated to that depth."""
    ratios = [int(r) for r in compress_ratios]
    if layers is not None:
        ratios = ratios_for_depth(layers, ratios)
    bad = [r for r in ratios if r not in ALLOWED_RATIOS]
    if bad:
        raise ValueError(f"compress_ratios: each must be one of {ALLOWED_RATIOS}, got {bad}")
    if not 0 <= hash_layers <= len(ratios):
        raise ValueError(f"hash_layers must be in 0..{len(ratios)} (the number of layers), got {hash_layers}")
    if mtp_layers not in (0, 1):
        raise ValueError(f"mtp_layers must be 0 or 1 (SGLang 0.5.17 asserts at most one nextn layer), got {mtp_layers}")
    config: Dict[str, object] = dict(OTHER_FIELDS)
    config.update(WIDTHS)
    config.update({
        "num_hidden_layers": len(ratios),
        "compress_ratios": ratios,
        "num_hash_layers": hash_layers,   # the name SGLang 0.5.17 reads (deepseek_v2.py:603)
        "n_hash_layers": hash_layers,     # DeepSeekV4Config's name, kept equal
        "num_nextn_predict_layers": mtp_layers,
    })
    return config


def layer_kinds(config: Dict[str, object]) -> List[Dict[str, object]]:
    """Per main layer: its compress ratio and whether its MoE routes by token hash or by the learned gate."""
    n_hash = int(config.get("num_hash_layers", 0))
    return [{"layer": i, "compress_ratio": r, "routing": "hash" if i < n_hash else "gate"}
            for i, r in enumerate(config["compress_ratios"])]


def coverage_problems(config: Dict[str, object]) -> List[str]:
    """What the config fails to cover of the real model's layer kinds (empty: all covered)."""
    kinds = layer_kinds(config)
    problems = []
    for ratio in ALLOWED_RATIOS:
        if not any(k["compress_ratio"] == ratio for k in kinds):
            problems.append(f"no layer with compress ratio {ratio}")
    for routing in ("hash", "gate"):
        if not any(k["routing"] == routing for k in kinds):
            problems.append(f"no {routing}-routed MoE layer")
    if len(config["compress_ratios"]) != config["num_hidden_layers"]:
        problems.append("compress_ratios must have one entry per layer")
    return problems


def write_config(out_dir: str, **kwargs) -> str:
    os.makedirs(out_dir, exist_ok=True)
    config = make_config(**kwargs)
    path = os.path.join(out_dir, "config.json")
    with open(path, "w") as f:
        json.dump(config, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="depth: the ratio pattern repeated to it")
    ap.add_argument("--compress-ratios", default=",".join(map(str, DEFAULT_PATTERN)),
                    help="the ratio pattern, comma separated (each 0, 4 or 128)")
    ap.add_argument("--hash-layers", type=int, default=DEFAULT_HASH_LAYERS, help="the first N layers route by hash")
    ap.add_argument("--mtp", type=int, default=1, help="num_nextn_predict_layers: 1 (MTP layer) or 0")
    args = ap.parse_args(argv)
    try:
        ratios = [int(x) for x in args.compress_ratios.split(",") if x.strip()]
        config = make_config(ratios, args.hash_layers, args.mtp, layers=args.layers)
    except ValueError as e:
        ap.error(str(e))
    problems = coverage_problems(config)
    path = write_config(args.out_dir, compress_ratios=ratios, hash_layers=args.hash_layers, mtp_layers=args.mtp,
                        layers=args.layers)
    kinds = ", ".join(f"L{k['layer']}:c{k['compress_ratio']}/{k['routing']}" for k in layer_kinds(config))
    print(f"wrote {path}: {kinds}" + (f"; MTP layer" if args.mtp else "") +
          (f"; NOT covered: {'; '.join(problems)}" if problems else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
