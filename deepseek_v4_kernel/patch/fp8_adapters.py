"""SGLang's block-FP8 linears and DeepSeek-V4's FP8 ``wo_a`` GEMM mapped onto ``ops.fp8_linear``.

The target table names these through ``adapters.py`` (which re-exports them); they live apart because they share
state (the deferred ``wo_a`` activation quantization below). ``deepseek_v4_kernel.ops.fp8_linear`` is imported at
call time, so this module imports without it. Evidence for every call signature: docs/sglang_surface.md,
"Block-FP8 linears" and "FP8 wo_a".

* ``fp8_linear_method_apply`` replaces ``Fp8LinearMethod.apply(self, layer, x, bias=None)`` (0.5.12+). That is
  where every DeepSeek-V4 dense FP8 linear goes whatever ``--fp8-gemm-backend`` resolved to (the backend is only
  the ``self.w8a8_block_fp8_linear`` it calls), and where the activation is still bf16: SGLang's per-1x128-group
  quantization runs inside the backend function, so ours skips it. Up to ``FP8_LINEAR_MAX_M`` rows ours runs;
  above, and for anything ours does not cover, SGLang's own method runs (its backend, with its own quantization).
* FP8 ``wo_a`` (0.5.16-0.5.23, with ``SGLANG_OPT_FP8_WO_A_GEMM`` on): SGLang quantizes the [T, G, D] activation
  (``sglang_per_token_group_quant_fp8``, or ``..._dsv4_wo_a`` for DeepGEMM's UE8M0 recipe) and hands it to
  DeepGEMM's ``fp8_einsum("bhr,hdr->bhd", ...)`` (0.5.16-0.5.22 directly, 0.5.23 through ``_fp8_wo_a_einsum``).
  Both quantization functions are replaced (as deepseek_v4's module globals: no other caller sees them) by a
  deferral that returns the bf16 activation with a stand-in scale, and the GEMM by ours, which takes the bf16
  activation. Where ours does not take a call, the adapter rebuilds SGLang's: SGLang's quantization, then its
  GEMM where DeepGEMM runs on this GPU, else SGLang's bf16 wo_a einsum on the weight dequantized for the call
  (on SM120 without DeepGEMM's SM120 kernels SGLang's fp8_einsum cannot run; that bf16 einsum is what SGLang's
  default path computes).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import importlib.util
import sys
from typing import Callable, NamedTuple, Optional

import torch

from deepseek_v4_kernel.errors import KeepOriginal, UnsupportedCase

from . import measured

OP = "fp8_linear"

# Rows per call up to which ours runs; above it SGLang's own GEMM runs (its backend's quantization and kernel).
# PENDING: set from the H200 bench of issue 61 (ours against SGLang's Triton block-FP8 and DeepGEMM's native kernel,
# M = 1-64, both instruction classes); 64 is the top of the op's decode range, not a measured crossover yet.
FP8_LINEAR_MAX_M = 64
# The same for the FP8 wo_a grouped GEMM (against DeepGEMM's fp8_einsum where it runs, else SGLang's bf16 einsum on
# the dequantized weight). PENDING like FP8_LINEAR_MAX_M.
FP8_WO_A_MAX_M = 64
BLOCK = 128


def _op():
    """``deepseek_v4_kernel.ops.fp8_linear``, imported at call time (an absent op hands every call back)."""
    try:
        return importlib.import_module("deepseek_v4_kernel.ops.fp8_linear")
    except ImportError as e:
        raise UnsupportedCase(f"{OP}: deepseek_v4_kernel.ops.fp8_linear is not importable ({e})") from None


def _unsupported(msg: str):
    raise UnsupportedCase(msg if msg.startswith(OP) else f"{OP}: {msg}")   # (the op's own reasons name it)


# ----------------------------------------------------------------------------- Fp8LinearMethod.apply
def _block_size(self):
    """The block size the version's apply passes: ``self.weight_block_size`` (0.5.16+), else the quant config's
    (0.5.12-0.5.15 pass ``self.quant_config.weight_block_size``)."""
    if hasattr(self, "weight_block_size"):
        return self.weight_block_size
    return getattr(getattr(self, "quant_config", None), "weight_block_size", None)


def _check_block_fp8_method(self, layer) -> None:
    """The layer is a 2-D block-FP8 weight that SGLang runs through ``self.w8a8_block_fp8_linear``."""
    if getattr(self, "use_marlin", False):
        _unsupported("Fp8LinearMethod.apply: Marlin weight-only FP8 layer")
    if getattr(self, "use_mxfp8", False):
        _unsupported("Fp8LinearMethod.apply: MXFP8 checkpoint layer")
    if not getattr(self, "block_quant", False) or not _block_size(self):
        _unsupported("Fp8LinearMethod.apply: per-tensor / per-channel FP8 layer, not block-scaled")
    # 0.5.23: a 32-wide-K UE8M0 layer SGLang serves through its MXFP8 dense GEMM (FlashInfer)
    if getattr(self, "block_fp8_as_mxfp8", False) and getattr(layer, "block_fp8_mxfp8_ready", False):
        _unsupported("Fp8LinearMethod.apply: SGLang serves this layer through its MXFP8 view")
    weight = getattr(layer, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn:
        _unsupported(f"Fp8LinearMethod.apply: layer.weight must be float8_e4m3fn [N, K], got "
                     f"{getattr(weight, 'dtype', type(weight).__name__)} {list(getattr(weight, 'shape', []))}")
    if getattr(layer, "weight_scale_inv", None) is None:
        _unsupported("Fp8LinearMethod.apply: layer has no weight_scale_inv")


def fp8_linear_method_apply(self, layer, x, bias=None):
    """Drop-in for ``sglang.srt.layers.quantization.fp8.Fp8LinearMethod.apply(self, layer, x, bias=None)``
    (0.5.12-0.5.23; LinearBase.forward calls ``quant_method.apply(self, x, bias)``). For a block-FP8 layer with a
    bf16 activation of at most FP8_LINEAR_MAX_M rows: ``y = x W^T (+ bias)`` by ours on SGLang's own parameters
    (``layer.weight`` e4m3 [N, K], ``layer.weight_scale_inv`` in whatever form this SGLang stores it: fp32 block
    scales, or DeepGEMM's requantized UE8M0 form when the DeepGEMM runner is chosen; ``fp8_linear_supported``
    decides). Anything else (more rows, a pre-quantized activation tuple, Marlin / MXFP8 / per-tensor layers, a
    shape or scale form ours rejects) goes back to SGLang's method: its chosen backend with its own quantization."""
    _check_block_fp8_method(self, layer)
    if not isinstance(x, torch.Tensor):
        _unsupported(f"Fp8LinearMethod.apply: the activation arrives pre-quantized ({type(x).__name__}); "
                     f"a bf16 tensor expected")
    if x.dtype != torch.bfloat16:
        _unsupported(f"Fp8LinearMethod.apply: x must be bfloat16, got {x.dtype}")
    weight, scale = layer.weight, layer.weight_scale_inv
    n, k = weight.shape
    if x.dim() < 1 or x.shape[-1] != k:
        _unsupported(f"Fp8LinearMethod.apply: x must be [..., {k}] for weight [{n}, {k}], got {list(x.shape)}")
    m = x.numel() // k
    if m == 0:
        _unsupported("Fp8LinearMethod.apply: no rows")
    if m > FP8_LINEAR_MAX_M:
        raise KeepOriginal(f"{OP}: more than {FP8_LINEAR_MAX_M} rows (above the crossover): SGLang's block-FP8 GEMM "
                           f"runs")
    measured.check(OP, measured.size_class(OP, m))
    block = tuple(int(b) for b in _block_size(self))
    op = _op()
    ok, why = op.fp8_linear_supported(m, n, k, block, scale.dtype)
    if not ok:
        _unsupported(why)
    out = op.fp8_linear(x.reshape(m, k), weight, scale, block_size=block, bias=bias)
    return out.view(*x.shape[:-1], n)


