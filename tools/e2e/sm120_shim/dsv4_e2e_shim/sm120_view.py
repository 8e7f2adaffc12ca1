"""SGLang's view of the GPU as an RTX PRO 6000 (compute capability 12.0, CUDA >= 12.8), and nothing else.

SGLang 0.5.17 decides its SM120 paths through the predicates of ``sglang.srt.utils.common`` (every decision point on
the DeepSeek-V4 path is listed, with file:line, in tools/e2e/sm120_points.py). This module replaces those predicates
in that module the moment its body has executed, before any other SGLang module runs ``from sglang.srt.utils(.common)
import ...`` or computes a module-level constant such as ``_is_sm120 = is_sm120_supported()``
(deepseek_v4_backend.py:83) or ``ENABLE_JIT_DEEPGEMM`` (deep_gemm_wrapper/configurer.py:37).

Left alone on purpose: ``torch.cuda.get_device_capability`` (Triton, FlashInfer's JIT, SGLang's JIT
(kernels/jit/utils/arch.py:99), sgl_kernel, DeepGEMM, TileLang and our extension compile for and pick kernels by the
real GPU), and SGLang's few direct torch capability reads, which select kernels for the real GPU or lie off the
DeepSeek-V4 path (classified in sm120_points.py).
"""

from __future__ import annotations

import functools
from typing import Dict, Tuple

MODULE = "sglang.srt.utils.common"
CAPABILITY: Tuple[int, int] = (12, 0)
DEVICE_SM = 120

# name in sglang.srt.utils.common -> what it returns on an RTX PRO 6000 with a CUDA >= 12.8 torch
# (common.py:253-307: each is _check_cuda_device_version(majors, min CUDA) cached by lru_cache)
PREDICATES: Dict[str, bool] = {
    "is_sm120_supported": True,          # majors [12], CUDA >= 12.8
    "is_blackwell_supported": True,      # majors [10, 11, 12]; the same object as is_blackwell
    "is_blackwell": True,
    "is_sm100_supported": False,         # majors [10]
    "is_sm100_or_sm110_supported": False,  # majors [10, 11]
    "is_sm90_supported": False,          # majors [9]: True on the H200, False on SM120
    "is_hopper_with_cuda_12_3": False,   # majors [9]
    "is_sm80_supported": False,          # majors [8]
    "is_ampere_with_cuda_12_3": False,   # majors [8]
}
# functions of the same module that return the device's numbers
NUMBERS = {
    "get_device_sm": DEVICE_SM,           # common.py:602, major * 10 + minor
    "get_device_capability": CAPABILITY,  # common.py:955, (major, minor)
}

_forced: Dict[str, object] = {}


def _constant(name: str, value):
    def forced(*args, **kwargs):
        return value

    forced.__name__ = forced.__qualname__ = name
    forced.__doc__ = f"DSV4 e2e harness: {name} as on an RTX PRO 6000 (returns {value!r})."
    # the predicates are lru_cache objects in SGLang (callers may use cache_clear); the number getters are not
    wrapped = forced if name in NUMBERS else functools.lru_cache(maxsize=1)(forced)
    wrapped.__dsv4_e2e_forced__ = value
    return wrapped


def apply(common) -> Dict[str, object]:
    """Replace the predicates in the imported ``sglang.srt.utils.common``; returns {name: value} of what was forced."""
    for name, value in list(PREDICATES.items()) + list(NUMBERS.items()):
        if not hasattr(common, name):
            continue  # not in this SGLang version: nothing to force
        setattr(common, name, _constant(name, value))
        _forced[name] = value
    return dict(_forced)


def install(hook) -> None:
    hook.watch(MODULE, apply)


def forced() -> Dict[str, object]:
    return dict(_forced)


def describe() -> str:
    try:
        from importlib import metadata

        version = metadata.version("sglang")
    except Exception:
        version = "not installed"
    note = "" if version == "0.5.17" else f" (surveyed for 0.5.17; this is {version})"
    return (f"SM120 view of SGLang {version}{note}: {MODULE}.{{{', '.join(PREDICATES)}}} as on sm_120, "
            f"get_device_sm() = {DEVICE_SM}, get_device_capability() = {CAPABILITY}; "
            f"torch.cuda keeps the real GPU")
