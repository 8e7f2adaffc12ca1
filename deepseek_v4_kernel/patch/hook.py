"""The one mechanism that applies the target table (``targets.py``).

* A ``sys.meta_path`` finder watches the modules named in the table. When one of them is
  imported, the finder lets the normal finders locate it and hooks the loader's
  ``exec_module``, so the patch runs the moment the module body has executed, before any
  caller can take a reference. Modules already imported when ``install()`` runs are
  patched at once. In a process started with our directory on PYTHONPATH, sitecustomize.py's
  watcher (already first on sys.meta_path, where it installed this layer at the first import
  of a watched package) hands the imports to this finder instead of it being added there.
* Each target is checked before it is touched: SGLang version in range, attribute
  present, the original's signature has the parameters the replacement was written for,
  the target's condition holds. Anything else is skipped and reported, never patched
  blindly.
* A replacement is wrapped so that a case our op does not cover (``UnsupportedCase``,
  a missing extension) goes back to the original function, logged once per case;
  ``DSV4_KERNEL_STRICT=1`` raises instead. An exception carrying ``redo`` (a zero-argument
  callable) runs that instead of the original with the call's own arguments: SGLang's call
  rebuilt by an adapter whose op skipped a step SGLang had run before it.
* Importers that bound the original by ``from module import name`` at import time are
  rebound too (by identity, so aliases are found).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional

from . import policy
from .targets import CONDITIONS, SURVEYED, Target

log = logging.getLogger("deepseek_v4_kernel")

# Record statuses.
PATCHED = "patched"  # replaced (or gate set)
PENDING = "pending"  # module not imported yet
SKIPPED = "skipped"  # could not be applied safely: missing module/attribute, drifted signature
LEFT = "left"  # applies to this version but not needed here (native SM120 kernel present)
INACTIVE = "inactive"  # outside this SGLang version / patch layer not active
ERROR = "error"  # an unexpected exception while patching (start-up continues)

# How the start-up line counts the records (Patcher.summary); every status above has its words.
SUMMARY_WORDS = {PATCHED: "patched", PENDING: "waiting for their module", LEFT: "left to SGLang",
                 SKIPPED: "skipped", ERROR: "failed", INACTIVE: "not for this version"}


@dataclass
class Record:
    target: Target
    status: str = PENDING
    reason: str = "module not imported yet"
    handbacks: int = 0
    handback_reasons: Dict[str, int] = field(default_factory=dict)   # message -> calls handed back
    kept: int = 0                                                    # calls left to SGLang's faster kernel
    kept_reasons: Dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        t = self.target
        return {
            "op": t.op,
            "kind": t.kind,
            "target": f"{t.module}.{t.attr}" if t.kind != "env" else t.attr,
            "versions": t.version_text(),
            "status": self.status,
            "reason": self.reason,
            "handbacks": self.handbacks,
            "handback_reasons": dict(self.handback_reasons),
            "kept": self.kept,
            "kept_reasons": dict(self.kept_reasons),
        }


def resolve(spec: str) -> Callable:
    """'package.module:function' -> the function."""
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)


def _params(fn) -> Optional[set]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    names = set()
    for p in sig.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            names.add("**")
        elif p.kind is p.VAR_POSITIONAL:
            names.add("*")
        else:
            names.add(p.name)
    return names


def _owner(module, attr: str):
    """(object holding the last component of a dotted ``attr``, that name); (None, name) if the
    path breaks. ``"Fp8MoEMethod.apply"`` patches a method on a class of ``module``."""
    *path, name = attr.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None, name
    return owner, name


def make_replacement(target: Target, record: Record, original: Callable, ours: Callable) -> Callable:
    from ..errors import ExtensionUnavailable, KeepOriginal, UnsupportedCase

    reported = set()
    lock = threading.Lock()

    # a replacement that only adds context around SGLang's own function takes the original as its first argument
    call = functools.partial(ours, original) if getattr(ours, "__dsv4_wraps_original__", False) else ours

    def first_time(msg: str, kept: bool) -> bool:
        """Count the call under its reason (kept, or handed back); True the first time this reason is seen."""
        counts = record.kept_reasons if kept else record.handback_reasons
        with lock:
            if kept:
                record.kept += 1
            else:
                record.handbacks += 1
            counts[msg] = counts.get(msg, 0) + 1
            first = msg not in reported
            reported.add(msg)
        return first

    @functools.wraps(original)
    def dsv4_replacement(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except KeepOriginal as e:   # a measured choice, not a gap: counted apart, said once at INFO
            if first_time(str(e), kept=True):
                log.info("deepseek_v4_kernel: %s: keeping the original %s.%s for this size: %s",
                         target.op, target.module, target.attr, e)
            return e.redo() if getattr(e, "redo", None) is not None else original(*args, **kwargs)
        except (UnsupportedCase, ExtensionUnavailable) as e:
            if policy.strict():
                raise
            if first_time(str(e), kept=False):
                log.warning(
                    "deepseek_v4_kernel: %s: handing this call back to the original %s.%s: %s",
                    target.op, target.module, target.attr, e,
                )
            # ``redo``: SGLang's call rebuilt by the adapter (a step before it, e.g. the activation quantization our
            # op skips, was replaced too); counted and logged as any hand-back
            return e.redo() if getattr(e, "redo", None) is not None else original(*args, **kwargs)

    dsv4_replacement.__dsv4_original__ = original
    dsv4_replacement.__dsv4_target__ = target
    return dsv4_replacement


class Patcher:
    def __init__(self, targets: Iterable[Target], sglang_version: Optional[str], active: bool, why: str):
        self.targets: List[Target] = list(targets)
        self.version = sglang_version
        self.active = active
        self.why = why
        self.records: Dict[Target, Record] = {t: Record(t) for t in self.targets}
        self.replacements: Dict[Target, Callable] = {}
        self._finder: Optional[_Finder] = None
        self._lock = threading.RLock()

    # ---------------------------------------------------------------- install
    def install(self, add_finder: bool = True) -> None:
        """Set the environment rows, patch the target modules already imported and make the finder that patches
        the others as they are imported. ``add_finder``: put it first on sys.meta_path (False: sitecustomize.py's
        watcher, already there, hands it the watched imports)."""
        if not self.active:
            for r in self.records.values():
                r.status, r.reason = INACTIVE, self.why
            return
        watched = set()
        for t in self.targets:
            ok, why = t.applies_to_version(self.version)
            if not ok:
                self.records[t].status, self.records[t].reason = INACTIVE, why
                continue
            if t.kind == "env":
                try:
                    self._apply_env(t)
                    if self.records[t].status == LEFT:
                        log.info("deepseek_v4_kernel: left %s: %s", t.attr, self.records[t].reason)
                except Exception as e:  # a failing condition costs this row only, never start-up
                    self.records[t].status, self.records[t].reason = ERROR, f"{type(e).__name__}: {e}"
                    log.warning("deepseek_v4_kernel: setting %s failed: %r", t.attr, e)
                continue
            watched.add(t.module)
            watched.update(t.importers)
        self._finder = _Finder(self, watched)
        if add_finder:
            sys.meta_path.insert(0, self._finder)
        for name in sorted(watched):
            if name in sys.modules:
                self.on_import(name, sys.modules[name])

    def uninstall(self) -> None:
        """Remove the finder (tests). Patched attributes stay as they are."""
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._finder = None

    # ---------------------------------------------------------------- events
    def on_import(self, name: str, module) -> None:
        with self._lock:
            for t in self.targets:
                rec = self.records[t]
                if rec.status == INACTIVE or t.kind == "env":
                    continue
                try:
                    if t.module == name and rec.status == PENDING:
                        self._apply(t, module)
                        if rec.status in (SKIPPED, LEFT):   # (PATCHED says so itself; the rest are not outcomes)
                            log.info("deepseek_v4_kernel: %s %s.%s: %s", rec.status, t.module, t.attr, rec.reason)
                    if name in t.importers and t in self.replacements:
                        self._rebind(t, module)
                except Exception as e:  # never break the importing program
                    rec.status, rec.reason = ERROR, f"{type(e).__name__}: {e}"
                    log.warning("deepseek_v4_kernel: patching %s.%s failed: %r", t.module, t.attr, e)

    # ---------------------------------------------------------------- actions
    def _apply_env(self, t: Target) -> None:
        rec = self.records[t]
        current = os.environ.get(t.attr)
        ours = t.attr in os.environ.get(policy.ENV_SET, "").split(",")   # set by this layer in a parent process
        differs = current is not None and current != str(t.value)
        again = differs and t.reassert and ours
        if differs and not again:
            rec.status, rec.reason = LEFT, (f"{t.attr}={current} was set before start-up (by the user, or in a "
                                            f"worker process by SGLang's launcher)")
            return
        if t.when is not None:
            needed, why = CONDITIONS[t.when](self.version)
            if not needed:
                rec.status, rec.reason = LEFT, why
                return
        os.environ[t.attr] = str(t.value)
        if not ours:
            os.environ[policy.ENV_SET] = ",".join(x for x in (os.environ.get(policy.ENV_SET), t.attr) if x)
        rec.status, rec.reason = PATCHED, f"{t.attr}={t.value}" + (
            f" (set again: SGLang's launcher had set {current})" if again else "")
        log.info("deepseek_v4_kernel: set %s=%s (%s)%s", t.attr, t.value, t.op, " again" if again else "")

    def _apply(self, t: Target, module) -> None:
        rec = self.records[t]
        owner, name = _owner(module, t.attr)
        if owner is None or name not in vars(owner) and not hasattr(owner, name):
            rec.status, rec.reason = SKIPPED, f"{t.module} has no attribute {t.attr} (SGLang {self.version} drifted)"
            return
        # a class attribute is read from the class's own namespace: a method defined on a base
        # class is not this target's call site, and getattr would hide a staticmethod wrapper
        original = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name)
        if original is None or isinstance(original, (staticmethod, classmethod)):
            rec.status, rec.reason = SKIPPED, f"{t.module}.{t.attr} is not a plain function defined there"
            return
        if getattr(original, "__dsv4_original__", None) is not None:
            rec.status, rec.reason = PATCHED, "already patched"
            self.replacements[t] = original
            return
        if t.when is not None:
            needed, why = CONDITIONS[t.when](module)
            if not needed:
                rec.status, rec.reason = LEFT, why
                return
        if t.kind == "setattr":
            setattr(owner, name, t.value)
            rec.status, rec.reason = PATCHED, f"{t.attr} = {t.value!r} (was {original!r})"
            log.info("deepseek_v4_kernel: set %s.%s = %r (%s)", t.module, t.attr, t.value, t.op)
            return
        have = _params(original)
        if have is not None and "**" not in have and not set(t.params) <= have:
            missing = sorted(set(t.params) - have)
            rec.status, rec.reason = SKIPPED, f"signature drifted: original lacks {missing}"
            return
        try:
            ours = resolve(t.replacement)
        except Exception as e:
            rec.status, rec.reason = SKIPPED, f"replacement {t.replacement} not importable: {e!r}"
            return
        ours_params = _params(ours)
        if ours_params is not None and "**" not in ours_params and not (set(t.params) - {"**", "*"}) <= ours_params:
            rec.status, rec.reason = SKIPPED, f"replacement {t.replacement} does not take {sorted(set(t.params) - ours_params)}"
            return
        wrapper = make_replacement(t, rec, original, ours)
        setattr(owner, name, wrapper)
        self.replacements[t] = wrapper
        rec.status, rec.reason = PATCHED, f"-> {t.replacement}" + ("" if self._known_version(t) else " (SGLang version newer than surveyed)")
        log.info("deepseek_v4_kernel: patched %s.%s -> %s", t.module, t.attr, t.replacement)
        for imp in t.importers:
            if imp in sys.modules:
                self._rebind(t, sys.modules[imp])

    def _rebind(self, t: Target, module) -> None:
        wrapper = self.replacements[t]
        original = getattr(wrapper, "__dsv4_original__", None)
        for name, value in list(vars(module).items()):
            if original is not None and value is original:
                setattr(module, name, wrapper)
                log.info("deepseek_v4_kernel: rebound %s.%s -> %s", module.__name__, name, t.replacement)

    def _known_version(self, t: Target) -> bool:
        """Whether this SGLang version was surveyed (a newer one is patched only after the checks)."""
        newest = t.last or SURVEYED[-1]
        return self.version is None or policy.parse_version(self.version) <= policy.parse_version(newest)

    # ---------------------------------------------------------------- report
    def report(self) -> List[dict]:
        return [self.records[t].as_dict() for t in self.targets]

    def summary(self) -> str:
        """'3 patched, 5 waiting for their module, 7 not for this version': each status present, in
        SUMMARY_WORDS's words and order."""
        counts: Dict[str, int] = {}
        for r in self.records.values():
            counts[r.status] = counts.get(r.status, 0) + 1
        return ", ".join(f"{counts[s]} {w}" for s, w in SUMMARY_WORDS.items() if counts.get(s))


class _Finder:
    """Meta-path finder: locates a watched module with the other finders and hooks its loader."""

    def __init__(self, patcher: Patcher, watched: set):
        self.patcher = patcher
        self.watched = watched
        self._busy = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watched or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                # sitecustomize.py's watcher hands watched imports to this finder: asking it would ask us again
                if finder is self or not hasattr(finder, "find_spec") or getattr(finder, "dsv4_first_import_hook",
                                                                                 False) is True:
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self._hook(spec, fullname)
        return spec

    def _hook(self, spec, fullname):
        loader = spec.loader
        patcher = self.patcher
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patcher.on_import(fullname, module)

        if isinstance(loader, type):  # a class used as loader (builtins/frozen): wrap, don't mutate the class
            spec.loader = _LoaderProxy(loader, exec_and_patch)
        else:
            loader.exec_module = exec_and_patch


class _LoaderProxy:
    def __init__(self, loader, exec_module):
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)
