"""The one parser of our environment switches (stdlib only: the start-up path may import it).

A boolean switch reads 1 / true / yes / on as true and 0 / false / no / off as false, in any case, with surrounding
blanks ignored; unset or empty means its default. Anything else is an error that names the variable, the accepted
values and the value found; a choice switch (``choice``) likewise names one of a fixed list of values:
``InvalidSwitch``, an ``UnsupportedCase``, so a call that meets it inside an op goes back
to SGLang's own code (logged once; raised with DSV4_KERNEL_STRICT=1) instead of guessing what the user meant.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from .errors import UnsupportedCase

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


class InvalidSwitch(UnsupportedCase):
    """An environment switch holds a value we do not accept."""


def env_bool(name: str, default: bool) -> bool:
    """The boolean switch ``name`` (see the module docstring)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    v = raw.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise InvalidSwitch(f"{name} must be one of {'/'.join(TRUE)} (on) or {'/'.join(FALSE)} (off), got {raw!r}")


def choice(name: str, accepted: Sequence[str], default: Optional[str] = None) -> Optional[str]:
    """The choice switch ``name``: one of ``accepted`` (lower-case names, matched in any case, surrounding blanks
    ignored); unset or empty gives ``default``. Any other value raises InvalidSwitch naming the variable, the
    accepted values and the value found (a typo such as ``measure`` for ``measured`` is never silently ignored)."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    v = raw.strip().lower()
    if v not in accepted:
        unset = f" (unset: {default})" if default is not None else ""
        raise InvalidSwitch(f"{name} must be one of {', '.join(accepted)}, got {raw!r}{unset}")
    return v


class IntRange(tuple):
    """(lo, hi): the accepted values of an integer switch (``env_int``), both ends included."""

    def __new__(cls, lo: int, hi: int):
        return super().__new__(cls, (int(lo), int(hi)))


def env_int(name: str, lo: int, hi: int, default: Optional[int] = None) -> Optional[int]:
    """The integer switch ``name``: a decimal integer in [lo, hi] (surrounding blanks ignored); unset or empty gives
    ``default``. Anything else raises InvalidSwitch naming the variable, the range and the value found."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    v = raw.strip()
    try:
        n = int(v, 10)
    except ValueError:
        n = None
    if n is None or not lo <= n <= hi:
        unset = f" (unset: {default})" if default is not None else ""
        raise InvalidSwitch(f"{name} must be an integer in [{lo}, {hi}], got {raw!r}{unset}")
    return n


def env_choice(name: str, choices: Sequence[str], default: Optional[str] = None) -> Optional[str]:
    """Same as ``choice`` (the name the ops used first)."""
    return choice(name, choices, default)


# Every switch this package reads from the environment at run time, for the doctor and the start-up line (which
# check them all at once instead of leaving a bad value to the first call that reads it): name -> None for a boolean
# switch, an IntRange (lo, hi) for an integer one (``env_int``), else its accepted values (the reading module passes the same tuple to ``choice``; tests/test_switches.py
# keeps both equal and finds every switch the package reads). Paths (DSV4_KERNEL_LIB, DSV4_KERNEL_STATS_DIR,
# DSV4_KERNEL_MEASURED) and build-time variables are not listed.
SWITCHES = {
    "DSV4_KERNEL_DISABLE": None, "DSV4_KERNEL_FORCE": None, "DSV4_KERNEL_STRICT": None, "DSV4_KERNEL_QUIET": None,
    "DSV4_KERNEL_PREFER": ("measured", "ours", "builtin"),
    "DSV4_SPARSE_DECODE_IMPL": ("simt", "mma", "mma64", "mma64h32", "mma64h16", "mma64ws", "mma64wsh32",
                                "mma64wsh16", "mma64wsh16deep", "auto"),
    "DSV4_SPARSE_DECODE_WS": None, "DSV4_SPARSE_DECODE_DEEP": None, "DSV4_SPARSE_DECODE_WAVES": None,
    "DSV4_SPARSE_DECODE_PDL": None, "DSV4_SPARSE_DECODE_UNPADDED_HEADS": None,
    "DSV4_HC_PRENORM_IMPL": ("auto", "triton", "cuda"), "DSV4_HC_PRENORM_PRECISION": ("bf16x2", "tf32"),
    "DSV4_HC_PRENORM_ATOMIC": None, "DSV4_HC_PRENORM_XCHG": None, "DSV4_HC_PRENORM_PDL": None,
    "DSV4_HC_PRENORM_FNROW": None, "DSV4_HC_PRENORM_FN_GROUPS": None,
    "DSV4_FP4_MOE_IMPL": ("dequant", "dot_scaled", "mxfp8", "cuda_decode", "cuda_stream"),
    "DSV4_FP4_MOE_PDL": None, "DSV4_FP4_MOE_DEQ_PTX": None,
    "DSV4_BENCH_ALLOW_SGLANG_JIT": ("0", "1", "small"),
    "DSV4_FP8_LINEAR_KERNEL": ("auto", "ring", "regs"), "DSV4_FP8_LINEAR_DECODE": ("cvt", "int"),
    "DSV4_FP8_LINEAR_SPLITS": IntRange(1, 64), "DSV4_FP8_LINEAR_PDL": None,

    # bench-only: the --fp8-gemm-backend a process with no server resolves SGLang's block-FP8 linear for
    "DSV4_BENCH_FP8_GEMM_BACKEND": ("auto", "triton", "cutlass", "deep_gemm", "flashinfer_trtllm", "flashinfer_cutlass",
                                    "flashinfer_deepgemm", "aiter"),
}
# Read by the patch layer's install (a bad value: nothing is installed, said in one line); the others by the ops
# (a bad value: each call that reads it goes back to SGLang's own code, WARNING once).
GLOBAL = ("DSV4_KERNEL_DISABLE", "DSV4_KERNEL_FORCE", "DSV4_KERNEL_STRICT", "DSV4_KERNEL_QUIET", "DSV4_KERNEL_PREFER")


def problems() -> list:
    """One message per listed switch whose value its parser refuses ([] when all are fine)."""
    out = []
    for name, accepted in SWITCHES.items():
        try:
            if accepted is None:
                env_bool(name, False)
            elif isinstance(accepted, IntRange):
                env_int(name, *accepted)
            else:
                choice(name, accepted)
        except InvalidSwitch as e:
            out.append(str(e))
    return out
