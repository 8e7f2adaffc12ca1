"""Seeded dummy weights in DeepSeek-V4's checkpoint formats, the same in every setup.

Why SGLang's own dummy initialiser cannot serve the comparison (0.5.17 weight_utils.py:1514
``initialize_dummy_weights(model, low=-1e-3, high=1e-3, seed=1234)``, called by DummyModelLoader, loader.py:1456):
* it fills floating tensors only: the MXFP4 experts (int8, fp8.py:1152-1170) keep ``torch.empty``'s bytes, which differ
  from run to run (and from setup to setup);
* every tensor gets uniform(-1e-3, 1e-3): in FP8 e4m3 that is 0 or +-2^-9, and the block scales come out negative,
  so the logits are nearly flat and greedy tokens are decided by rounding noise;
* its seed is a constant (no server argument changes it; --random-seed seeds sampling only).

This initialiser replaces it (the harness installs it in every process when DSV4_E2E_WEIGHT_SEED is set). Each
parameter gets values from a generator seeded by (seed, parameter name), drawn in fixed-size chunks, so a parameter of
the same name, shape and dtype gets the same values in every setup:
* FP8 e4m3 weights: N(0, 1) rounded to e4m3; their 128x128 block scales (``weight_scale_inv``, fp32): powers of two
  2^(round(log2(1/sqrt(K))) + j), j uniform in {-1, 0, 1} per block, so the effective weight has std ~1/sqrt(K)
  and scale handling is exercised;
* MXFP4 experts (int8, two e2m1 codes a byte): uniform random bytes; their per-32 UE8M0 scales
  (fp32 2^e or float8_e8m0fnu, whichever the MoE method created) 2^(round(log2(1/(2.93 sqrt(K)))) + j), 2.93 being
  the RMS of a uniform e2m1 code. ``w13`` is drawn as its gate half and its up half, placed in the order the MoE method
  loads checkpoints in (``load_up_proj_weight_first``: FlashInfer's CUTLASS MXFP4 method puts up first), so the
  same expert weights result whatever the runner;
* bf16 / fp32: norm weights and ``*_scale`` 1; the embedding N(0, 1); the LM heads N(0, (4/sqrt(K))^2), so the logits
  have std ~4 and greedy choices are mostly clear; other matrices N(0, 1/K); other vectors N(0, 0.25);
* anything else (the int32 hash-routing table, which SGLang fills validly itself, hash_topk.py:79) is left as built.
* a matrix that is FP8 in the checkpoint but that a setup builds in bf16 (DeepSeek-V4's ``wo_a`` where
  SGLANG_OPT_FP8_WO_A_GEMM is off, SGLang's SM120 default: it dequantizes the checkpoint's FP8 at load) is filled with
  the dequantized draw of the FP8 weight and 128x128 block scales a setup that keeps it in FP8 gets under the same
  names (``fp8_dequantized``), so both setups serve the same model (FP8_IN_CHECKPOINT).
Everything runs before ``process_weights_after_loading``, which converts the weights for each runner as it would
a checkpoint's.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from typing import Dict, List, Optional, Tuple

E2M1_RMS = math.sqrt(sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8)  # 2.93
LOGIT_STD = 4.0
CHUNK_ELEMENTS = 1 << 26  # values drawn per generator call (bounded temporary memory)

_SEED: Optional[int] = None


def parse_seed(text: str) -> int:
    try:
        seed = int(str(text).strip())
    except ValueError:
        raise ValueError(f"DSV4_E2E_WEIGHT_SEED must be an integer, got {text!r}") from None
    if seed < 0:
        raise ValueError(f"DSV4_E2E_WEIGHT_SEED must be >= 0, got {seed}")
    return seed


def derived_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


# parameters that are FP8 (e4m3 + 128x128 block scales) in the checkpoint whichever dtype a setup builds them in
FP8_IN_CHECKPOINT = ("wo_a.weight",)
FP8_BLOCK = 128


def classify(name: str, dtype_name: str, ndim: int) -> str:
    """The fill rule of a parameter, from its name, dtype name (``str(torch.dtype)`` without 'torch.') and rank."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf.endswith("weight_scale_inv"):
        return "block_scale"
    if dtype_name == "float8_e4m3fn":
        return "fp8_weight"
    if dtype_name in ("bfloat16", "float16", "float32") and ndim == 2 and name.endswith(FP8_IN_CHECKPOINT):
        return "fp8_dequantized"
    if dtype_name in ("int8", "uint8") and leaf in ("w13_weight", "w2_weight"):
        return "mxfp4_weight"
    if dtype_name not in ("bfloat16", "float16", "float32"):
        return "kept"
    if ndim == 0:
        return "kept"
    if "embed_tokens" in name:
        return "normal_1"
    owner = name.rsplit(".", 2)[-2] if "." in name else ""
    if ndim == 1 and leaf == "weight" and "norm" in owner:
        return "ones"
    if ndim == 1 and leaf.endswith("_scale"):
        return "ones"
    if ndim >= 2 and (name.endswith("lm_head.weight") or name.endswith("head.head.weight")):
        return "lm_head"
    if ndim >= 2:
        return "normal_fan_in"
    return "normal_vector"


