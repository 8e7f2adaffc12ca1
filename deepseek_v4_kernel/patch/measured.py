"""``DSV4_KERNEL_PREFER=measured``: replace an op only where ``python -m deepseek_v4_kernel bench`` measured ours faster.

The bench command (deepseek_v4_kernel/bench) times each op at DeepSeek-V4 shapes against the kernel SGLang itself
would run at the patched call site on this GPU (its "default" path: FlashInfer's SM120 sparse MLA, the TileLang
indexer, DeepGEMM, ...) and writes a small JSON file per GPU and TP size. This module reads those files and answers
two questions:

* per op (``op_decision``, read by the conditions of targets.py when SGLang's module is imported in a worker):
  patch at all? Only if a file matches this GPU (name, compute capability), the installed SGLang version and this
  package's version, and ours won at least one size class of the op. A missing, unreadable or stale file means
  "do not patch", with the reason in the doctor's report.
* per call (``check``, for the adapters): ours lost this call's size class (batch rows / tokens) to a default
  path that runs on this GPU -> ``UnsupportedCase``, so the patch layer hands the call back to SGLang's original.
  A class nobody measured, or one whose default path cannot run here, stays ours (we never hand a call back to a
  kernel that would fail).

Stdlib only (the start-up path imports it); the file is read once per process.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import policy

SCHEMA = "deepseek_v4_kernel.bench/1"
PATH_ENV = "DSV4_KERNEL_MEASURED"      # a file (or a directory of them) instead of the per-user cache directory
MEASURED = "measured"                 # the DSV4_KERNEL_PREFER value
OPS = ("sparse_decode", "indexer_logits", "hc_prenorm", "fp4_moe")

# Size classes: the variable the per-call decision reads and the grid points the bench measures. A class covers the
# values above the previous grid point up to its own; the last class is open-ended (measured at its grid point).
CLASS_VARIABLE = {"sparse_decode": "b", "indexer_logits": "b", "hc_prenorm": "m", "fp4_moe": "tokens",
                  "fp8_linear": "m"}
CLASS_BOUNDS = {
    "sparse_decode": (1, 8, 32, 128),        # decode rows (b * s_q) per call
    "indexer_logits": (1, 8, 32),            # decode rows per call
    "hc_prenorm": (1, 8, 64, 256, 1024, 4096),
    "fp4_moe": (1, 8, 32, 128, 1024),
    # rows (tokens) per call; not in OPS until the bench times it (a file without it patches no fp8_linear row
    # under DSV4_KERNEL_PREFER=measured); above the adapters' crossover SGLang's GEMM runs anyway
    "fp8_linear": (1, 8, 16, 64),
}


def _op(op: str) -> str:
    if op not in CLASS_BOUNDS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    return op


def size_class(op: str, n: int, heads: Optional[int] = None) -> str:
    """The class label of a call of ``n`` rows (tokens): e.g. 'b2-8', 'm65-256', 'tokens129+'; sparse decode
    also keys on the query heads of the call ('h16/b2-8'), whose cost differs per TP size and padding."""
    bounds = CLASS_BOUNDS[_op(op)]
    var = CLASS_VARIABLE[op]
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (the call's {var}), got {n!r}")
    lo = 1
    label = None
    for i, hi in enumerate(bounds):
        if i == len(bounds) - 1:
            label = f"{var}{lo}+" if lo < hi else f"{var}{hi}"
            break
        if n <= hi:
            label = f"{var}{hi}" if lo == hi else f"{var}{lo}-{hi}"
            break
        lo = hi + 1
    if op == "sparse_decode":
        if not isinstance(heads, int) or heads < 1:
            raise ValueError(f"heads must be the call's query heads (a positive int) for sparse_decode, got {heads!r}")
        return f"h{heads}/{label}"
    return label


def class_representatives(op: str) -> Tuple[int, ...]:
    """The grid point measured for each class, in class order."""
    return CLASS_BOUNDS[_op(op)]


# ----------------------------------------------------------------------------- where the files live
def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "gpu"


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "deepseek_v4_kernel")


def default_path(gpu_name: str, capability: Tuple[int, int], tp: int) -> str:
    """Where ``bench`` writes by default (and this module looks): one file per GPU model and TP size."""
    env = os.environ.get(PATH_ENV)
    if env and not os.path.isdir(env):
        return env
    d = env or cache_dir()
    return os.path.join(d, f"bench-{_slug(gpu_name)}-sm{capability[0]}{capability[1]}-tp{int(tp)}.json")


def candidate_files(gpu_name: str, capability: Tuple[int, int]) -> List[str]:
    """The measured files for this GPU: DSV4_KERNEL_MEASURED (a file, or a directory), else the cache directory;
    every TP size's file (their classes key on the query heads, so they merge)."""
    env = os.environ.get(PATH_ENV)
    if env and not os.path.isdir(env):
        return [env]
    d = env or cache_dir()
    return sorted(glob.glob(os.path.join(d, f"bench-{_slug(gpu_name)}-sm{capability[0]}{capability[1]}-tp*.json")))