# ----------------------------------------------------------------------------- FP8 wo_a
class _Deferred(NamedTuple):
    x: torch.Tensor        # the bf16 activation SGLang asked to quantize
    quant: Callable        # SGLang's quantization function, and its arguments: run for a hand-back
    args: tuple
    kwargs: dict


_DEFERRED: contextvars.ContextVar = contextvars.ContextVar("dsv4_wo_a_deferred_quant", default=None)
_STAND_IN_SCALES = {}   # device -> a one-element tensor; views of it stand for the scale of a deferred quantization


def _stand_in_scale(device) -> torch.Tensor:
    t = _STAND_IN_SCALES.get(device)
    if t is None:
        t = _STAND_IN_SCALES[device] = torch.zeros(1, dtype=torch.float32, device=device)
    return t


def _is_stand_in(s) -> bool:
    return (isinstance(s, torch.Tensor) and s.dtype == torch.float32
            and all(st == 0 for st, n in zip(s.stride(), s.shape) if n > 1)
            and s.data_ptr() == _stand_in_scale(s.device).data_ptr())


def _wo_a_gemm_is_ours() -> bool:
    """The GEMM SGLang calls after the quantization is our replacement (else the quantization must be real)."""
    model = sys.modules.get("sglang.srt.models.deepseek_v4")
    wrapper = getattr(model, "_fp8_wo_a_einsum", None)   # 0.5.23
    if wrapper is not None:
        return getattr(wrapper, "__dsv4_target__", None) is not None
    return getattr(getattr(sys.modules.get("deep_gemm"), "fp8_einsum", None), "__dsv4_target__", None) is not None


