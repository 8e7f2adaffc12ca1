"""SGLang's MXFP4 MoE runners as competitors of our fp4_moe, run through SGLang's own code (bench-only).

* ``marlin``: what ``--moe-runner-backend marlin`` serves (setups (a) and (c) of tools/e2e; SGLang 0.5.17
  ``srt/layers/quantization/mxfp4_marlin_moe.py``). The weights go through ``Mxfp4MarlinMoEMethod.
  process_weights_after_loading`` (SGLang's own repack of w13 / w2 and permutation of the e8m0 scales into Marlin's
  layout, ``marlin_utils_fp4.prepare_moe_mxfp4_layer_for_marlin``) on a layer-like object holding our packed bytes
  and scales, so both compute the same function; every call is ``Mxfp4MarlinMoEMethod.apply`` -> its ``MoeRunner``
  -> ``fused_experts_none_to_marlin`` -> ``fused_marlin_moe``: SGLang's per-call workspace, routing sort
  (``moe_align_single_token`` at one token, ``moe_align_block_size`` above), the two ``moe_wna16_marlin_gemm`` calls,
  its torch swiglu clamp and ``moe_topk_sum``, all in the timed call as the server runs them. SGLang applies the
  routed scaling factor after the experts for this runner (the model's ``final_hidden_states *= rsf``: FusedMoE
  does not fuse it into the top-k for Marlin), so where the weights carry one the call ends with that multiply.
* ``flashinfer sm120``: ``flashinfer_mxfp4``, SGLang's SM120 default since 0.5.16 (FlashInfer's CUTLASS MXFP8 x
  MXFP4 kernel, ``mxfp4_flashinfer_cutlass_moe.py``), built for sm_120 only; ``flashinfer sm90``: the same runner's
  W4A16 path, which SGLang 0.5.17 selects on sm_90 (fp8.py: ``is_sm90_supported() or is_sm120_supported()``). Weights
  by SGLang's ``Mxfp4FlashinferCutlassMoEMethod.process_weights_after_loading`` (W13 loaded as [up; gate], as its
  ``load_up_proj_weight_first`` makes the loader do); the call is ``fused_experts_none_to_flashinfer_mxfp4``'s
  (0.5.17 moe_runner/flashinfer_cutlass.py) without its symmetric-memory context, which needs SGLang's TP group
  (one rank here: that context is a no-op at TP 1).

SGLang is imported (these paths need its package, sgl-kernel and tvm-ffi), only when ``moe_competitors`` is called.
Its JIT modules (tvm-ffi: ``moe_wna16_marlin``, ``gptq_marlin_repack``, ``moe_align_single_token``,
``moe_topk_sum``) load from the tvm-ffi cache (``TVM_FFI_CACHE_DIR``, default ``~/.cache/tvm-ffi``) where
tools/e2e/prebuild_jit.py's modules are installed; one that would compile first (``moe_wna16_marlin``: ~5 min of
nvcc) leaves the competitor unavailable with that reason unless ``allow_jit`` (or DSV4_BENCH_ALLOW_SGLANG_JIT=1;
=small: all but moe_wna16_marlin). Nothing here raises at discovery:
each competitor's ``reason`` says why it cannot run.

Use: ``for c in moe_competitors(): if c.available: p = c.prepare(weights); out = p.run(x, topk_weights, topk_ids)``
(``p.bind(...)`` returns the zero-argument call that is timed). ``weights``: dict of ``w13`` uint8 / int8 [E, 2I, H/2]
(gate rows, then up), ``w13_scale`` uint8 UE8M0 / float8_e8m0fnu [E, 2I, H/32], ``w2`` [E, H, I/2], ``w2_scale``
[E, H, I/32], ``swiglu_limit`` (float or None), ``routed_scaling_factor`` (float or None): our op's inputs.
``user_bench_competitors()`` wraps them in the form of bench/runner.py (``prepare(inputs) -> call``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import shapes

TP_SHARDS = (1, 2, 4)                  # issue 59: DeepSeek-V4-Flash's expert intermediate 2048 / 1024 / 512
MARLIN = "sglang marlin mxfp4 (Mxfp4MarlinMoEMethod.apply -> fused_marlin_moe, W4A16)"
FLASHINFER_SM120 = "sglang flashinfer_mxfp4 sm120 (FlashInfer CUTLASS MXFP8 x MXFP4, W4A8)"
FLASHINFER_SM90 = "sglang flashinfer_mxfp4 sm90 (FlashInfer CUTLASS W4A16)"
SHORT = {MARLIN: "marlin", FLASHINFER_SM120: "flashinfer_sm120", FLASHINFER_SM90: "flashinfer_sm90"}
ALLOW_JIT_ENV = "DSV4_BENCH_ALLOW_SGLANG_JIT"   # "1": let SGLang / FlashInfer compile a missing JIT module;
#                                                "small": SGLang's small ones only (not moe_wna16_marlin's ~5 min)
ALLOW_JIT_VALUES = ("0", "1", "small")
HEAVY_JIT = ("_jit_moe_wna16_marlin_module",)

# SGLang's tvm-ffi JIT modules on the Marlin path: (module, builder, builder args as a thunk, what needs it)
MARLIN_JIT = (
    ("sglang.kernels.ops.moe.moe_wna16_marlin", "_jit_moe_wna16_marlin_module",
     lambda torch: (torch.bfloat16, False, False), "the two expert GEMMs (bf16, no EP, no bias); ~5 min of nvcc"),
    ("sglang.kernels.ops.quantization.gptq_marlin_repack", "_jit_gptq_marlin_repack_module", lambda torch: (),
     "the weight repack of process_weights_after_loading"),
    ("sglang.kernels.ops.moe.moe_align_single_token", "_jit_align_single_token_module", lambda torch: (),
     "the one-token routing sort"),
    ("sglang.kernels.ops.moe.moe_topk_sum", "_jit_topk_sum_module", lambda torch: (), "the top-k sum"),
)


class NotApplicable(Exception):
    """The competitor's SGLang path never serves this shape (the message says why)."""