# ----------------------------------------------------------------------------- reading and validating
@dataclass
class Measured:
    ok: bool
    why: str                                   # one line: what was read, or why nothing applies
    files: List[str] = field(default_factory=list)
    classes: Dict[str, Dict[str, dict]] = field(default_factory=dict)   # op -> class label -> verdict


def validate(data: dict, gpu_name: str, capability: Tuple[int, int], sglang_version: Optional[str],
             package_version: str) -> Optional[str]:
    """None if ``data`` (a bench JSON) applies to this GPU and these versions; else why not (names the field)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        return f"schema is {data.get('schema') if isinstance(data, dict) else type(data).__name__!r}, expected {SCHEMA!r}"
    gpu = data.get("gpu") or {}
    name = gpu.get("nvml_name", gpu.get("name"))
    if name != gpu_name:
        return f"gpu.nvml_name is {name!r}, this GPU is {gpu_name!r}"
    if list(gpu.get("capability") or []) != list(capability):
        return f"gpu.capability is {gpu.get('capability')}, this GPU is {list(capability)}"
    versions = data.get("versions") or {}
    if versions.get("sglang") != sglang_version:
        return f"versions.sglang is {versions.get('sglang')!r}, installed is {sglang_version!r} (stale: run bench again)"
    if data.get("deepseek_v4_kernel") != package_version:
        return (f"deepseek_v4_kernel is {data.get('deepseek_v4_kernel')!r}, this package is {package_version!r} "
                f"(stale: run bench again)")
    if not isinstance(data.get("ops"), dict):
        return "ops is missing"
    return None


def read(files: List[str], gpu_name: str, capability: Tuple[int, int], sglang_version: Optional[str],
         package_version: str) -> Measured:
    if not files:
        where = os.environ.get(PATH_ENV) or cache_dir()
        return Measured(False, f"no measured file for {gpu_name} sm_{capability[0]}{capability[1]} in {where} "
                               f"(run: python -m deepseek_v4_kernel bench --tp <N>)")
    classes: Dict[str, Dict[str, dict]] = {}
    used, rejected = [], []
    for path in files:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            rejected.append(f"{path}: unreadable ({type(e).__name__}: {e})")
            continue
        why = validate(data, gpu_name, capability, sglang_version, package_version)
        if why:
            rejected.append(f"{path}: {why}")
            continue
        used.append(path)
        for op, rec in data["ops"].items():
            classes.setdefault(op, {}).update((rec or {}).get("classes") or {})
    if not used:
        return Measured(False, "; ".join(rejected), files=list(files))
    note = f" (ignored {'; '.join(rejected)})" if rejected else ""
    return Measured(True, f"read {', '.join(used)}{note}", files=used, classes=classes)


_LOADED: Optional[Measured] = None


def load() -> Measured:
    """The measured files for this process's GPU (NVML, no CUDA context) and SGLang, read once."""
    global _LOADED
    if _LOADED is None:
        try:
            from .. import __version__

            dev = policy.device_info()
            if not dev.capabilities:
                _LOADED = Measured(False, f"no GPU visible to NVML ({dev.error or 'none found'})")
            else:
                _LOADED = read(candidate_files(dev.names[0], dev.capabilities[0]), dev.names[0],
                               dev.capabilities[0], policy.sglang_version(), __version__)
        except Exception as e:  # a broken file never breaks start-up
            _LOADED = Measured(False, f"reading the measured files failed: {type(e).__name__}: {e}")
    return _LOADED


def _reset_for_tests() -> None:
    global _LOADED
    _LOADED = None


def prefer_measured() -> bool:
    return os.environ.get(policy.PREFER, "").strip().lower() == MEASURED


# ----------------------------------------------------------------------------- decisions
def op_decision(op: str, measured: Optional[Measured] = None) -> Tuple[bool, str]:
    """Whether to patch ``op``'s targets under PREFER=measured, and why (one phrase)."""
    m = measured or load()
    if not m.ok:
        return False, f"{policy.PREFER}=measured: {m.why}"
    cls = m.classes.get(_op(op)) or {}
    won = sorted(k for k, v in cls.items() if v.get("winner") == "ours")
    lost = sorted(k for k, v in cls.items() if v.get("winner") != "ours")
    if not cls:
        return False, f"{policy.PREFER}=measured: {op} was not measured ({', '.join(m.files)})"
    if not won:
        return False, f"{policy.PREFER}=measured: SGLang's kernel was faster in every class of {op} ({', '.join(lost)})"
    tail = f"; SGLang's kernel kept where it won ({', '.join(lost)})" if lost else ""
    return True, f"{policy.PREFER}=measured: ours faster at {', '.join(won)}{tail}"