def _defer(original, x, args, kwargs, scale_shape):
    if not _wo_a_gemm_is_ours():
        _unsupported("wo_a: SGLang's fp8_einsum is not replaced in this process: SGLang quantizes")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or not x.is_contiguous():
        _unsupported(f"wo_a: the activation must be contiguous bfloat16, got {getattr(x, 'dtype', type(x))}")
    _DEFERRED.set(_Deferred(x, original, args, kwargs))
    return x, _stand_in_scale(x.device).expand(*scale_shape)


def wo_a_quant_fp32_scales(original, x, *args, **kwargs):
    """Replaces ``sglang_per_token_group_quant_fp8`` as deepseek_v4's module global (0.5.16-0.5.23: called only for
    wo_a, as ``(o.reshape(T * G, D).contiguous(), group_size=128, scale_ue8m0=False)``, the fp32-scale recipe
    (1, 128, 128)). Returns ``(x, stand-in scale [T * G, 1])`` for our GEMM to take the bf16 activation; SGLang then
    views them as [T, G, D] / [T, G, -1]. Any other call is SGLang's quantization."""
    group = kwargs.get("group_size", args[0] if args else None)
    extra = set(kwargs) - {"group_size", "scale_ue8m0"}
    if group != BLOCK or kwargs.get("scale_ue8m0", False) or len(args) > 1 or extra:
        _unsupported(f"wo_a: a quantization call other than wo_a's (group_size={group}, "
                     f"keywords {sorted(kwargs)}): SGLang quantizes")
    if getattr(x, "dim", lambda: 0)() != 2:
        _unsupported("wo_a: the activation must be [T * G, D]")
    return _defer(original, x, args, kwargs, (x.shape[0], 1))


wo_a_quant_fp32_scales.__dsv4_wraps_original__ = True


def wo_a_quant_ue8m0(original, x, *args, **kwargs):
    """Replaces ``sglang_per_token_group_quant_fp8_dsv4_wo_a(o)`` as deepseek_v4's module global (0.5.16-0.5.23,
    wo_a only: the UE8M0 recipe (1, 1, 128) of DeepGEMM's SM100 / SM120 builds). Returns ``(o, stand-in scale
    [T, G, 1])``."""
    if args or kwargs or getattr(x, "dim", lambda: 0)() != 3:
        _unsupported("wo_a: the UE8M0 quantization must be called as (o [T, G, D]): SGLang quantizes")
    return _defer(original, x, args, kwargs, (x.shape[0], x.shape[1], 1))


wo_a_quant_ue8m0.__dsv4_wraps_original__ = True


@functools.lru_cache(maxsize=None)
def _deep_gemm_einsum_runs(device_index: int) -> bool:
    """Whether DeepGEMM's fp8_einsum runs on this GPU: its native sm_90 / sm_100 kernels, or on SM12x where
    SGLang itself found DeepGEMM's SM120 kernels (0.5.20+: deep_gemm_wrapper.DEEPGEMM_SCALE_UE8M0)."""
    if importlib.util.find_spec("deep_gemm") is None:
        return False
    major, _ = torch.cuda.get_device_capability(device_index)
    if major != 12:
        return major in (9, 10)
    cfg = sys.modules.get("sglang.srt.layers.deep_gemm_wrapper.configurer")
    return bool(getattr(cfg, "DEEPGEMM_SCALE_UE8M0", False))


def deep_gemm_einsum_runs_on(x: torch.Tensor) -> bool:
    return x.is_cuda and _deep_gemm_einsum_runs(x.device.index if x.device.index is not None
                                                 else torch.cuda.current_device())


def wo_a_bf16_einsum(x, weight, weight_scale, out=None):
    """SGLang's bf16 wo_a einsum (``torch.einsum("tgd,grd->tgr", o, wo_a)``, its default path) on the e4m3 weight
    [G, R, D] dequantized with its fp32 block scales [G, R/128, D/128], one group at a time."""
    t, g, d = x.shape
    r = weight.shape[1]
    if weight_scale.dtype != torch.float32 or weight_scale.dim() != 3 or weight_scale.shape[0] != g:
        raise UnsupportedCase(f"{OP}: wo_a: no fallback for weight_scale {weight_scale.dtype} "
                              f"{list(weight_scale.shape)} (fp32 [G, R/128, D/128] expected)")
    res = out if out is not None else x.new_empty(t, g, r)
    for i in range(g):
        s = weight_scale[i].repeat_interleave(BLOCK, 0)[:r].repeat_interleave(BLOCK, 1)[:, :d]
        w = (weight[i].to(torch.float32) * s).to(torch.bfloat16)
        res[:, i, :] = x[:, i, :] @ w.t()
    return res