def _fill(flat, gen, draw):
    """Fill a 1-D tensor with ``draw(n, gen)`` in chunks of CHUNK_ELEMENTS (a fixed order: the same values each run)."""
    numel = flat.numel()
    for start in range(0, numel, CHUNK_ELEMENTS):
        stop = min(numel, start + CHUNK_ELEMENTS)
        flat[start:stop].copy_(draw(stop - start, gen))


def _generator(device, seed: int):
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def _draw_fp8(n, gen, device):
    import torch

    return torch.randn(n, generator=gen, device=device).clamp_(-448, 448).to(torch.float8_e4m3fn)


def _draw_bytes(n, gen, device):
    import torch

    return torch.randint(0, 256, (n,), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)


def _draw_exponents(n, gen, device, base: int):
    import torch

    return torch.randint(-1, 2, (n,), generator=gen, device=device, dtype=torch.int32) + base


def _write_exponents(target, exps):
    """Store integer exponents into a scale tensor: fp32 as 2^e, float8_e8m0fnu as the byte e + 127."""
    import torch

    if target.dtype == torch.float32:
        target.copy_(torch.exp2(exps.float()).view(target.shape))
    elif target.dtype == getattr(torch, "float8_e8m0fnu", None) or target.dtype == torch.uint8:
        target.view(torch.uint8).copy_((exps + 127).clamp(0, 254).to(torch.uint8).view(target.shape))
    else:
        raise TypeError(f"block scale of dtype {target.dtype}: expected float32 or float8_e8m0fnu")


def _halves(param, up_first: bool) -> List[Tuple[str, object]]:
    """[(logical part, view)] of a w13 tensor: dim 1 holds [gate; up], or [up; gate] when ``up_first``."""
    half = param.shape[1] // 2
    first, second = param.data[:, :half], param.data[:, half:]
    return [("up", first), ("gate", second)] if up_first else [("gate", first), ("up", second)]


def fill_parameter(model, name: str, param, params: Dict[str, object], seed: int) -> str:
    import torch

    dtype_name = str(param.dtype).replace("torch.", "")
    rule = classify(name, dtype_name, param.dim())
    device = param.device
    prefix, leaf = name.rsplit(".", 1) if "." in name else ("", name)
    with torch.no_grad():
        if rule == "kept":
            return rule
        if rule in ("mxfp4_weight", "fp8_weight", "block_scale") and leaf.startswith("w13") and param.dim() == 3:
            owner = model.get_submodule(prefix) if prefix else model
            up_first = bool(getattr(getattr(owner, "quant_method", None), "load_up_proj_weight_first", False))
            parts = _halves(param, up_first)
            rule += "/up_first" if up_first else "/gate_first"
        else:
            parts = [("", param.data)]
        for part, view in parts:
            gen = _generator(device, derived_seed(seed, f"{name}:{part}" if part else name))
            if rule.startswith("mxfp4_weight"):
                tmp = torch.empty(view.numel(), dtype=torch.uint8, device=device)
                _fill(tmp, gen, lambda n, g: _draw_bytes(n, g, device))
                view.copy_(tmp.view(view.dtype).view(view.shape))
            elif rule.startswith("block_scale"):
                weight = params.get(prefix + "." + leaf[: -len("_scale_inv")] if prefix else leaf[: -len("_scale_inv")])
                if weight is None:
                    return "kept (no weight beside this scale)"
                if weight.dtype in (torch.int8, torch.uint8):  # MXFP4: two codes a byte
                    k = weight.shape[-1] * 2
                    base = round(math.log2(1.0 / (E2M1_RMS * math.sqrt(k))))
                else:
                    base = fp8_block_scale_base(weight.shape[-1])
                exps = torch.empty(view.numel(), dtype=torch.int32, device=device)
                _fill(exps, gen, lambda n, g: _draw_exponents(n, g, device, base))
                _write_exponents(view, exps)
            elif rule.startswith("fp8_weight"):
                tmp = torch.empty(view.numel(), dtype=torch.float8_e4m3fn, device=device)
                _fill(tmp, gen, lambda n, g: _draw_fp8(n, g, device))
                view.copy_(tmp.view(view.shape))
            elif rule == "fp8_dequantized":
                view.copy_(dequantized_fp8_draw(name, tuple(view.shape), device, seed).to(view.dtype))
            elif rule == "ones":
                view.fill_(1.0)
            else:
                std = {"normal_1": 1.0, "normal_vector": 0.5,
                       "lm_head": LOGIT_STD / math.sqrt(param.shape[-1]),
                       "normal_fan_in": 1.0 / math.sqrt(param.shape[-1])}[rule]
                tmp = torch.empty(view.numel(), dtype=torch.float32, device=device)
                _fill(tmp, gen, lambda n, g: torch.randn(n, generator=g, device=device))
                view.copy_((tmp * std).view(view.shape).to(view.dtype))
    return rule


