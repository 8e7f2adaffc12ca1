"""SGLang's own kernel code, loaded from its source files without importing SGLang.

Importing an SGLang kernel module pulls its whole package (17-26 s, and it fails without SGLang's dependency tree),
and only one SGLang version can be installed. The kernels the bench times (TileLang indexer and mHC pre-GEMM, the
Triton and torch sparse-decode fallbacks, the torch indexer fallback) need only torch, triton and tilelang, so their
definitions are taken out of the file with ``ast`` and executed, at their own line numbers under their own file
name (TileLang's parser reads a kernel's source back through ``inspect``), in a namespace that supplies:

* ``tilelang`` as a proxy of the real package whose ``jit`` merges forced pass configs into every kernel's own
  (``TL_DISABLE_WGMMA`` to build the mma.sync class SM120 runs on a wgmma GPU) and compiles lazily, the way
  SGLang's own lazy proxy in mhc.py does (so ``kernel.__wrapped__`` exists as SGLang's code expects);
* SGLang's small helpers (``is_hip``, ``is_arch_support_pdl``, ``is_sm120_supported``, ...) answered for this GPU,
  ``is_sm120_supported`` True in the mma.sync mode, so that SGLang's own SM120 settings apply (warp
  specialisation off in 0.5.23's mHC kernels); an ``import sglang...`` inside a loaded function gets them too.

Where the sources are: the installed SGLang (found with importlib without running it), and unpacked wheels named
``sglang-<version>/sglang/...`` in the directories of DSV4_SGLANG_SOURCES (os.pathsep-separated; default: the
repository's ``.sglang``, which scripts/fetch_sglang_wheels.sh fills).
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import os
import threading
import types
from typing import Dict, Iterable, List, Optional, Tuple

SOURCES_ENV = "DSV4_SGLANG_SOURCES"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def installed_sglang() -> Optional[Tuple[str, str]]:
    """(version, directory that holds the ``sglang`` package) of the installed SGLang, or None. Does not import it."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    from importlib import metadata

    try:
        version = metadata.version("sglang")
    except Exception:  # noqa: BLE001  (a source tree on the path without metadata)
        version = "unknown"
    return version, os.path.dirname(list(spec.submodule_search_locations)[0])


def source_trees(versions: Iterable[str] = (), include_installed: bool = True) -> List[Tuple[str, str]]:
    """(version, directory holding ``sglang/``): the installed SGLang first, then each requested version found
    unpacked under DSV4_SGLANG_SOURCES (or the repository's .sglang). A version asked for and not found is left out
    (callers report it)."""
    out: List[Tuple[str, str]] = []
    inst = installed_sglang() if include_installed else None
    if inst:
        out.append(inst)
    roots = [p for p in os.environ.get(SOURCES_ENV, os.path.join(ROOT, ".sglang")).split(os.pathsep) if p]
    for v in versions:
        if any(v == have for have, _ in out):
            continue
        for r in roots:
            d = os.path.join(r, f"sglang-{v}")
            if os.path.isdir(os.path.join(d, "sglang")):
                out.append((v, d))
                break
    return out


def find_file(tree: str, relpaths: Iterable[str]) -> Optional[str]:
    for rel in relpaths:
        p = os.path.join(tree, rel)
        if os.path.isfile(p):
            return p
    return None


# ----------------------------------------------------------------------------- what a loaded file may see
class TileLangProxy:
    """The real ``tilelang`` with ``forced`` pass configs merged into each ``jit`` (the kernel's own win for keys
    they both set, except the forced ones, which are the point) and lazy compilation."""

    def __init__(self, real, forced: Optional[dict] = None):
        self._real = real
        self._forced = dict(forced or {})

    def __getattr__(self, name):
        return getattr(self._real, name)

    def jit(self, func=None, **jit_kwargs):
        if self._forced:
            jit_kwargs["pass_configs"] = {**(jit_kwargs.get("pass_configs") or {}), **self._forced}
        real = self._real

        def decorate(fn):
            compiled = None
            lock = threading.Lock()

            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                nonlocal compiled
                if compiled is None:
                    with lock:
                        if compiled is None:
                            compiled = real.jit(**jit_kwargs)(fn)
                return compiled(*args, **kwargs)

            return wrapper

        return decorate(func) if callable(func) else decorate


def _capability() -> Tuple[int, int]:
    import torch

    return torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)


