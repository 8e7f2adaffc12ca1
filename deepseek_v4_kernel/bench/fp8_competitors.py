"""SGLang's block-FP8 linear, as ``Fp8LinearMethod.apply`` runs it, as the competitor of our fp8_linear (bench-only).

``Fp8LinearMethod.apply`` calls ``self.w8a8_block_fp8_linear(input=x, weight=..., block_size=..., weight_scale=...,
input_scale=None, bias=...)``: the function ``--fp8-gemm-backend`` resolved to (``dispatch_w8a8_block_fp8_linear``:
on SM120 ``auto`` is CUTLASS (``cutlass_w8a8_block_fp8_linear_with_fallback``), else DeepGEMM where its JIT is on,
else Triton), which quantizes the bf16 activation itself (per 1 x 128 group): that quantization is inside the
timed call, as in the server. Which function: ``RESOLVED`` when the start-up measurement read it off the loaded
model (``from_model``: the first block-FP8 linear's method), else SGLang's own dispatch in this process (a process
with no server: SGLang's backend global set as its ``auto`` would set it, or DSV4_BENCH_FP8_GEMM_BACKEND).
Where the resolved function is DeepGEMM's with UE8M0 scales (Blackwell), the weight scales go through SGLang's
``requant_block_scale_ue8m0_for_deepgemm`` first, as at load (exact: the bench's scales are powers of two).

The user bench also times the other backends that run here (Triton everywhere, CUTLASS on SM120, DeepGEMM where
its JIT is on), by name; only the resolved one decides.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, List, Optional, Tuple

from ..switches import choice
from .competitors import SGLANG, Competitor, NotApplicable, _capability, _why

BACKEND_ENV = "DSV4_BENCH_FP8_GEMM_BACKEND"   # SGLang's --fp8-gemm-backend values (0.5.17 Fp8GemmRunnerBackend)
BACKEND_VALUES = ("auto", "triton", "cutlass", "deep_gemm", "flashinfer_trtllm", "flashinfer_cutlass",
                  "flashinfer_deepgemm", "aiter")
RESOLVED: Optional[Tuple[Callable, str]] = None     # (function, where it was read) for this process's server
FP8_UTILS = "sglang.srt.layers.quantization.fp8_utils"
BACKENDS = (("triton_w8a8_block_fp8_linear", "triton"), ("cutlass_w8a8_block_fp8_linear_with_fallback", "cutlass"),
            ("deepgemm_w8a8_block_fp8_linear_with_fallback", "deep_gemm"))


def resolved_name(fn) -> str:
    return f"sglang {getattr(fn, '__name__', fn)} (Fp8LinearMethod's resolved backend)"


def from_model(model) -> Optional[Tuple[Callable, str]]:
    """(SGLang's resolved block-FP8 function, where) from the first block-FP8 linear of a loaded model, or None."""
    try:
        for name, mod in model.named_modules():
            qm = getattr(mod, "quant_method", None)
            fn = getattr(qm, "w8a8_block_fp8_linear", None)
            if fn is not None and getattr(qm, "block_quant", False):
                return getattr(fn, "__dsv4_original__", None) or fn, f"the loaded model's {name}"
    except Exception:  # noqa: BLE001
        return None
    return None


def _resolve_in_process() -> Tuple[Optional[Callable], str]:
    """SGLang's dispatch in this process; where no server set SGLang's backend global, it is set as SGLang's
    ``initialize_fp8_gemm_config`` would for DSV4_BENCH_FP8_GEMM_BACKEND (default ``auto``; SM120: cutlass)."""
    fu = importlib.import_module(FP8_UTILS)
    where = "SGLang's dispatch_w8a8_block_fp8_linear in this process"
    if getattr(fu, "FP8_GEMM_RUNNER_BACKEND", "absent") is None:
        asked = choice(BACKEND_ENV, BACKEND_VALUES, "auto")
        backend = "cutlass" if asked == "auto" and _capability()[0] == 12 else asked
        fu.FP8_GEMM_RUNNER_BACKEND = fu.Fp8GemmRunnerBackend(backend)
        where += f" (--fp8-gemm-backend {asked}, as SGLang resolves it)"
    return fu.dispatch_w8a8_block_fp8_linear(), where


def _ue8m0_for_deepgemm(fn) -> bool:
    if getattr(fn, "__name__", "") != "deepgemm_w8a8_block_fp8_linear_with_fallback":
        return False
    try:
        return bool(importlib.import_module("sglang.srt.layers.deep_gemm_wrapper").DEEPGEMM_SCALE_UE8M0)
    except Exception:  # noqa: BLE001
        return False


def _deep_gemm_on() -> bool:
    try:
        return bool(importlib.import_module("sglang.srt.layers.deep_gemm_wrapper").ENABLE_JIT_DEEPGEMM)
    except Exception:  # noqa: BLE001
        return False


def _prepare_for(fn) -> Callable[[dict], Callable[[], Any]]:
    ue8m0 = _ue8m0_for_deepgemm(fn)

    def prepare(a):
        import torch

        w, s = a["weight"], a["weight_scale"]
        if ue8m0:   # SGLang's load-time requant for its DeepGEMM runner (Fp8LinearMethod.process_weights_after_loading)
            try:
                fu = importlib.import_module(FP8_UTILS)
                wp = torch.nn.Parameter(w.clone(), requires_grad=False)
                sp = torch.nn.Parameter(s.clone(), requires_grad=False)
                fu.requant_block_scale_ue8m0_for_deepgemm(wp, sp, [128, 128], use_deepgemm_runner=True,
                                                          output_dtype=torch.bfloat16, weight_shape=wp.shape)
                w, s = wp.data, sp.data
            except Exception as e:  # noqa: BLE001
                raise NotApplicable(f"SGLang's UE8M0 requant for DeepGEMM failed here ({_why(e)})") from None
        x = a["x"]

        def call():
            return fn(input=x, weight=w, block_size=[128, 128], weight_scale=s, input_scale=None, bias=None)
        return call
    return prepare


def fp8_linear_competitors(d) -> List[Competitor]:
    """The resolved function first (the call site's original), then (user bench) the other backends that run here."""
    out: List[Competitor] = []
    try:
        fu = importlib.import_module(FP8_UTILS)
    except Exception as e:  # noqa: BLE001
        return [Competitor("fp8_linear", "sglang block-FP8 linear (Fp8LinearMethod's resolved backend)", FP8_UTILS,
                           SGLANG, reason=f"SGLang's fp8_utils does not import here ({_why(e)})")]
    if RESOLVED is not None:
        fn, where = RESOLVED
    else:
        try:
            fn, where = _resolve_in_process()
        except Exception as e:  # noqa: BLE001
            fn, where = None, f"resolution failed: {_why(e)}"
    if fn is None:
        out.append(Competitor("fp8_linear", "sglang block-FP8 linear (Fp8LinearMethod's resolved backend)", where,
                              SGLANG, reason=where))
    else:
        out.append(Competitor("fp8_linear", resolved_name(fn), f"{getattr(fn, '__module__', '')} ({where})", SGLANG,
                              prepare=_prepare_for(fn)))
    cap = _capability()
    for attr, kind in BACKENDS:
        other = getattr(fu, attr, None)
        if other is None or other is fn:
            continue
        c = Competitor("fp8_linear", f"sglang {attr}", FP8_UTILS, SGLANG)
        if kind == "cutlass" and cap[0] != 12:
            c.reason = f"SGLang runs its CUTLASS block-FP8 path on SM120 only; this GPU is sm_{cap[0]}{cap[1]}"
        elif kind == "deep_gemm" and not _deep_gemm_on():
            c.reason = "SGLang's DeepGEMM JIT is off here (deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM)"
        else:
            c.prepare = _prepare_for(other)
        out.append(c)
    return out


def default_name(names: List[str]) -> Optional[str]:
    return next((n for n in names if n.endswith("(Fp8LinearMethod's resolved backend)")), None)
