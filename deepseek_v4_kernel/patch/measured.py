"""Which kernel a call runs, per op and size class: the size classes, the per-call check the adapters make, the
built-in keep rules, and the user's bench files.

``check(op, class, original)`` raises KeepOriginal where SGLang's kernel should run for that class. What decides
depends on ``DSV4_KERNEL_PREFER`` (policy.prefer_mode):

* ``measured`` (the default, also when unset): a bench file of the user's (``python -m deepseek_v4_kernel bench``,
  read below) when one matches this GPU, SGLang and this package, else the start-up measurement of this server
  (patch/decisions.py: ours against SGLang's kernels timed at the first start, cached); a class neither timed falls
  to the built-in rules.
* ``builtin``: the built-in rules only (BUILTIN_KEEP: measured by the project on an H200 in SM120's instruction
  class), no timing at start-up.
* ``ours``: ours everywhere.

The bench files: ``bench`` times each op at DeepSeek-V4 shapes against the kernel SGLang would run at the patched
call site on this GPU and writes a JSON file per GPU and TP size; a missing, unreadable or stale file is ignored.
A class nobody measured, or one whose SGLang path cannot run here, stays ours (a call is never handed back to a
kernel that would fail).

To extend with an op: add it to OPS, CLASS_VARIABLE and CLASS_BOUNDS (its size classes). Stdlib only (the start-up
path imports it); the files are read once per process.
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
OPS = ("sparse_decode", "indexer_logits", "hc_prenorm", "fp4_moe", "fp8_linear")

# Size classes: the variable the per-call decision reads and the grid points the bench measures. A class covers the
# values above the previous grid point up to its own; the last class is open-ended (measured at its grid point).
CLASS_VARIABLE = {"sparse_decode": "b", "indexer_logits": "b", "hc_prenorm": "m", "fp4_moe": "tokens",
                  "fp8_linear": "m"}
CLASS_BOUNDS = {
    "sparse_decode": (1, 8, 32, 128),        # decode rows (b * s_q) per call
    "indexer_logits": (1, 8, 32),            # decode rows per call
    "hc_prenorm": (1, 8, 64, 256, 1024, 4096),
    "fp4_moe": (1, 8, 32, 128, 1024),
    # rows (tokens) per call; above the adapters' crossover (64) SGLang's GEMM runs anyway
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
    """DSV4_KERNEL_PREFER is "measured" or unset (the default): measured dispatch (patch/decisions.py)."""
    return policy.prefer_mode() == MEASURED


def bench_file_decides() -> bool:
    """A bench file of the user's (``python -m deepseek_v4_kernel bench``) matches this GPU and these versions: under
    measured dispatch it decides, in place of the start-up measurement (it times the whole grid)."""
    return prefer_measured() and load().ok


# ----------------------------------------------------------------------------- decisions
def op_decision(op: str, measured: Optional[Measured] = None) -> Tuple[bool, str]:
    """Whether to patch ``op``'s targets at all by the user's bench file, and why (one phrase); without a valid
    bench file, True (each call then asks check())."""
    m = measured or load()
    if not m.ok:
        return True, f"{policy.PREFER}=measured: decided per call ({m.why})"
    if op not in m.classes and op not in CLASS_BOUNDS:
        return True, f"{op} is not measured per size class"
    cls = m.classes.get(op) or {}
    won = sorted(k for k, v in cls.items() if v.get("winner") == "ours")
    lost = sorted(k for k, v in cls.items() if v.get("winner") != "ours")
    if not cls:
        return False, f"{policy.PREFER}=measured: {op} was not measured ({', '.join(m.files)})"
    if not won:
        return False, f"{policy.PREFER}=measured: SGLang's kernel was faster in every class of {op} ({', '.join(lost)})"
    tail = f"; SGLang's kernel kept where it won ({', '.join(lost)})" if lost else ""
    return True, f"{policy.PREFER}=measured: ours faster at {', '.join(won)}{tail}"


def prefers_ours(op: str, size_class_label: str, measured: Optional[Measured] = None) -> Tuple[bool, str]:
    """Whether a call of this class runs ours by the user's bench file (True unless ours measured slower there against
    a default path that runs on this GPU), and why."""
    m = measured or load()
    if not m.ok:
        return True, m.why
    return verdict(op, size_class_label, (m.classes.get(op) or {}).get(size_class_label))


def verdict(op: str, label: str, v: Optional[dict]) -> Tuple[bool, str]:
    """Whether ours runs for one measured class record ``v`` (a bench file's or the start-up measurement's)."""
    if v is None:
        return True, f"{op} {label} not measured"
    if v.get("winner") == "ours":
        return True, f"measured faster at {label}"
    if not v.get("handback_runnable", False):
        return True, f"measured slower at {label}, but SGLang's {v.get('sglang')} cannot run here"
    return False, (f"{op}: measured slower at {label} ({v.get('ours_us')} us against "
                   f"{v.get('sglang')} {v.get('sglang_us')} us): SGLang's kernel runs")


def _kind(name: Optional[str]) -> Optional[str]:
    """The kind of SGLang kernel a competitor name denotes (what an adapter's ``original`` says)."""
    for k in ("tilelang", "flashinfer", "deep_gemm", "triton", "torch", "flashmla", "marlin", "cutlass"):
        if name and k in name.lower():
            return k
    return None


def check(op: str, size_class_label: str, original: Optional[str] = None) -> None:
    """For the adapters: raise KeepOriginal (the patch layer then calls SGLang's original, counted as kept) where
    ours was measured slower for this class. DSV4_KERNEL_PREFER=ours: never. Measured dispatch (the default): the
    user's bench file if one matches, else the start-up measurement of this server (patch/decisions.py) where it
    timed this class against the ``original`` kind the adapter replaces (or against whatever runs there, for an
    adapter that does not say); a class it did not time, and DSV4_KERNEL_PREFER=builtin, fall to the built-in rules
    (BUILTIN_KEEP) for that ``original``."""
    from ..errors import KeepOriginal
    from . import decisions

    mode = policy.prefer_mode()
    if mode == "ours":
        return
    if mode == MEASURED:
        if load().ok:
            ours, why = prefers_ours(op, size_class_label)
            if not ours:
                raise KeepOriginal(why)
            return
        d = decisions.lookup(op, size_class_label)
        if d is not None and (original is None or _kind(d.get("sglang")) in (None, original)):
            ours, why = verdict(op, size_class_label, d)
            if not ours:
                raise KeepOriginal(f"{why} (measured at this server's start; {decisions.active().path})")
            return
    why = builtin_keep(op, size_class_label, original)
    if why:
        raise KeepOriginal(why)


def builtin_keep(op: str, size_class_label: str, original: Optional[str]) -> Optional[str]:
    """Why SGLang's ``original`` kernel stays for this class by the built-in rules (BUILTIN_KEEP; a "*" class
    covers every class), or None; always None under DSV4_KERNEL_PREFER=ours."""
    if original is None or policy.prefer_ours():
        return None
    why = BUILTIN_KEEP.get((op, size_class_label, original)) or BUILTIN_KEEP.get((op, "*", original))
    return f"{op} {size_class_label}: {why} ({policy.PREFER}=ours runs ours)" if why else None


# Without a bench file of the user's: (op, size class, the SGLang kernel the adapter replaces) where that kernel was
# measured faster than ours -> the evidence. benchmarks/bench_competitors.py on an H200, both sides built as SM120
# builds them (mma.sync: Triton with DISABLE_MMA_V3=1, TileLang with TL_DISABLE_WGMMA), CUDA-graph replay; the
# tables are in docs/performance.md.
BUILTIN_KEEP: Dict[Tuple[str, str, str], str] = {
    # FlashInfer's native SM120 sparse MLA (SGLang 0.5.15+ by default) cannot be timed on the H200: it stays unless
    # this GPU's measurement says ours is faster
    ("sparse_decode", "*", "flashinfer"):
        "SGLang runs FlashInfer's native SM120 sparse MLA kernel, not timed against ours on this GPU",
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
    """What the doctor prints about dispatch: the mode, the start-up measurement's file and decisions
    (patch/decisions.py), and a bench file of the user's if one applies."""
    from . import decisions

    lines = decisions.doctor_lines()
    dev = policy.device_info()
    m = load()
    if m.ok:
        lines.append(f"bench file (decides in place of the start-up measurement): {m.why}")
        for op in OPS:
            lines.append(f"  {op}: {op_decision(op, m)[1]}")
    elif dev.capabilities:
        lines.append(f"bench file: none applies ({m.why})")
    return lines
