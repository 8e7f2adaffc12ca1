"""The harness's start-up shim (tools/e2e/sm120_shim/sitecustomize.py runs ``start()`` in every process).

Switches (set by tools/e2e/setups.py per setup):
* ``DSV4_E2E_SM120_VIEW=1``: SGLang's capability predicates answer as on an RTX PRO 6000 (sm120_view.py);
* ``DSV4_E2E_WEIGHT_SEED=<int>``: seeded dummy weights in the checkpoint's formats (dummy_weights.py);
* ``DSV4_E2E_WEIGHT_LOG=<dir>``: each process that initialises dummy weights writes the parameter list it filled
  there (names, shapes, dtypes, how each was filled), so the harness can check that all setups built the same model;
* ``DSV4_E2E_TL_DISABLE_WGMMA=1``: every ``tilelang.jit`` gets the ``tl.disable_wgmma`` pass config, so TileLang
  builds SM120's instruction class (mma.sync) on a wgmma GPU (tilelang_class.py; Triton's counterpart,
  DISABLE_MMA_V3=1, is Triton's own variable and needs no shim).

All act through one import hook: a callback runs the moment a named module's body has executed, before any other
module can import a name from it. None touches torch, Triton, FlashInfer, sgl_kernel, DeepGEMM or our library, and
the TileLang switch only adds that one pass config: kernels keep compiling for and selecting by the real GPU.

The start-up line is printed at the first import of ``sglang`` in the process (as our own hook prints its line at
the first import of a package it patches), so helper processes that never import SGLang (multiprocessing's resource
tracker, compiler wrappers) stay silent and the harness can match the two lines process for process.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, Dict, List

LINE_TAG = "[dsv4-e2e-shim]"
SM120_VIEW = "DSV4_E2E_SM120_VIEW"
WEIGHT_SEED = "DSV4_E2E_WEIGHT_SEED"
WEIGHT_LOG = "DSV4_E2E_WEIGHT_LOG"
TL_NO_WGMMA = "DSV4_E2E_TL_DISABLE_WGMMA"

STARTED = False
_visited_dirs: List[str] = []  # directories whose sitecustomize.py has run in this process
_finder = None
_events: List[str] = []  # what was forced, in order (the start-up line, then patch events)


def env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class PostImportHook:
    """A ``sys.meta_path`` finder that runs callbacks right after a watched module's body has executed, and prints
    the start-up line at the first import of sglang."""

    def __init__(self):
        self.callbacks: Dict[str, List[Callable]] = {}
        self._busy = threading.local()
        self.line = ""
        self.announced = False

    def watch(self, module_name: str, callback: Callable) -> None:
        self.callbacks.setdefault(module_name, []).append(callback)
        if module_name in sys.modules:  # imported before the shim: apply now, and say so
            _events.append(f"{module_name} was imported before the shim")
            callback(sys.modules[module_name])

    def find_spec(self, fullname, path=None, target=None):
        if not self.announced and fullname.partition(".")[0] == "sglang":
            self.announced = True
            print(self.line, file=sys.stderr, flush=True)
        if fullname not in self.callbacks or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        callbacks = self.callbacks[fullname]

        def exec_then_callbacks(module):
            exec_module(module)
            for cb in callbacks:
                try:
                    cb(module)
                except Exception as e:  # a failing callback is reported, the import goes on
                    print(f"{LINE_TAG} pid {os.getpid()}: {fullname}: {type(e).__name__}: {e}", file=sys.stderr)

        spec.loader.exec_module = exec_then_callbacks
        return spec


def hook() -> PostImportHook:
    global _finder
    if _finder is None:
        _finder = PostImportHook()
        sys.meta_path.insert(0, _finder)
    return _finder


def start() -> None:
    """Install what the environment asks for and print the one start-up line of this process."""
    global STARTED
    STARTED = True
    parts = []
    if env_on(SM120_VIEW):
        from . import sm120_view

        sm120_view.install(hook())
        parts.append(sm120_view.describe())
    if os.environ.get(WEIGHT_SEED, "").strip():
        from . import dummy_weights

        seed = dummy_weights.install(hook(), os.environ[WEIGHT_SEED])
        parts.append(f"dummy weights: seeded ({WEIGHT_SEED}={seed}, checkpoint formats)")
    if env_on(TL_NO_WGMMA):
        from . import tilelang_class

        tilelang_class.install(hook())
        parts.append(tilelang_class.describe())
    if not parts:
        parts.append("nothing forced")
    h = hook()
    h.line = (f"{LINE_TAG} pid {os.getpid()} ({os.path.basename(sys.argv[0]) if sys.argv else '?'}): "
              + "; ".join(parts))
    if "sglang" in sys.modules and not h.announced:  # imported before the shim ran: say so now
        h.announced = True
        print(h.line, file=sys.stderr, flush=True)


def chain_sitecustomize(shim_dir: str) -> str:
    """Run the first sitecustomize.py on sys.path whose directory has not run one yet in this process."""
    import importlib.util

    if shim_dir not in _visited_dirs:
        _visited_dirs.append(shim_dir)
    for entry in list(sys.path):
        try:
            directory = os.path.abspath(entry or os.getcwd())
        except Exception:
            continue
        path = os.path.join(directory, "sitecustomize.py")
        if directory in _visited_dirs or not os.path.isfile(path):
            continue
        _visited_dirs.append(directory)
        name = f"_dsv4_e2e_chained_sitecustomize_{len(_visited_dirs)}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return path
    return ""


def events() -> List[str]:
    return list(_events)
