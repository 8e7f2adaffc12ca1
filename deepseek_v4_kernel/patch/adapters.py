"""SGLang's call signatures mapped onto our ops: what the target table (targets.py) puts in SGLang's place.

Every replacement the table names lives here, so that ``deepseek_v4_kernel.ops`` knows no serving engine: the
functions below either re-export an op under the API SGLang calls (FlashMLA's and DeepGEMM's own signatures, which
other engines call too) or adapt one of SGLang's own signatures (its SM120 dispatcher, its torch / TileLang indexer
fallbacks, its DeepGEMM wrapper, ``Fp8MoEMethod.apply``, ``MqaAttentionBase._kernel_num_heads``). A case an op does
not cover raises ``UnsupportedCase``; the patch layer then calls SGLang's original (hook.make_replacement).
Importing this module registers SGLang's deterministic-inference switch with the ops that have a faster
non-deterministic path (hc_prenorm's atomic sums).
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os

import torch

from deepseek_v4_kernel.errors import ExtensionUnavailable, UnsupportedCase
from deepseek_v4_kernel.ops import hc_prenorm as _hc
from deepseek_v4_kernel.ops._device import extension_error as _extension_error
from deepseek_v4_kernel.ops.fp4_moe import fp4_moe
from deepseek_v4_kernel.ops.hc_prenorm import hc_prenorm_gemm
from deepseek_v4_kernel.ops.indexer_logits import (  # noqa: F401  (DeepGEMM's indexer API)
    fp8_mqa_logits, fp8_paged_mqa_logits, get_paged_mqa_logits_metadata, paged_mqa_logits)
from deepseek_v4_kernel.ops.sparse_decode import flash_mla_with_kvcache  # noqa: F401  (FlashMLA's API)

from . import measured

# ----------------------------------------------------------------------------- hc_prenorm
# set in SGLang's workers by --enable-deterministic-inference
SGLANG_DETERMINISTIC_ENV = "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"


def sglang_deterministic_inference() -> bool:
    """SGLang's deterministic-inference switch, truthy as SGLang's EnvBool reads it."""
    return os.environ.get(SGLANG_DETERMINISTIC_ENV, "").strip().lower() in ("1", "true", "yes", "y", "on")


if sglang_deterministic_inference not in _hc.DETERMINISTIC_SOURCES:
    _hc.DETERMINISTIC_SOURCES.append(sglang_deterministic_inference)


def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None):
    """``deep_gemm.tf32_hc_prenorm_gemm`` (DeepGEMM's signature), with measured dispatch's per-size choice (DeepGEMM's
    own kernel, its SM120 port from sgl-deep-gemm 0.1.5, where it was measured faster)."""
    if a.shape[0] > 0:
        measured.check("hc_prenorm", measured.size_class("hc_prenorm", a.shape[0]), original="deep_gemm")
    return _hc.tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits)


def sglang_tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_splits):
    """``sglang.srt.layers.deep_gemm_wrapper.entrypoint.tf32_hc_prenorm_gemm``
    (0.5.17 .. 0.5.23: positional ``(x, fn, out, sqrsum, num_splits)``, no default;
    returns None, m == 0 returns before any check)."""
    if x.shape[0] == 0:
        return None
    # (not "deep_gemm": SGLang's wrapper binds deep_gemm only with its JIT on, which SM120 need not have; a class
    # DeepGEMM won is kept at deep_gemm.tf32_hc_prenorm_gemm itself, the row above, never handed to this wrapper)
    measured.check("hc_prenorm", measured.size_class("hc_prenorm", x.shape[0]), original="sglang_entrypoint")
    return hc_prenorm_gemm(x, fn, out, sqrsum, num_splits)


# the rows of the mhc_pre call in progress (mhc_pre below), for use_deep_gemm_hc_prenorm, which SGLang asks without them
_MHC_PRE_ROWS: contextvars.ContextVar = contextvars.ContextVar("dsv4_mhc_pre_rows", default=None)
_kept_said = set()


def mhc_pre(original, residual, *args, **kwargs):
    """Wraps SGLang 0.5.21-0.5.23's ``sglang.kernels.ops.layernorm.mhc.mhc_pre`` (its SM120 mHC pre step): SGLang's own
    function runs, told the call's rows, so that ``use_deep_gemm_hc_prenorm`` keeps SGLang's TileLang split-K
    pre-GEMM in a size class where that kernel was measured faster (measured.BUILTIN_KEEP) and takes ours elsewhere."""
    shape = getattr(residual, "shape", ())
    rows = residual.numel() // (shape[-1] * shape[-2]) if len(shape) >= 2 and shape[-1] * shape[-2] else None
    token = _MHC_PRE_ROWS.set(rows)
    try:
        return original(residual, *args, **kwargs)
    finally:
        _MHC_PRE_ROWS.reset(token)


mhc_pre.__dsv4_wraps_original__ = True


def use_deep_gemm_hc_prenorm() -> bool:
    """Replacement for SGLang 0.5.21-0.5.23's ``sglang.kernels.ops.layernorm.mhc._use_deep_gemm_hc_prenorm``.

    SGLang's version also requires ``ENABLE_JIT_DEEPGEMM``, which is False on SM120, so the
    DeepGEMM pre-norm GEMM (ours, once patched) is never chosen there. This keeps SGLang's own
    flag and ROCm check, and asks only that ``deep_gemm`` be importable: one caller (the fused
    post/pre step, 0.5.23 mhc.py:1746, 0.5.21 / 0.5.22 mhc.py:1769) does ``import deep_gemm``
    itself, and the patch layer replaces ``deep_gemm.tf32_hc_prenorm_gemm`` when it is imported.
    Without ``deep_gemm`` the answer is False and SGLang keeps its own path: slower, never a crash.
    """
    import importlib.util

    from sglang.srt.environ import envs
    from sglang.srt.utils import is_hip

    if is_hip() or not envs.SGLANG_OPT_DEEPGEMM_HC_PRENORM.get():
        return False
    if importlib.util.find_spec("deep_gemm") is None:
        return False
    rows = _MHC_PRE_ROWS.get()
    if rows:   # inside mhc_pre: its TileLang split-K kernel (up to 2048 rows) stays where it was measured faster
        why = measured.builtin_keep("hc_prenorm", measured.size_class("hc_prenorm", rows), "tilelang_mhc_pre")
        if why and rows <= MHC_PRE_TILELANG_SPLITK_MAX_ROWS:
            if why not in _kept_said:
                _kept_said.add(why)
                logging.getLogger("deepseek_v4_kernel").info(
                    "deepseek_v4_kernel: hc_prenorm: keeping SGLang's mhc_pre pre-GEMM for this size: %s", why)
            return False
    return True


# SGLang 0.5.21-0.5.23's mhc_pre runs its split-K TileLang kernel up to this many rows (one split above)
MHC_PRE_TILELANG_SPLITK_MAX_ROWS = 2048


# ----------------------------------------------------------------------------- fp4_moe
def _err(msg):
    raise UnsupportedCase(f"fp4_moe: {msg}")


def fp8_moe_method_apply(self, layer, dispatch_output):
    """Drop-in for ``Fp8MoEMethod.apply(self, layer, dispatch_output) -> CombineInput`` of
    ``sglang.srt.layers.quantization.fp8`` (SGLang 0.5.12+), for DeepSeek-V4's MXFP4 experts on
    the Triton MoE runner. There SGLang hands the packed e2m1 bytes to its fp8 Triton kernel,
    which stops with "Hidden size mismatch" (hidden vs hidden/2): on SM120 that is the default
    path of 0.5.12-0.5.15.post1, and the path of any later version run with
    ``--moe-runner-backend triton`` (docs/sglang_surface.md has the evidence).

    Reads SGLang's own parameters as its loader left them (w13_weight int8 [E, 2I, hidden/2] =
    [gate; up], w13_weight_scale_inv float32 powers of two [E, 2I, hidden/32], w2 likewise), so
    routing, weight loading and expert placement stay SGLang's; applies the runner config the way
    SGLang's Triton runner does (swiglu_limit clamp, routed_scaling_factor on the sum). Any other
    case raises UnsupportedCase and the patch layer calls the original method.
    """
    if not getattr(self, "is_fp4_expert", False):
        _err("Fp8MoEMethod.apply: the layer's experts are not MXFP4 (is_fp4_expert is False)")
    backend = getattr(getattr(self, "runner", None), "runner_backend", None)
    if backend is None or not backend.is_triton():
        _err(f"Fp8MoEMethod.apply: MoE runner backend is {getattr(backend, 'name', backend)}, not triton")
    fmt = getattr(dispatch_output, "format", None)
    if fmt is not None and hasattr(fmt, "is_standard") and not fmt.is_standard():
        _err(f"Fp8MoEMethod.apply: dispatch output format {fmt} is not the standard one")
    if getattr(dispatch_output, "hidden_states_scale", None) is not None:
        _err("Fp8MoEMethod.apply: hidden_states arrive quantised (hidden_states_scale is set); bf16 expected")
    cfg = self.moe_runner_config
    if getattr(cfg, "activation", "silu") != "silu" or not getattr(cfg, "is_gated", True):
        _err(f"Fp8MoEMethod.apply: activation {getattr(cfg, 'activation', None)!r} "
             f"(gated={getattr(cfg, 'is_gated', None)}) unsupported; gated silu expected")
    if getattr(cfg, "apply_router_weight_on_input", False) or getattr(cfg, "no_combine", False):
        _err("Fp8MoEMethod.apply: apply_router_weight_on_input / no_combine unsupported")
    if getattr(cfg, "gemm1_alpha", None) is not None or getattr(cfg, "gemm1_clamp_limit", None) is not None:
        _err("Fp8MoEMethod.apply: gemm1_alpha / gemm1_clamp_limit (GPT-OSS style SwiGLU) unsupported")
    if getattr(layer, "w13_weight_bias", None) is not None or getattr(layer, "w2_weight_bias", None) is not None:
        _err("Fp8MoEMethod.apply: expert biases unsupported")
    topk_output = dispatch_output.topk_output
    topk_weights = getattr(topk_output, "topk_weights", None)
    topk_ids = getattr(topk_output, "topk_ids", None)
    if topk_weights is None or topk_ids is None:
        _err(f"Fp8MoEMethod.apply: top-k output {type(topk_output).__name__} has no topk_weights/topk_ids")
    out = fp4_moe(dispatch_output.hidden_states, layer.w13_weight, layer.w13_weight_scale_inv,
                  layer.w2_weight, layer.w2_weight_scale_inv, topk_weights, topk_ids,
                  swiglu_limit=getattr(cfg, "swiglu_limit", None),
                  routed_scaling_factor=getattr(cfg, "routed_scaling_factor", None))
    from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

    return StandardCombineInput(hidden_states=out)


# ----------------------------------------------------------------------------- sparse decode
OP_SPARSE_DECODE = "sparse_decode"


def flash_mla_with_kvcache_sm120(**kwargs):
    """Drop-in for SGLang's ``flash_mla_with_kvcache_sm120(**kwargs)`` (0.5.13+; keywords q, k_cache,
    head_dim_v, softmax_scale, indices, topk_length, attn_sink, extra_k_cache,
    extra_indices_in_kvcache, extra_topk_length; other FlashMLA keywords tolerated)."""
    kw = dict(kwargs)
    kw.setdefault("is_fp8_kvcache", True)
    q = kw.get("q")
    if q is not None and q.dim() == 4 and q.shape[0] * q.shape[1] > 0:
        label = measured.size_class(OP_SPARSE_DECODE, q.shape[0] * q.shape[1], heads=q.shape[2])
        measured.check(OP_SPARSE_DECODE, label, original=sglang_sm120_sparse_decode_backend())
    return flash_mla_with_kvcache(**kw)


def sglang_sm120_sparse_decode_backend():
    """The path SGLang's own SM120 dispatcher takes (its module's ``_sm120_default_backend``: "flashinfer", "triton" or
    "torch"; 0.5.13-0.5.14 read SGLANG_SM120_TRITON_FLASHMLA instead, Triton by default)."""
    import sys

    for name in ("sglang.kernels.ops.attention.flash_mla_sm120", "sglang.srt.layers.attention.flash_mla_sm120"):
        backend = getattr(sys.modules.get(name), "_sm120_default_backend", None)
        if backend:
            if backend == "flashinfer" and not _flashinfer_sparse_mla_present():
                return "flashinfer (its SM120 module missing)"   # no rule keeps a kernel that is not there
            return str(backend)
    return "triton"


@functools.lru_cache(maxsize=1)
def _flashinfer_sparse_mla_present() -> bool:
    from .targets import _flashinfer_has_sm120_sparse_mla

    return _flashinfer_has_sm120_sparse_mla()


# ----------------------------------------------------------------------------- unpadded query heads
# SGLang 0.5.20+ pads decode q (<= SM120_DECODE_MAX_TOKENS = 64 tokens) under attention TP to 64 heads on SM120
# unless FlashInfer's native kernel takes the rank's head count (MqaAttentionBase._kernel_num_heads): FlashMLA's
# kernels specialise h_q for 64 / 128. Ours takes any h_q, and a padded call costs it a 64-head launch for 8 / 16
# / 32 real heads (docs/sparse_decode.md, "Unpadded query heads"). The patch layer replaces that method while
# SGLang's SM120 sparse decode is ours (targets.py, condition sm120_sparse_decode_is_ours).
@functools.lru_cache(maxsize=None)
def _unpadded_heads_blocker(device_index: int) -> str:
    """"" when the sparse decode SGLang calls on this GPU is ours and runs there; else why q stays padded."""
    major, minor = torch.cuda.get_device_capability(device_index)
    if major != 12:
        # (the DSV4_KERNEL_FORCE testing mode) SGLang calls FlashMLA there, whose kernels need 64 / 128 heads
        return f"GPU {device_index} is sm_{major}{minor}, not SM12x: SGLang does not call the SM120 sparse decode"
    try:
        why = _extension_error(torch.device("cuda", device_index))
    except ExtensionUnavailable as e:
        why = str(e)
    return why or ""


def kernel_num_heads(self, num_tokens):
    """Replaces SGLang's ``MqaAttentionBase._kernel_num_heads(num_tokens)`` (0.5.20+) where SGLang's SM120
    sparse decode is ours: the query heads of this rank (``self.n_local_heads``), never padded to 64. Raises
    UnsupportedCase (the patch layer then runs SGLang's own method, which pads) where our kernel would not run
    the call: no CUDA device, a GPU other than SM12x, or one the extension has no kernel for; then SGLang's own
    sparse decode gets the padded q it was written for. Cached per device: no query after the first call."""
    if not torch.cuda.is_available():
        raise UnsupportedCase(f"{OP_SPARSE_DECODE}: q stays padded to 64 heads: no CUDA device")
    why = _unpadded_heads_blocker(torch.cuda.current_device())
    if why:
        raise UnsupportedCase(f"{OP_SPARSE_DECODE}: q stays padded to 64 heads: {why}")
    if isinstance(num_tokens, int) and num_tokens > 0:   # where SGLang's kernel runs this class, it pads as it would
        measured.check(OP_SPARSE_DECODE, measured.size_class(OP_SPARSE_DECODE, num_tokens, heads=self.n_local_heads),
                       original=sglang_sm120_sparse_decode_backend())
    return self.n_local_heads


# ----------------------------------------------------------------------------- indexer logits
# SGLang fallback signature (fp8_paged_mqa_logits_torch / _torch_sm120 / tilelang_fp8_paged_mqa_logits)
def fp8_paged_mqa_logits_sglang_fallback(q_fp8, kvcache_fp8, weight, seq_lens, page_table,
                                         deep_gemm_metadata, max_seq_len, clean_logits=True):
    """Drop-in for SGLang's fallbacks. Accepts seq_lens [b] or [b, 1]. Always writes -inf past
    each row's length (what ``fp8_paged_mqa_logits_torch_sm120`` returns; every caller masks by
    length anyway), whatever ``clean_logits`` says (callers pass False)."""
    if q_fp8.shape[0] > 0:
        measured.check("indexer_logits", measured.size_class("indexer_logits", q_fp8.shape[0]))
    if seq_lens.dim() == 2 and seq_lens.shape[1] == 1 and q_fp8.dim() == 4 and q_fp8.shape[1] == 1:
        seq_lens = seq_lens[:, 0]
    return paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, max_seq_len,
                            clean_logits=True)


def tilelang_fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len,
                                  clean_logits=True):
    """Replaces SGLang's TileLang paged MQA logits (its SM120 indexer from 0.5.16): ours, except where SGLang's
    TileLang kernel was measured faster (one decode row: measured.BUILTIN_KEEP), which then runs."""
    if q_fp8.shape[0] > 0:
        measured.check("indexer_logits", measured.size_class("indexer_logits", q_fp8.shape[0]), original="tilelang")
    return fp8_paged_mqa_logits_sglang_fallback(q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata,
                                                max_seq_len, clean_logits)


fp8_paged_mqa_logits_torch = fp8_paged_mqa_logits_sglang_fallback
fp8_paged_mqa_logits_torch_sm120 = fp8_paged_mqa_logits_sglang_fallback


# ----------------------------------------------------------------------------- fp8 linears, FP8 wo_a
# (their own module: the wo_a pieces share the deferred activation quantization; ops.fp8_linear is imported there at
# call time)
from .fp8_adapters import (  # noqa: E402,F401
    deep_gemm_fp8_einsum, fp8_linear_method_apply, fp8_wo_a_einsum, wo_a_quant_fp32_scales, wo_a_quant_ue8m0)

# ----------------------------------------------------------------------------- measured dispatch (patch/decisions.py)
def model_runner_load_model(original, self, *args, **kwargs):
    """Wraps SGLang's ``ModelRunner.load_model``: SGLang's own runs, then this worker decides (reads the cached
    decisions, or times ours against SGLang's kernels at this server's shapes: bench/startup.py) before SGLang sizes
    its KV cache and captures its CUDA graphs. Deciding never fails the load."""
    out = original(self, *args, **kwargs)
    from deepseek_v4_kernel.bench import startup

    startup.decide_at_model_load(self)
    return out


model_runner_load_model.__dsv4_wraps_original__ = True


def deepseek_v4_sm120_moe(original, view):
    """Wraps SGLang 0.5.16-0.5.18's resolution pass ``_deepseek_v4_sm120_moe(view)`` (it declares
    moe_runner_backend=flashinfer_mxfp4 on SM120 when the user left it "auto"): our runner where measured faster
    (patch/moe_runner.py)."""
    from . import moe_runner

    return moe_runner.apply(original(view), view)


deepseek_v4_sm120_moe.__dsv4_wraps_original__ = True


def invoke_model_override(original, fn, server_args, hf_config):
    """Wraps SGLang 0.5.19+'s ``_invoke_provider(fn, server_args, hf_config)``, which calls each model's override
    provider: for DeepSeek-V4's (``_deepseek_v4_overrides``, which declares moe_runner_backend=flashinfer_mxfp4 on SM120
    when the user left it "auto"), our runner where measured faster (patch/moe_runner.py); every other provider's
    declaration is passed through untouched."""
    declared = original(fn, server_args, hf_config)
    if getattr(fn, "__name__", "") != "_deepseek_v4_overrides":
        return declared
    from . import moe_runner

    return moe_runner.apply(declared, server_args)


invoke_model_override.__dsv4_wraps_original__ = True