def fp8_block_scale_base(k: int) -> int:
    """The block-scale exponent around which an FP8 weight of K inputs is drawn (effective std ~1/sqrt(K))."""
    return round(math.log2(1.0 / math.sqrt(k)))


def dequantized_fp8_draw(name: str, shape: Tuple[int, int], device, seed: int):
    """fp32 values of the FP8 weight ``name`` [N, K] and its ``name + '_scale_inv'`` block scales as the fp8_weight and
    block_scale rules draw them (same generators, same order), dequantized: w_fp8 * 2^e per 128x128 block."""
    import torch

    n, k = shape
    w = torch.empty(n * k, dtype=torch.float8_e4m3fn, device=device)
    _fill(w, _generator(device, derived_seed(seed, name)), lambda m, g: _draw_fp8(m, g, device))
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    exps = torch.empty(nb * kb, dtype=torch.int32, device=device)
    base = fp8_block_scale_base(k)
    _fill(exps, _generator(device, derived_seed(seed, name + "_scale_inv")),
          lambda m, g: _draw_exponents(m, g, device, base))
    scale = torch.exp2(exps.float()).view(nb, kb)
    full = scale.repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
    return w.view(n, k).float() * full


def seeded_dummy_weights(model, low: float = -1e-3, high: float = 1e-3, seed: int = 1234) -> None:
    """Drop-in for SGLang's initialize_dummy_weights (its low/high/seed arguments are ignored: see the module doc)."""
    params = dict(model.named_parameters())
    record = []
    for name, param in params.items():
        rule = fill_parameter(model, name, param, params, _SEED)
        record.append({"name": name, "shape": list(param.shape), "dtype": str(param.dtype).replace("torch.", ""),
                       "rule": rule})
    counts: Dict[str, int] = {}
    for r in record:
        counts[r["rule"]] = counts.get(r["rule"], 0) + 1
    print(f"[dsv4-e2e-shim] pid {os.getpid()}: seeded dummy weights (seed {_SEED}): {len(record)} parameters "
          f"({', '.join(f'{n} {k}' for k, n in sorted(counts.items()))})", file=sys.stderr, flush=True)
    log_dir = os.environ.get("DSV4_E2E_WEIGHT_LOG", "").strip()
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        # one file per process and model: an MTP server loads the target and its draft in one process
        with open(os.path.join(log_dir, f"weights_{os.getpid()}_{type(model).__name__}.json"), "w") as f:
            json.dump({"seed": _SEED, "model": type(model).__name__, "parameters": record}, f)


def _patch_weight_utils(module) -> None:
    module.initialize_dummy_weights = seeded_dummy_weights


def _patch_loader(module) -> None:
    # loader.py:111 binds the name at its import; weight_utils is patched before that, but rebind in any case
    if getattr(module, "initialize_dummy_weights", None) is not seeded_dummy_weights:
        module.initialize_dummy_weights = seeded_dummy_weights


def install(hook, seed_text: str) -> int:
    global _SEED
    _SEED = parse_seed(seed_text)
    hook.watch("sglang.srt.model_loader.weight_utils", _patch_weight_utils)
    hook.watch("sglang.srt.model_loader.loader", _patch_loader)
    return _SEED