def prefers_ours(op: str, size_class_label: str, measured: Optional[Measured] = None) -> Tuple[bool, str]:
    """Whether a call of this class runs ours (True unless ours measured slower there against a default path
    that runs on this GPU), and why."""
    m = measured or load()
    if not m.ok:
        return True, m.why
    v = (m.classes.get(op) or {}).get(size_class_label)
    if v is None:
        return True, f"{op} {size_class_label} not measured"
    if v.get("winner") == "ours":
        return True, f"measured faster at {size_class_label}"
    if not v.get("handback_runnable", False):
        return True, f"measured slower at {size_class_label}, but SGLang's {v.get('sglang')} cannot run here"
    return False, (f"{op}: measured slower at {size_class_label} ({v.get('ours_us')} us against "
                   f"{v.get('sglang')} {v.get('sglang_us')} us): SGLang's kernel runs")


def check(op: str, size_class_label: str, original: Optional[str] = None) -> None:
    """For the adapters: raise KeepOriginal (the patch layer then calls SGLang's original, counted as kept) where
    ours was measured slower for this class: under DSV4_KERNEL_PREFER=measured by the user's bench file; without
    DSV4_KERNEL_PREFER by the project's own measurement (BUILTIN_KEEP) for the ``original`` kernel the adapter
    replaces. DSV4_KERNEL_PREFER=ours keeps ours everywhere."""
    from ..errors import KeepOriginal

    if prefer_measured():
        ours, why = prefers_ours(op, size_class_label)
        if not ours:
            raise KeepOriginal(why)
        return
    why = builtin_keep(op, size_class_label, original)
    if why:
        raise KeepOriginal(why)


def builtin_keep(op: str, size_class_label: str, original: Optional[str]) -> Optional[str]:
    """Why SGLang's ``original`` kernel stays for this class without a bench file of the user's (BUILTIN_KEEP), or
    None: always None under DSV4_KERNEL_PREFER=ours or =measured (the user's file decides then)."""
    if original is None or policy.prefer_ours() or prefer_measured():
        return None
    why = BUILTIN_KEEP.get((op, size_class_label, original))
    return f"{op} {size_class_label}: {why} ({policy.PREFER}=ours runs ours)" if why else None


# Without a bench file of the user's: (op, size class, the SGLang kernel the adapter replaces) where that kernel was
# measured faster than ours -> the evidence. benchmarks/bench_competitors.py on an H200, both sides built as SM120
# builds them (mma.sync: Triton with DISABLE_MMA_V3=1, TileLang with TL_DISABLE_WGMMA), CUDA-graph replay; the
# tables are in docs/performance.md.
BUILTIN_KEEP: Dict[Tuple[str, str, str], str] = {
    ("indexer_logits", "b1", "tilelang"):
        "SGLang's TileLang kernel measured faster (4.5 us against ours 4.9 us at 16K context, H200 in the mma.sync "
        "class SM120 runs)",
    # SGLang 0.5.21-0.5.23's mhc_pre, its split-K TileLang kernel with warp specialisation off as on SM120, against
    # ours with the splits SGLang passes on the DeepGEMM path; ours leads at m 1 / 8 / 1024 (1.55x / 1.17x / 1.36x)
    ("hc_prenorm", "m9-64", "tilelang_mhc_pre"):
        "SGLang's TileLang split-K pre-GEMM measured faster (3.9 us against ours 4.2 us at m 64, H200 in the "
        "mma.sync class SM120 runs)",
    ("hc_prenorm", "m65-256", "tilelang_mhc_pre"):
        "SGLang's TileLang split-K pre-GEMM measured faster (6.4 us against ours 6.9 us at m 256, H200 in the "
        "mma.sync class SM120 runs)",
}


def doctor_lines() -> List[str]:
    """What the doctor prints about the measured files (the path, and per op what they decide)."""
    dev = policy.device_info()
    lines = [f"prefer measured: {prefer_measured()} ({policy.PREFER}={os.environ.get(policy.PREFER, '')!r})"]
    if dev.capabilities:
        lines.append(f"measured file: {default_path(dev.names[0], dev.capabilities[0], 1).replace('-tp1.json', '-tp<N>.json')}")
    m = load()
    lines.append(f"measured: {m.why}")
    if m.ok:
        for op in OPS:
            lines.append(f"  {op}: {op_decision(op, m)[1]}")
    return lines