def sglang_helpers(sm120: bool) -> Dict[str, object]:
    """SGLang's platform helpers as this GPU answers them; ``sm120`` forces is_sm120_supported (mma.sync mode)."""
    cap = _capability()
    is_sm120 = sm120 or cap[0] == 12
    return dict(
        is_hip=lambda: False, is_gfx95_supported=lambda: False, is_gfx1250_supported=lambda: False,
        is_fp8_fnuz=lambda: False, is_cuda=lambda: True, is_xpu=lambda: False,
        is_sm120_supported=lambda *a, **k: is_sm120,
        is_sm90_supported=lambda *a, **k: cap[0] == 9 and not sm120,
        is_sm100_supported=lambda *a, **k: cap[0] == 10 and not sm120,
        is_arch_support_pdl=lambda: cap[0] >= 9,
    )


def _import_with_stand_ins(helpers: Dict[str, object]):
    """An ``__import__`` that answers ``sglang.*`` with a module holding ``helpers`` (SGLang itself is not run)."""
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == "sglang" or name.startswith("sglang.")):
            mod = types.ModuleType(name)
            mod.__dict__.update(helpers)
            return mod
        return real_import(name, globals, locals, fromlist, level)

    return _import


def _assigned_names(node: ast.AST) -> set:
    names = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
        elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.value.id)
    return names


def extract(path: str, names: Iterable[str]) -> ast.Module:
    """The top-level statements of ``path`` that define ``names`` (functions, classes, assignments, and the
    ``if`` blocks that assign to them), in file order, with their line numbers. Raises LookupError naming the
    names the file lacks."""
    wanted = set(names)
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    body, found = [], set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in wanted:
                body.append(node)
                found.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.If)):
            hit = _assigned_names(node) & wanted
            if hit:
                body.append(node)
                found |= hit
    missing = wanted - found
    if missing:
        raise LookupError(f"{path} defines no {', '.join(sorted(missing))}")
    return ast.Module(body=body, type_ignores=[])


def future_flags(path: str) -> int:
    """The compiler flags of the ``from __future__ import ...`` statements of ``path``."""
    import __future__

    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    flags = 0
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            for alias in node.names:
                flags |= getattr(__future__, alias.name).compiler_flag
    return flags


def definition_dump(path: str, name: str) -> str:
    """A line-number-free dump of one top-level definition (to tell two versions' kernels apart)."""
    return ast.dump(extract(path, [name]).body[0], include_attributes=False)


def signature_of(path: str, name: str) -> List[str]:
    """The parameter names of a top-level function of ``path`` (positional then keyword-only)."""
    node = extract(path, [name]).body[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        raise LookupError(f"{path}: {name} is not a function")
    a = node.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]


def load(path: str, names: Iterable[str], *, tilelang_forced: Optional[dict] = None, sm120: bool = False,
         needs_tilelang: bool = False, extra: Optional[dict] = None) -> Dict[str, object]:
    """Execute the definitions of ``names`` from ``path`` (see the module docstring) and return the namespace.
    Raises ImportError when a package the code needs (tilelang, triton) is not importable here."""
    import torch
    import torch.nn.functional as F

    ns: Dict[str, object] = {"__name__": f"dsv4_sglang_source.{os.path.basename(path)[:-3]}", "__file__": path}
    helpers = sglang_helpers(sm120)
    ns.update(helpers)
    bi = dict(vars(builtins))
    bi["__import__"] = _import_with_stand_ins(helpers)
    ns["__builtins__"] = bi
    from typing import Any, Optional as _Optional, Tuple as _Tuple

    import math

    ns.update(torch=torch, F=F, functools=functools, math=math, Any=Any, Optional=_Optional, Tuple=_Tuple,
              FP8_DTYPE=torch.float8_e4m3fn, threading=threading)
    try:
        import triton
        import triton.language as tl

        ns.update(triton=triton, tl=tl)
    except ImportError:
        pass
    if needs_tilelang:
        import tilelang  # noqa: F401  (ImportError names what is missing)
        import tilelang.language as T

        proxy = TileLangProxy(tilelang, tilelang_forced)
        ns.update(tilelang=proxy, T=T, _load_tilelang=lambda: proxy)
    ns.update(extra or {})
    # the file's own __future__ imports only: compile() would otherwise inherit this module's (``annotations``), which
    # turns SGLang's TileLang annotations into strings that TileLang cannot resolve (names used only in annotations)
    code = compile(extract(path, names), path, "exec", flags=future_flags(path), dont_inherit=True)
    exec(code, ns)  # noqa: S102  (SGLang's own source, the file the user's SGLang runs)
    return ns


def wgmma_off_configs() -> dict:
    """TileLang pass configs that build the mma.sync class (what SM120 runs) on a wgmma GPU."""
    import tilelang

    key = getattr(tilelang.PassConfigKey, "TL_DISABLE_WGMMA", None)
    if key is None:
        raise ImportError(f"tilelang {getattr(tilelang, '__version__', '?')} has no PassConfigKey.TL_DISABLE_WGMMA")
    return {key: True}