@dataclass(frozen=True)
class MoeShape:
    experts: int
    topk: int
    hidden: int
    inter: int
    tp: int = 1


def moe_shape(tp: int) -> MoeShape:
    """DeepSeek-V4-Flash's routed experts on one rank of SGLang's MoE tensor parallelism (I split over the ranks)."""
    if tp not in TP_SHARDS:
        raise ValueError(f"tp must be one of {', '.join(map(str, TP_SHARDS))} (the expert shards the MoE bench "
                         f"measures), got {tp!r}")
    return MoeShape(shapes.MOE_EXPERTS, shapes.MOE_TOPK, shapes.MOE_HIDDEN, shapes.MOE_INTER // tp, tp)


def weight_bytes(shape: MoeShape, experts_hit: float, scale_bytes: int = 1) -> float:
    """Bytes of the packed weights and scales of ``experts_hit`` experts: the weight floor's numerator."""
    per = 3 * shape.hidden * shape.inter // 2 + 3 * shape.hidden * shape.inter // 32 * scale_bytes
    return experts_hit * per


def floor_summary(times_us: Dict[str, Optional[float]], floor_us: float, ours: str = "ours") -> Dict[str, Any]:
    """Per timed name: % of the weight floor (floor / time); and ``<name>_over_ours`` = name's time / ours'
    (> 1: ours is faster by that factor; the issue's target is >= 1.3 against Marlin). None where a time is
    missing."""
    out: Dict[str, Any] = {}
    t_ours = times_us.get(ours)
    for name, us in times_us.items():
        out[f"{name}_pct_floor"] = 100.0 * floor_us / us if us else None
        if name != ours:
            out[f"{name}_over_ours"] = us / t_ours if us and t_ours else None
    return out


@dataclass
class MoeCompetitor:
    name: str
    origin: str
    reason: str = ""                                  # why it cannot run here ("" when it can)
    prepare_fn: Optional[Callable[[dict], Any]] = None
    bind_fn: Optional[Callable[..., Callable[[], Any]]] = None
    notes: List[str] = field(default_factory=list)

    @property
    def short(self) -> str:
        return SHORT.get(self.name, self.name)

    @property
    def available(self) -> bool:
        return not self.reason and self.prepare_fn is not None and self.bind_fn is not None

    def prepare(self, weights: dict) -> "PreparedMoe":
        """SGLang's weight preparation on ``weights`` (once per weight set: seconds, GiBs of copies)."""
        if not self.available:
            raise RuntimeError(f"{self.name} cannot run here: {self.reason or 'not loaded'}")
        _check_weights(weights)
        return PreparedMoe(self, self.prepare_fn(weights))


@dataclass
class PreparedMoe:
    competitor: MoeCompetitor
    state: Any

    def bind(self, x, topk_weights, topk_ids) -> Callable[[], Any]:
        """The zero-argument call (what is timed); per-call inputs in SGLang's forms are built here, outside it."""
        return self.competitor.bind_fn(self.state, x, topk_weights, topk_ids)

    def run(self, x, topk_weights, topk_ids):
        return self.bind(x, topk_weights, topk_ids)()


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _check_weights(w: dict) -> None:
    import torch

    for k in ("w13", "w13_scale", "w2", "w2_scale"):
        if k not in w:
            raise ValueError(f"weights must hold {k!r} (our fp4_moe's packed experts), got keys {sorted(w)}")
    for k in ("w13", "w2"):
        if w[k].dtype not in (torch.uint8, torch.int8) or w[k].dim() != 3:
            raise ValueError(f"weights[{k!r}] must be uint8 / int8 [E, N, K/2] packed e2m1, got {w[k].dtype} "
                             f"{tuple(w[k].shape)}")
    for k in ("w13_scale", "w2_scale"):
        if w[k].dtype not in (torch.uint8, torch.float8_e8m0fnu):
            raise ValueError(f"weights[{k!r}] must be uint8 UE8M0 bits or float8_e8m0fnu (the checkpoint's scales), "
                             f"got {w[k].dtype}")
    E, N2, Kh = w["w13"].shape
    if tuple(w["w2"].shape) != (E, 2 * Kh, N2 // 4):
        raise ValueError(f"weights['w2'] must be [E, H, I/2] = {(E, 2 * Kh, N2 // 4)} for w13 {tuple(w['w13'].shape)}, "
                         f"got {tuple(w['w2'].shape)}")


def _e8m0(s):
    import torch

    return s if s.dtype == torch.float8_e8m0fnu else s.view(torch.float8_e8m0fnu)


def _capability() -> Tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


def _gpu_text(cap) -> str:
    return f"this GPU is sm_{cap[0]}{cap[1]}" if cap[0] else "no CUDA GPU here"


def _allow_jit(allow_jit) -> str:
    """"all", "small" (SGLang's JIT modules other than HEAVY_JIT) or "" from the argument (True / False / "small")
    or, for None, from DSV4_BENCH_ALLOW_SGLANG_JIT ("1" / "small")."""
    if allow_jit is None:
        from deepseek_v4_kernel.switches import choice

        allow_jit = {"1": True, "small": "small"}.get(choice(ALLOW_JIT_ENV, ALLOW_JIT_VALUES, "0"), False)
    return "small" if allow_jit == "small" else "all" if allow_jit else ""


# ----------------------------------------------------------------------------- SGLang's JIT modules
class WouldCompile(Exception):
    """Raised by the stand-in of tvm-ffi's compile entry points: the module is not in the cache."""


def probe_jit(entries=MARLIN_JIT) -> Dict[str, Tuple[str, str]]:
    """Load each SGLang JIT module from the tvm-ffi cache without compiling: {builder: (state, detail)}, state
    "loaded", "would compile" (not in the cache), "absent" (this SGLang has no such builder: its path does not use
    it) or "failed". tvm-ffi's ``load_inline`` / ``load`` (which SGLang's load_jit calls only when no built .so is in
    the cache) are replaced by a stand-in that raises for the duration of the probe; SGLang's cache_once keeps no
    failure, so a later real call (when compiling is allowed) builds the module."""
    import torch

    try:
        cpp = importlib.import_module("tvm_ffi.cpp")
    except Exception as e:  # noqa: BLE001
        return {b: ("failed", f"tvm-ffi is not importable ({_why(e)})") for _, b, _, _ in entries}

    def refuse(name, *a, **k):
        raise WouldCompile(f"{name} is not in the tvm-ffi cache {k.get('build_directory') or ''}".strip())

    out: Dict[str, Tuple[str, str]] = {}
    saved = {n: getattr(cpp, n, None) for n in ("load_inline", "load")}
    cpp.load_inline, cpp.load = refuse, refuse
    try:
        for mod, builder, args, _ in entries:
            try:
                fn = getattr(importlib.import_module(mod), builder)
            except (ImportError, AttributeError) as e:
                out[builder] = ("absent", _why(e))
                continue
            try:
                fn(*args(torch))
                out[builder] = ("loaded", "")
            except WouldCompile as e:
                out[builder] = ("would compile", str(e))
            except Exception as e:  # noqa: BLE001
                out[builder] = ("failed", _why(e))
    finally:
        for n, f in saved.items():
            if f is not None:
                setattr(cpp, n, f)
    return out


def jit_verdict(status: Dict[str, Tuple[str, str]], allow_jit) -> Tuple[str, List[str]]:
    """(reason the Marlin path cannot run, "" if it can; notes) from probe_jit's answer; ``allow_jit``: "all",
    "small" (compiling all but HEAVY_JIT) or "" (nothing; bools accepted)."""
    allow = allow_jit if allow_jit in ("all", "small", "") else ("all" if allow_jit else "")
    failed = {b: d for b, (s, d) in status.items() if s == "failed"}
    compile_ = [b for b, (s, _) in status.items() if s == "would compile"]
    refused = [b for b in compile_ if not allow or (allow == "small" and b in HEAVY_JIT)]
    if failed:
        return "SGLang's JIT modules do not load: " + "; ".join(f"{b}: {d}" for b, d in failed.items()), []
    if refused:
        heavy = any(b in HEAVY_JIT for b in refused)
        return (f"SGLang would JIT-compile {', '.join(refused)} first (not in {jit_cache_dir()}; "
                + ("~5 min of nvcc for moe_wna16_marlin" if heavy else "tens of seconds of nvcc")
                + f"): prebuild them (tools/e2e/prebuild_jit.py; run_e2e.py prepare installs them) or allow "
                  f"compiling ({ALLOW_JIT_ENV}=1, or =small for all but moe_wna16_marlin; --allow-jit)"), []
    notes = [f"compiles on first use: {', '.join(compile_)}"] if compile_ else []
    notes += [f"{b} absent from this SGLang ({d})" for b, (s, d) in status.items() if s == "absent"]
    return "", notes


def jit_cache_dir() -> str:
    return os.path.expanduser(os.environ.get("TVM_FFI_CACHE_DIR", "~/.cache/tvm-ffi"))


# ----------------------------------------------------------------------------- Marlin
class _BaseFp4Step:
    """Stands for Fp8MoEMethod.process_weights_after_loading, which for MXFP4 experts on the Marlin runner only
    views the weights as int8 (0.5.17 fp8.py, ``if get_moe_runner_backend().is_marlin(): ... view(torch.int8)``):
    the layer below holds int8 views already."""

    def process_weights_after_loading(self, layer) -> None:
        return None


def _runner_config(w: dict, E: int, H: int, inter: int, topk: int):
    import torch

    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig

    return MoeRunnerConfig(num_experts=E, num_local_experts=E, hidden_size=H, intermediate_size_per_partition=inter,
                           top_k=topk, params_dtype=torch.bfloat16, activation="silu", is_gated=True,
                           routed_scaling_factor=w.get("routed_scaling_factor"), swiglu_limit=w.get("swiglu_limit"))


def _layer(E: int, H: int, inter: int, cfg, params: Dict[str, Any]):
    """The attributes of SGLang's FusedMoE that the methods read, holding ``params`` (int8 / e8m0 views)."""
    import torch

    layer = torch.nn.Module()
    for name, t in params.items():
        layer.register_parameter(name, torch.nn.Parameter(t, requires_grad=False))
    layer.hidden_size, layer.intermediate_size_per_partition = H, inter
    layer.num_experts = layer.num_local_experts = E
    layer.moe_runner_config = cfg
    layer.moe_tp_size, layer.moe_tp_rank, layer.moe_ep_size, layer.moe_ep_rank = 1, 0, 1, 0
    layer.dispatcher = types.SimpleNamespace(local_expert_mapping=None, num_experts=E)   # no EP
    return layer


def _marlin_prepare(w: dict):
    import torch

    from sglang.srt.layers.quantization.mxfp4_marlin_moe import Mxfp4MarlinMoEMethod

    E, N2, Kh = w["w13"].shape
    inter, H, topk = N2 // 2, 2 * Kh, w.get("topk", shapes.MOE_TOPK)
    cfg = _runner_config(w, E, H, inter, topk)
    layer = _layer(E, H, inter, cfg, {
        "w13_weight": w["w13"].view(torch.int8), "w2_weight": w["w2"].view(torch.int8),
        "w13_weight_scale_inv": _e8m0(w["w13_scale"]), "w2_weight_scale_inv": _e8m0(w["w2_scale"])})
    method = Mxfp4MarlinMoEMethod(_BaseFp4Step(), prefix="dsv4_bench.experts")
    method.create_moe_runner(layer, cfg)
    method.process_weights_after_loading(layer)   # SGLang's repack into new tensors; ours stay as they are
    return method, layer, w.get("routed_scaling_factor")


def _dispatch(x, topk_weights, topk_ids, E: int):
    import torch

    from sglang.srt.layers.moe.token_dispatcher.standard import StandardDispatchOutput
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    # SGLang's top-k gives int32 ids and fp32 weights; the router logits are only checked for their row count
    logits = torch.empty(x.shape[0], E, dtype=torch.bfloat16, device=x.device)
    topk = StandardTopKOutput(topk_weights=topk_weights.float().contiguous(),
                              topk_ids=topk_ids.to(torch.int32).contiguous(), router_logits=logits)
    return StandardDispatchOutput(hidden_states=x.contiguous(), hidden_states_scale=None, topk_output=topk)


def _marlin_bind(state, x, topk_weights, topk_ids):
    method, layer, rsf = state
    d = _dispatch(x, topk_weights, topk_ids, layer.num_experts)

    def call():
        out = method.apply(layer, d).hidden_states
        if rsf is not None and rsf != 1.0:
            out.mul_(rsf)   # the model's final_hidden_states *= routed_scaling_factor (not fused for Marlin)
        return out
    return call


def _marlin(allow_jit: str) -> MoeCompetitor:
    c = MoeCompetitor(MARLIN, "sglang.srt.layers.quantization.mxfp4_marlin_moe")
    cap = _capability()
    if cap[0] not in (9, 12):
        c.reason = (f"SGLang's Mxfp4MarlinMoEMethod runs on SM90 and SM120 only ('MXFP4 Marlin requires SM90 or "
                    f"SM120.'); {_gpu_text(cap)}")
        return c
    if importlib.util.find_spec("sglang") is None:
        c.reason = "SGLang is not installed here (the Marlin runner is SGLang's own code)"
        return c
    try:
        importlib.import_module("sglang.srt.layers.quantization.mxfp4_marlin_moe")
        importlib.import_module("sglang.srt.layers.moe.token_dispatcher.standard")
    except Exception as e:  # noqa: BLE001
        c.reason = f"SGLang's Marlin MXFP4 runner does not import here ({_why(e)})"
        return c
    c.reason, c.notes = jit_verdict(probe_jit(), allow_jit)
    if c.reason:
        return c
    c.prepare_fn, c.bind_fn = _marlin_prepare, _marlin_bind
    return c


# ----------------------------------------------------------------------------- FlashInfer (flashinfer_mxfp4)
def _flashinfer_prepare(w: dict):
    import torch

    from sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe import Mxfp4FlashinferCutlassMoEMethod

    E, N2, Kh = w["w13"].shape
    inter, H, topk = N2 // 2, 2 * Kh, w.get("topk", shapes.MOE_TOPK)
    if H % 128 or inter % 128:
        raise NotApplicable(f"SGLang's FlashInfer CUTLASS MXFP4 method needs hidden and I multiples of 128, got "
                            f"{H} / {inter}")
    cfg = _runner_config(w, E, H, inter, topk)

    def up_gate(t):   # the loader's [up; gate] order for this method (load_up_proj_weight_first); new tensors
        return torch.cat([t[:, inter:], t[:, :inter]], 1).contiguous()
    layer = _layer(E, H, inter, cfg, {
        "w13_weight": up_gate(w["w13"].view(torch.int8)), "w2_weight": w["w2"].view(torch.int8),
        "w13_weight_scale_inv": _e8m0(up_gate(w["w13_scale"])),
        "w2_weight_scale_inv": _e8m0(w["w2_scale"]).clone()})   # the SM120 path interleaves the scales in place
    method = Mxfp4FlashinferCutlassMoEMethod(_BaseFp4Step(), prefix="dsv4_bench.experts")
    method.create_moe_runner(layer, cfg)
    method.process_weights_after_loading(layer)
    return method, layer, w.get("routed_scaling_factor")


def _flashinfer_bind(state, x, topk_weights, topk_ids):
    import torch
    from flashinfer.fused_moe import cutlass_fused_moe
    from flashinfer.fused_moe.core import ActivationType

    method, layer, rsf = state
    sm120 = method._mxfp4_weight_global_scale_tensor is not None
    gs = method._mxfp4_weight_global_scale_tensor
    ids, tw = topk_ids.to(torch.int32).contiguous(), topk_weights.float().contiguous()
    M, H = x.shape
    s13, s2 = layer.w13_weight_scale_inv.view(torch.int32), layer.w2_weight_scale_inv.view(torch.int32)
    if sm120:
        from flashinfer import mxfp8_quantize

        fc1, fc2, scales = layer.w13_weight.view(torch.int64), layer.w2_weight.view(torch.int64), [s13, gs, s2, gs]
    else:
        fc1, fc2, scales = layer.w13_weight, layer.w2_weight, [s13, s2]
    tune = 1 << max(0, (M - 1).bit_length())   # next_power_of_2(M)

    def call():
        xin, sf = mxfp8_quantize(x, is_sf_swizzled_layout=True, alignment=32) if sm120 else (x, None)
        out = torch.empty(M, H, dtype=torch.bfloat16, device=x.device)
        cutlass_fused_moe(input=xin, token_selected_experts=ids, token_final_scales=tw, fc1_expert_weights=fc1,
                          fc2_expert_weights=fc2, output_dtype=torch.bfloat16, quant_scales=scales, input_sf=sf,
                          fc1_expert_biases=None, fc2_expert_biases=None, swiglu_alpha=None, swiglu_beta=None,
                          swiglu_limit=method._swiglu_limit_tensor, tp_size=1, tp_rank=0, ep_size=1, ep_rank=0,
                          use_w4_group_scaling=not sm120, use_mxfp8_act_scaling=sm120,
                          activation_type=ActivationType.Swiglu, tune_max_num_tokens=tune, output=out)
        if rsf is not None and rsf != 1.0:
            out.mul_(rsf)
        return out
    return call


def _flashinfer(name: str, major: int, allow_jit: str) -> MoeCompetitor:
    c = MoeCompetitor(name, "sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe + flashinfer.fused_moe")
    cap = _capability()
    arch = "sm_120" if major == 12 else "sm_90"
    if cap[0] != major:
        c.reason = f"cannot run on this GPU: this FlashInfer MoE kernel is built for {arch} only; {_gpu_text(cap)}"
        return c
    for mod, what in (("flashinfer.fused_moe", "FlashInfer"),
                      ("sglang.srt.layers.quantization.mxfp4_flashinfer_cutlass_moe", "SGLang's flashinfer_mxfp4 "
                                                                                      "method")):
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001
            c.reason = f"{what} does not import here ({_why(e)})"
            return c
    spec_fn = "gen_cutlass_fused_moe_sm120_module" if major == 12 else "gen_cutlass_fused_moe_sm90_module"
    try:
        built = getattr(importlib.import_module("flashinfer.jit.fused_moe"), spec_fn)(False).is_compiled
    except Exception as e:  # noqa: BLE001
        built, c.notes = False, [f"cannot tell whether {spec_fn} is built ({_why(e)})"]
    if not built and allow_jit != "all":
        c.reason = (f"FlashInfer would JIT-compile {spec_fn} first (many minutes of nvcc); allow it with "
                    f"{ALLOW_JIT_ENV}=1 / --allow-jit")
        return c
    c.prepare_fn, c.bind_fn = _flashinfer_prepare, _flashinfer_bind
    return c


# ----------------------------------------------------------------------------- discovery
def moe_competitors(allow_jit=None, include: Tuple[str, ...] = ("marlin", "flashinfer_sm120",
                                                                                  "flashinfer_sm90")
                    ) -> List[MoeCompetitor]:
    """SGLang's MXFP4 MoE runners for this process and GPU (``include``: their short names), runnable or not
    (``reason``); never raises for a competitor's failure. ``allow_jit``: True / False / "small" (SGLang's JIT
    modules but moe_wna16_marlin); None reads DSV4_BENCH_ALLOW_SGLANG_JIT."""
    allow = _allow_jit(allow_jit)
    bad = [n for n in include if n not in SHORT.values()]
    if bad:
        raise ValueError(f"include must name competitors among {', '.join(SHORT.values())}, got {', '.join(bad)}")
    build = {"marlin": lambda: _marlin(allow), "flashinfer_sm120": lambda: _flashinfer(FLASHINFER_SM120, 12, allow),
             "flashinfer_sm90": lambda: _flashinfer(FLASHINFER_SM90, 9, allow)}
    out = []
    for short in include:
        try:
            out.append(build[short]())
        except Exception as e:  # noqa: BLE001  (a bug in one loader costs that competitor, not the run)
            name = {v: k for k, v in SHORT.items()}[short]
            out.append(MoeCompetitor(name, __name__, reason=f"discovery failed: {_why(e)}"))
    return out


# ----------------------------------------------------------------------------- python -m deepseek_v4_kernel bench
@dataclass
class UserBenchEntry:
    """A MoeCompetitor in bench/runner.py's competitor form (the attributes runner.run_op and report read)."""
    op: str
    name: str
    origin: str
    role: str
    prepare: Optional[Callable[[Dict[str, Any]], Callable[[], Any]]] = None
    reason: str = ""
    same_as: str = ""

    @property
    def runnable(self) -> bool:
        return self.prepare is not None and not self.reason and not self.same_as


def user_bench_competitors(allow_jit: bool = False, include: Tuple[str, ...] = ("marlin",)) -> List[UserBenchEntry]:
    """Marlin (by default; FlashInfer's flashinfer_mxfp4 paths are patch/competitors.py's there) for the fp4_moe op
    of the user bench. Its ``prepare(inputs)`` prepares SGLang's weights once per weight set (the bench's sets share
    one; a new one replaces it) and returns the bound call."""
    out = []
    for c in moe_competitors(allow_jit=allow_jit or None, include=include):
        e = UserBenchEntry("fp4_moe", c.name, c.origin, "sglang", reason=c.reason)
        if c.available:
            e.prepare = _user_bench_prepare(c)
        out.append(e)
    return out


def _user_bench_prepare(c: MoeCompetitor):
    held: Dict[str, Any] = {}

    def prepare(a):
        key = (id(a["w13"]), a["w13"].data_ptr())
        if held.get("key") != key:
            held.clear()   # one weight set at a time (GiBs)
            held["key"] = key
            held["p"] = c.prepare({k: a[k] for k in ("w13", "w13_scale", "w2", "w2_scale")}
                                  | {"swiglu_limit": a.get("swiglu_limit"), "routed_scaling_factor": None})
        return held["p"].bind(a["x"], a["topk_weights"], a["topk_ids"])
    return prepare
