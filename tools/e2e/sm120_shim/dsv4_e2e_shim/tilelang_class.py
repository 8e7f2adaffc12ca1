"""TileLang kernels in SM120's instruction class on a wgmma GPU: ``tl.disable_wgmma`` in every ``tilelang.jit``.

TileLang 0.1.11 reads no environment variable for this; the switch is a pass config (``PassConfigKey.TL_DISABLE_WGMMA``
= "tl.disable_wgmma", read by its GEMM lowering, src/cuda/op/gemm.cc: with it a T.gemm lowers to mma.sync, as on
SM120, which has no wgmma). SGLang 0.5.17 compiles all its TileLang kernels through the ``jit`` attribute of the
``tilelang`` module at the time it decorates or first calls them: kernels/ops/attention/dsa/tilelang_kernel.py
(``@tilelang.jit(...)`` at import, after ``import tilelang``) and kernels/ops/layernorm/mhc.py (its lazy proxy calls
``_load_tilelang().jit(**kwargs)(fn)`` at the first call). Replacing ``tilelang.jit`` right after the ``tilelang``
package's body has run therefore reaches every one of them. The kernels' own pass configs are kept; the forced key
is added (TileLang's kernel cache key includes the pass configs, so these kernels never share a cache entry with
wgmma builds).

Acts when DSV4_E2E_TL_DISABLE_WGMMA=1 (setups.py sets it for the SM120-view setups' mma class).
"""

from __future__ import annotations

import functools
from typing import Dict

MODULE = "tilelang"
SWITCH = "DSV4_E2E_TL_DISABLE_WGMMA"
PASS_CONFIG = "tl.disable_wgmma"

_state: Dict[str, object] = {"wrapped": False, "calls": 0, "missing_key": False}


def forced_key(tilelang):
    """The pass-config key object of this TileLang (its enum member), or the plain string where it has none."""
    key = getattr(getattr(tilelang, "PassConfigKey", None), "TL_DISABLE_WGMMA", None)
    if key is None:
        _state["missing_key"] = True
        return PASS_CONFIG
    return key


def merged(pass_configs, key) -> dict:
    """The kernel's pass configs with the wgmma switch on (an explicit setting of the same key is overridden)."""
    out = {k: v for k, v in dict(pass_configs or {}).items() if getattr(k, "value", k) != PASS_CONFIG}
    out[key] = True
    return out


def apply(tilelang) -> None:
    real_jit = getattr(tilelang, "jit", None)
    if real_jit is None or getattr(real_jit, "__dsv4_e2e_forced__", False):
        return
    key = forced_key(tilelang)

    @functools.wraps(real_jit)
    def jit(func=None, **kwargs):
        _state["calls"] = int(_state["calls"]) + 1
        kwargs["pass_configs"] = merged(kwargs.get("pass_configs"), key)
        if func is None:
            return real_jit(**kwargs)
        return real_jit(func, **kwargs)

    jit.__dsv4_e2e_forced__ = True
    tilelang.jit = jit
    _state["wrapped"] = True


def install(hook) -> None:
    hook.watch(MODULE, apply)


def describe() -> str:
    return f"TileLang: {PASS_CONFIG} added to every tilelang.jit (SM120's instruction class)"


def state() -> Dict[str, object]:
    return dict(_state)
