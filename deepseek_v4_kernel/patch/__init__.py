"""Patch layer: ``install()`` is what ``sitecustomize.py`` calls in every process.

It decides whether to act (SM12x device, or DSV4_KERNEL_FORCE=1; never with
DSV4_KERNEL_DISABLE=1), reads the SGLang version from package metadata, and installs the
import hook that applies ``targets.TARGETS``. It imports neither torch nor SGLang and does
not initialise CUDA. ``report()`` says what happened to every target.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from . import policy
from .hook import Patcher
from .targets import TARGETS

_PATCHER: Optional[Patcher] = None


def install(targets=TARGETS, announce: bool = True) -> Patcher:
    """Install once per process (later calls return the same patcher)."""
    global _PATCHER
    if _PATCHER is not None:
        return _PATCHER
    active, why = policy.active()
    version = policy.sglang_version()
    patcher = Patcher(targets, version, active, why)
    _PATCHER = patcher
    patcher.install()
    if announce and not policy.env_flag(policy.QUIET):
        from .. import __version__

        state = "active" if active else "inactive"
        print(
            f"[deepseek_v4_kernel {__version__}] {state}: {why}; SGLang {version or 'not installed'}; "
            f"{len(patcher.targets)} targets ({patcher.summary()}); details: python -m deepseek_v4_kernel doctor",
            file=sys.stderr,
        )
    return patcher


def installed() -> Optional[Patcher]:
    return _PATCHER


def report() -> List[dict]:
    """One dict per target: op, target, versions, status, reason, handbacks."""
    return _PATCHER.report() if _PATCHER is not None else []


def _reset_for_tests() -> None:
    global _PATCHER
    if _PATCHER is not None:
        _PATCHER.uninstall()
    _PATCHER = None