def _serve_wo_a(a, weight, weight_scale, out, sglang_gemm, not_ours: Optional[str] = None):
    """Ours on the deferred bf16 activation, or SGLang's call rebuilt (``redo``) where ours does not take it."""
    deferred = _DEFERRED.get()
    _DEFERRED.set(None)
    if not (isinstance(a, (tuple, list)) and len(a) == 2 and _is_stand_in(a[1])):
        _unsupported("wo_a: the activation arrives quantized by SGLang")   # SGLang's own call, as it came
    if deferred is None:
        raise RuntimeError(f"{OP}: wo_a: a stand-in scale without its deferred quantization (another thread?)")
    x = a[0]

    def sglang_fp8():   # SGLang's quantization, then SGLang's GEMM
        q, s = deferred.quant(deferred.x, *deferred.args, **deferred.kwargs)
        if q.shape != x.shape:
            q, s = q.view(x.shape), s.view(x.shape[0], x.shape[1], -1)
        return sglang_gemm((q, s))

    # (a GEMM other than wo_a's is DeepGEMM's whatever this GPU is: SGLang's own call)
    fallback = sglang_fp8 if not_ours or deep_gemm_einsum_runs_on(x) else (
        lambda: wo_a_bf16_einsum(x, weight, weight_scale, out))
    try:
        if not_ours:
            _unsupported(not_ours)
        if isinstance(out, (tuple, list)):
            _unsupported("wo_a: out is an (fp8, scale) pair; ours writes bf16")
        if x.dim() != 3 or weight.dim() != 3:
            _unsupported(f"wo_a: x [T, G, D] and weight [G, R, D] expected, got {list(x.shape)}, {list(weight.shape)}")
        if x.shape[0] > FP8_WO_A_MAX_M:
            raise KeepOriginal(f"{OP}: wo_a: more than {FP8_WO_A_MAX_M} rows (above the crossover): "
                               + ("SGLang's fp8_einsum runs" if fallback is sglang_fp8 else
                                  "SGLang's bf16 wo_a einsum runs on the weight dequantized for the call (DeepGEMM's "
                                  "fp8_einsum does not run on this GPU)"))
        op = _op()
        ok, why = op.fp8_linear_supported(x.shape[0], weight.shape[1], weight.shape[2], (BLOCK, BLOCK),
                                          weight_scale.dtype)
        if not ok:
            _unsupported(why)
        return op.fp8_grouped_linear(x, weight, weight_scale, out=out)
    except UnsupportedCase as e:
        e.redo = fallback
        raise


def deep_gemm_fp8_einsum(original, expr, a, b, d, *args, **kwargs):
    """Replaces ``deep_gemm.fp8_einsum`` (0.5.16-0.5.22 call it from DeepSeek-V4's attention as
    ``fp8_einsum("bhr,hdr->bhd", (o_fp8, o_s), (wo_a [G, R, D], scale), out [T, G, R], recipe=...)``). Takes the
    call whose activation quantization was deferred; any other call is DeepGEMM's, as it came."""
    not_ours = None
    if expr != "bhr,hdr->bhd" or not (isinstance(b, (tuple, list)) and len(b) == 2):
        not_ours = f"wo_a: fp8_einsum {expr!r} with this weight operand is not the wo_a GEMM"
    weight, scale = (b[0], b[1]) if not_ours is None else (None, None)
    return _serve_wo_a(a, weight, scale, d, lambda qa: original(expr, qa, b, d, *args, **kwargs), not_ours)


deep_gemm_fp8_einsum.__dsv4_wraps_original__ = True


def fp8_wo_a_einsum(original, o_fp8, o_s, weight, weight_scale, recipe, out=None):
    """Replaces 0.5.23's ``sglang.srt.models.deepseek_v4._fp8_wo_a_einsum(o_fp8, o_s, weight, weight_scale,
    recipe, out=None)`` (its wrapper of ``deep_gemm.fp8_einsum``; no deep_gemm import on our path)."""
    return _serve_wo_a((o_fp8, o_s), weight, weight_scale, out,
                       lambda qa: original(qa[0], qa[1], weight, weight_scale, recipe, out))


fp8_wo_a_einsum.__dsv4_wraps_original__ = True
