"""Patch layer: ``install()`` decides whether to act and installs the import hook that applies ``targets.TARGETS``.

``sitecustomize.py`` calls it when a package the targets live in (sglang, deep_gemm, flash_mla) is first imported,
before that package's code runs; the doctor and the tests call it directly. It decides whether to act (SM12x
device, or DSV4_KERNEL_FORCE=1; never with DSV4_KERNEL_DISABLE=1), reads the SGLang version from package metadata,
sets the environment rows and patches the target modules already imported; the others are patched the moment
they are imported. It imports neither torch nor SGLang and does not initialise CUDA. ``report()`` says what
happened to every target.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from . import policy
from .hook import Patcher
from .targets import TARGETS

_PATCHER: Optional[Patcher] = None

DOCTOR = "python -m deepseek_v4_kernel doctor"


def _start_up_watcher_present() -> bool:
    """sitecustomize.py's watcher is on sys.meta_path: it hands the watched imports to our finder itself."""
    return any(getattr(f, "dsv4_first_import_hook", False) is True for f in sys.meta_path)


def install(targets=TARGETS, announce: bool = True) -> Patcher:
    """Install once per process (later calls return the same patcher). ``announce``: print the start-up line
    (where the layer is active or SGLang is installed, unless DSV4_KERNEL_QUIET=1)."""
    global _PATCHER
    if _PATCHER is not None:
        return _PATCHER
    active, why = policy.active()
    version = policy.sglang_version()
    patcher = Patcher(targets, version, active, why)
    _PATCHER = patcher
    patcher.install(add_finder=not _start_up_watcher_present())
    if announce and (active or version is not None) and not policy.env_flag(policy.QUIET):
        print(start_up_line(patcher), file=sys.stderr)
        if active:
            import atexit

            atexit.register(_print_exit_summary)
    return patcher


def exit_summary() -> str:
    """One line: this process's calls per op and kernel, and the calls handed back to SGLang per target ("" where
    nothing ran). The ops' counters are read only if an op was imported (no torch import at exit)."""
    stats = sys.modules.get("deepseek_v4_kernel.ops._stats")
    ran = stats.summary() if stats is not None else ""
    rows = report()
    back = [f"{r['op']} {r['handbacks']} ({'; '.join(list(r['handback_reasons'])[:2])})" for r in rows
            if r["handbacks"]]
    kept = [f"{r['op']} {r['kept']}" for r in rows if r.get("kept")]
    if not ran and not back and not kept:
        return ""
    import os

    tail = f"; kept SGLang's faster kernel: {', '.join(kept)}" if kept else ""
    return (f"[deepseek_v4_kernel] pid {os.getpid()} at exit: {ran or 'no op ran'}; handed back to SGLang: "
            f"{', '.join(back) if back else 'nothing'}{tail}")


def _print_exit_summary() -> None:
    try:
        line = exit_summary()
        if line:
            print(line, file=sys.stderr)
    except Exception:  # noqa: BLE001 - an exit must survive anything
        pass


def start_up_line(patcher: Patcher) -> str:
    """One line: whether the layer acts and why (naming NVML's error where the probe failed), the SGLang
    version, and what happened to the targets so far."""
    from .. import __version__

    state = "active" if patcher.active else "inactive"
    what = f"{len(patcher.targets)} targets: {patcher.summary()}" if patcher.active else "nothing patched"
    decides = f"; dispatch: {dispatch_words()}" if patcher.active else ""
    # an op's switch holding a value its parser refuses: said here, at start-up, not only at the op's first call
    from ..switches import problems

    bad = "".join(f"; switch error: {p} (each call that reads it goes back to SGLang's own code)" for p in problems())
    return (f"[deepseek_v4_kernel {__version__}] {state}: {patcher.why}; SGLang {patcher.version or 'not installed'}; "
            f"{what}{decides}{bad}; details: {DOCTOR}")


def dispatch_words() -> str:
    """What decides per op and size class in this process (said in the start-up line)."""
    from . import decisions, measured

    mode = policy.prefer_mode()
    if mode == "ours":
        return f"ours everywhere ({policy.PREFER}=ours)"
    if mode == "builtin":
        return f"the built-in rules ({policy.PREFER}=builtin)"
    if measured.load().ok:
        return f"{policy.PREFER}=measured: {measured.load().why}"
    d, why = decisions.cache_dir()
    return (f"measured (each worker reads or times its decisions after its model loads; cache {d}"
            + (f": {why}" if why else "") + ")")


def installed() -> Optional[Patcher]:
    return _PATCHER


def report() -> List[dict]:
    """One dict per target: op, target, versions, status, reason, handbacks ([] before ``install()``)."""
    return _PATCHER.report() if _PATCHER is not None else []


def _reset_for_tests() -> None:
    global _PATCHER
    if _PATCHER is not None:
        _PATCHER.uninstall()
    _PATCHER = None
