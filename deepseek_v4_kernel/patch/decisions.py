"""Measured dispatch (the default, ``DSV4_KERNEL_PREFER`` unset or ``measured``): which kernel runs per op and size
class, decided by timing ours against SGLang's kernels on this GPU at the server's first start, cached for later
starts.

* The cache key (``environment_key``): the GPU (NVML name, CUDA cores, compute capability), the driver, the versions
  of SGLang, FlashInfer, DeepGEMM, Triton, torch and TileLang, and our build (package version and a digest of the
  installed package's files and library). One file per key, ``dispatch-<gpu>-<digest>.json``, so another version of
  anything is another file (the old one stays for the old set-up; ``python -m deepseek_v4_kernel cache clear`` drops
  them).
* Where (``cache_dir``): ``DSV4_KERNEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/deepseek_v4_kernel``, else
  ``~/.cache/deepseek_v4_kernel``; a directory that cannot be written (a read-only mount, another user's) falls back to
  ``/tmp/deepseek_v4_kernel-<uid>``, and the start-up line says why.
* Concurrent workers (``ensure``): the file is read and written under an exclusive ``fcntl`` lock on ``<file>.lock``;
  the first TP worker to take it times its GPU and writes (atomically: a temporary file in the same directory, then
  ``os.replace``), the others wait for the lock and read what it wrote, so every rank of a server decides alike. A
  worker that waits longer than LOCK_WAIT_S times its own GPU and merges its result under the lock.
* Per call (``lookup``, for patch/measured.check): the decision of this process's TP size for an op and class, or
  None (not measured: the built-in rules decide).

Stdlib only; nothing here imports torch (the timing itself is deepseek_v4_kernel/bench/startup.py's).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import glob
import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from . import policy

SCHEMA = "deepseek_v4_kernel.decisions/1"
CACHE_DIR_ENV = "DSV4_KERNEL_CACHE_DIR"
LOCK_WAIT_S = 120.0        # how long a worker waits for another's measurement before timing its own GPU
KEY_FIELDS = ("gpu", "cuda_cores", "capability", "driver", "sglang", "flashinfer", "deep_gemm", "triton", "torch",
              "tilelang", "deepseek_v4_kernel", "build")
_DISTRIBUTIONS = {"sglang": ("sglang",), "flashinfer": ("flashinfer-python", "flashinfer"),
                  "deep_gemm": ("sgl-deep-gemm", "deep-gemm", "deep_gemm"), "triton": ("triton",),
                  "torch": ("torch",), "tilelang": ("tilelang",)}


# ----------------------------------------------------------------------------- where
def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "gpu"


def _fallback_dir() -> str:
    return os.path.join("/tmp", f"deepseek_v4_kernel-{os.getuid() if hasattr(os, 'getuid') else 'user'}")


def cache_dirs() -> List[str]:
    """The candidate directories, in order: DSV4_KERNEL_CACHE_DIR (if set), the per-user cache dir, the /tmp one."""
    out = []
    env = os.environ.get(CACHE_DIR_ENV, "").strip()
    if env:
        out.append(os.path.abspath(env))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out.append(os.path.join(base, "deepseek_v4_kernel"))
    out.append(_fallback_dir())
    return list(dict.fromkeys(out))


def _writable(d: str) -> Optional[str]:
    """None if ``d`` is (or can be made) a directory this process can create files in; else why not."""
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        return f"{d} cannot be created ({e.strerror or e})"
    if not os.path.isdir(d):
        return f"{d} is not a directory"
    probe = os.path.join(d, f".probe-{os.getpid()}")
    try:
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        return f"{d} is not writable ({e.strerror or e})"
    return None


def cache_dir() -> Tuple[str, str]:
    """(the directory decisions are written to, "" or why the first choices were passed over)."""
    passed = []
    dirs = cache_dirs()
    for d in dirs:
        why = _writable(d)
        if why is None:
            return d, "; ".join(passed)
        passed.append(why)
    return dirs[-1], "; ".join(passed)   # nothing writable: reading still works, writing will say why


# ----------------------------------------------------------------------------- the key
def _dist_version(names) -> Optional[str]:
    from importlib import metadata

    for n in names:
        try:
            return metadata.version(n)
        except Exception:  # noqa: BLE001
            continue
    return None


def build_digest() -> str:
    """Our build: a digest of the installed package's files (name, size, modification time) and its library."""
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha1()
    for root, dirs, files in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith((".py", ".so")):
                p = os.path.join(root, f)
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                h.update(f"{os.path.relpath(p, pkg)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    lib = os.environ.get("DSV4_KERNEL_LIB")
    if lib and os.path.exists(lib):
        st = os.stat(lib)
        h.update(f"lib:{lib}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def environment_key(device_index: int = 0) -> Dict[str, object]:
    """The cache key of the GPU at this process's visible index ``device_index`` (NVML: no CUDA context)."""
    from .. import __version__

    dev = policy.device_info()
    i = device_index if 0 <= device_index < len(dev.names) else 0
    key: Dict[str, object] = {
        "gpu": dev.names[i] if dev.names else None,
        "cuda_cores": dev.cores[i] if i < len(dev.cores) else None,
        "capability": "sm_%d%d" % dev.capabilities[i] if dev.capabilities else None,
        "driver": dev.driver,
    }
    for k, names in _DISTRIBUTIONS.items():
        key[k] = _dist_version(names)
    key["deepseek_v4_kernel"] = __version__
    key["build"] = build_digest()
    return key


def key_digest(key: Dict[str, object]) -> str:
    return hashlib.sha1(json.dumps({k: key.get(k) for k in KEY_FIELDS}, sort_keys=True).encode()).hexdigest()[:16]


def file_name(key: Dict[str, object]) -> str:
    return f"dispatch-{_slug(str(key.get('gpu') or 'gpu'))}-{key_digest(key)}.json"


def key_difference(old: Dict[str, object], new: Dict[str, object]) -> str:
    """'sglang 0.5.17 -> 0.5.23, build a1.. -> b2..': the components that differ."""
    return ", ".join(f"{k} {old.get(k)} -> {new.get(k)}" for k in KEY_FIELDS if old.get(k) != new.get(k))


# ----------------------------------------------------------------------------- files
class LockTimeout(TimeoutError):
    """Another process held the cache file's lock longer than the wait allowed."""


@contextlib.contextmanager
def locked(path: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """An exclusive lock on ``path``'s lock file (fcntl.flock: released when the holder exits, even by a crash)."""
    import fcntl

    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if time.monotonic() >= deadline:
                    raise LockTimeout(f"{path}.lock held by another process for more than {wait_s:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def write_atomic(path: str, data: dict) -> None:
    """Write ``data`` as JSON so that a reader sees the old file or the whole new one, never a part."""
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_entry(path: str, key: Dict[str, object]) -> Tuple[Optional[dict], str]:
    """(the entry at ``path`` if it is one for ``key``, else None; why not)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None, "no file"
    except (OSError, ValueError) as e:
        return None, f"{path}: unreadable ({type(e).__name__}: {e})"
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        return None, f"{path}: schema is {schema!r}, expected {SCHEMA!r}"
    diff = key_difference(data.get("key") or {}, key)
    if diff:
        return None, f"{path}: stale ({diff})"
    if not isinstance(data.get("tp"), dict):
        return None, f"{path}: no tp section"
    return data, ""


def new_entry(key: Dict[str, object]) -> dict:
    return {"schema": SCHEMA, "key": dict(key), "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "tp": {}}


def missing(entry: Optional[dict], tp: int, wanted: Dict[str, List[str]],
            undecided_counts: bool = True) -> Dict[str, List[str]]:
    """The (op, class labels) of ``wanted`` that ``entry`` has nothing for at TP ``tp``: neither a decision nor (with
    ``undecided_counts``, the default) a recorded "undecided" (a class an earlier start could not time, e.g. its
    budget ran out: the built-in rules decide it, and later starts do not time it again; ``cache measure`` does)."""
    ops = ((entry or {}).get("tp") or {}).get(str(tp), {}).get("ops", {})
    out = {}
    for op, labels in wanted.items():
        rec = ops.get(op) or {}
        have = set(rec.get("classes") or {})
        if undecided_counts:
            have |= set(rec.get("undecided") or {})
        left = [lb for lb in labels if lb not in have]
        if left:
            out[op] = left
    return out


def merge(entry: dict, tp: int, results: Dict[str, dict], shapes: Optional[dict] = None) -> dict:
    """Add ``results`` ({op: {"classes": {label: decision}, "undecided": {label: why}, ...}}) to ``entry``'s TP
    section: a class decided now leaves the undecided record, one undecided now replaces an older decision's place
    only where it had none (a decision is never dropped for a later start that could not time it)."""
    sec = entry["tp"].setdefault(str(tp), {"ops": {}})
    if shapes is not None:
        sec["shapes"] = shapes
    for op, rec in results.items():
        dst = sec["ops"].setdefault(op, {"classes": {}})
        for k, v in rec.items():
            if k == "classes":
                dst["classes"].update(v)
            elif k != "undecided":
                dst[k] = v
        und = dict(dst.get("undecided") or {})
        und.update({lb: why for lb, why in (rec.get("undecided") or {}).items() if lb not in dst["classes"]})
        for lb in rec.get("classes") or {}:
            und.pop(lb, None)
        if und:
            dst["undecided"] = und
        else:
            dst.pop("undecided", None)
    return entry


def undecided_of(entry: Optional[dict], tp: int, wanted: Optional[Dict[str, List[str]]] = None
                 ) -> Dict[str, Dict[str, str]]:
    """{op: {label: why}} of the recorded undecided classes at TP ``tp`` (of ``wanted`` only, if given)."""
    ops = ((entry or {}).get("tp") or {}).get(str(tp), {}).get("ops", {})
    out = {}
    for op, rec in ops.items():
        und = {lb: w for lb, w in ((rec or {}).get("undecided") or {}).items()
               if wanted is None or lb in (wanted.get(op) or ())}
        if und:
            out[op] = und
    return out


def other_entries(key: Dict[str, object]) -> List[Tuple[str, str]]:
    """(path, what differs) of the cached entries for this GPU model under other keys (stale for this set-up)."""
    out = []
    mine = file_name(key)
    for d in cache_dirs():
        for p in sorted(glob.glob(os.path.join(d, f"dispatch-{_slug(str(key.get('gpu') or 'gpu'))}-*.json"))):
            if os.path.basename(p) == mine:
                continue
            try:
                with open(p) as f:
                    old = json.load(f).get("key") or {}
            except (OSError, ValueError, AttributeError):
                continue
            out.append((p, key_difference(old, key)))
    return out


def find(key: Dict[str, object]) -> Tuple[Optional[str], Optional[dict], List[str]]:
    """(path, entry) of the first valid entry for ``key`` in the candidate directories, and why others were not."""
    notes = []
    for d in cache_dirs():
        p = os.path.join(d, file_name(key))
        entry, why = read_entry(p, key)
        if entry is not None:
            return p, entry, notes
        if why != "no file":
            notes.append(why)
    return None, None, notes


# ----------------------------------------------------------------------------- this process's decisions
@dataclass
class Active:
    """What decides in this process: the file, the TP size, and per op and class the decision."""
    path: Optional[str]
    tp: int
    source: str                                     # "read", "measured", or "none"
    classes: Dict[str, Dict[str, dict]] = field(default_factory=dict)
    read_count: int = 0                             # decisions taken from the file as it was
    measured_count: int = 0                         # decisions timed in this process
    seconds: float = 0.0                            # what deciding added to this start
    notes: List[str] = field(default_factory=list)
    undecided: Dict[str, Dict[str, str]] = field(default_factory=dict)   # op -> label -> why (built-in rules)
    undecided_new: int = 0                          # of those, recorded by this process

    @property
    def undecided_count(self) -> int:
        return sum(len(v) for v in self.undecided.values())

    def line(self) -> str:
        """The start-up line's words for it."""
        where = self.path or "no file"
        parts = []
        if self.read_count:
            parts.append(f"{self.read_count} decisions read from {where}")
        if self.measured_count:
            parts.append(f"{self.measured_count} measured here and written to {where}")
        if self.undecided_count:
            whys = sorted({w.split(":")[0] for v in self.undecided.values() for w in v.values()})
            parts.append(f"{self.undecided_count} undecided ({'; '.join(whys)[:120]}; "
                         f"{'recorded now' if self.undecided_new else 'as recorded'}: the built-in rules decide them; "
                         f"python -m deepseek_v4_kernel cache measure times them)")
        if not parts:
            parts.append(f"no decision ({where})")
        text = f"measured dispatch, TP {self.tp}: " + ", ".join(parts) + f" ({self.seconds:.2f} s)"
        return text + (f"; {'; '.join(self.notes)}" if self.notes else "")


_ACTIVE: Optional[Active] = None


def active() -> Optional[Active]:
    return _ACTIVE


def _set_active(a: Optional[Active]) -> None:
    global _ACTIVE
    _ACTIVE = a


def lookup(op: str, label: str) -> Optional[dict]:
    """This process's decision for ``op`` at class ``label`` (None: not measured here)."""
    a = _ACTIVE
    if a is None:
        return None
    return (a.classes.get(op) or {}).get(label)


def _classes_of(entry: dict, tp: int) -> Dict[str, Dict[str, dict]]:
    ops = (entry.get("tp") or {}).get(str(tp), {}).get("ops", {})
    return {op: dict((rec or {}).get("classes") or {}) for op, rec in ops.items()}


def _count(d: Dict[str, Dict]) -> int:
    return sum(len(v) for v in d.values())


def _decided_of(entry: Optional[dict], tp: int, wanted: Dict[str, List[str]]) -> int:
    classes = _classes_of(entry, tp) if entry else {}
    return sum(1 for op, labels in wanted.items() for lb in labels if lb in (classes.get(op) or {}))


def ensure(tp: int, wanted: Dict[str, List[str]], measure: Callable[[Dict[str, List[str]]], Dict[str, dict]],
           device_index: int = 0, shapes: Optional[dict] = None, wait_s: float = LOCK_WAIT_S,
           key: Optional[Dict[str, object]] = None, remeasure: bool = False) -> Active:
    """The decisions for ``wanted`` ({op: [class labels]}) at TP ``tp``: read from this key's file, else (the classes
    it has nothing for) timed by ``measure(missing) -> {op: {"classes": {label: decision}, "undecided": {label:
    why}, ...}}`` under the file's lock and written back, the undecided ones too (later starts read them as
    undecided: the built-in rules decide, nothing is timed again). ``remeasure`` (``cache measure``): time every
    class of ``wanted`` again. Sets and returns this process's Active. Never raises: a failure leaves the classes
    undecided (the built-in rules then decide) and says why in the notes."""
    t0 = time.monotonic()
    notes: List[str] = []
    key = key or environment_key(device_index)
    path, entry, why_not = find(key)
    notes += why_not
    if entry is not None and not remeasure and not missing(entry, tp, wanted):
        a = Active(path, tp, "read", _classes_of(entry, tp), notes=notes, undecided=undecided_of(entry, tp, wanted))
        a.read_count = _decided_of(entry, tp, wanted)
        a.seconds = time.monotonic() - t0
        _set_active(a)
        return a
    if entry is None:
        stale = other_entries(key)
        if stale:
            notes.append("re-measured: the cached entries are for another set-up ("
                         + "; ".join(f"{os.path.basename(p)}: {d}" for p, d in stale[:2]) + ")")
    d, why = cache_dir()
    if why:
        notes.append(f"cache in {d}: {why}")
    if path is None or os.path.dirname(path) != d:
        path = os.path.join(d, file_name(key))
    read_count = measured_count = undecided_new = 0
    classes: Dict[str, Dict[str, dict]] = {}
    undecided: Dict[str, Dict[str, str]] = {}
    try:
        try:
            with locked(path, wait_s):
                current, _ = read_entry(path, key)            # another worker may have written it meanwhile
                todo = wanted if remeasure else missing(current, tp, wanted)
                todo = {op: list(v) for op, v in todo.items() if v}
                if todo:
                    results = measure(todo)
                    current = merge(current or new_entry(key), tp, results, shapes)
                    measured_count = sum(len(r.get("classes") or {}) for r in results.values())
                    undecided_new = sum(len(r.get("undecided") or {}) for r in results.values())
                    write_atomic(path, current)
                read_count = _decided_of(current, tp, wanted) - measured_count
                classes = _classes_of(current, tp) if current else {}
                undecided = undecided_of(current, tp, wanted)
        except LockTimeout as e:                           # the holder is stuck or slow: time this GPU ourselves
            notes.append(f"{e}: timed this GPU without waiting")
            results = measure({op: list(v) for op, v in wanted.items() if v})
            measured_count = sum(len(r.get("classes") or {}) for r in results.values())
            undecided_new = sum(len(r.get("undecided") or {}) for r in results.values())
            with locked(path, wait_s):
                current, _ = read_entry(path, key)
                current = merge(current or new_entry(key), tp, results, shapes)
                write_atomic(path, current)
            classes = _classes_of(current, tp)
            undecided = undecided_of(current, tp, wanted)
    except Exception as e:  # noqa: BLE001 - deciding never breaks a start: the built-in rules decide then
        notes.append(f"measured dispatch failed ({type(e).__name__}: {e}); the built-in rules decide")
    a = Active(path, tp, "measured" if measured_count or undecided_new else ("read" if read_count else "none"),
               classes, max(0, read_count), measured_count, time.monotonic() - t0, notes, undecided, undecided_new)
    _set_active(a)
    return a


# ----------------------------------------------------------------------------- what a person (or the harness) reads
def describe(entry: dict) -> List[str]:
    """One line per TP size, op and class: who runs it, with the times and what else was timed."""
    lines = []
    for tp, sec in sorted((entry.get("tp") or {}).items()):
        for op, rec in sorted((sec.get("ops") or {}).items()):
            for label, c in (rec.get("classes") or {}).items():
                if c.get("winner") == "ours":
                    who = "ours"
                else:
                    who = f"SGLang's {c.get('sglang')}" if c.get("handback_runnable", True) else "ours"
                times = f"ours {c.get('ours_us')} us, {c.get('sglang')} {c.get('sglang_us')} us"
                tail = f" ({c['why']})" if c.get("why") else ""
                lines.append(f"tp{tp} {op} {label}: {who} runs ({times}){tail}")
            for label, why in ((rec or {}).get("undecided") or {}).items():
                lines.append(f"tp{tp} {op} {label}: undecided ({why}): the built-in rules decide")
    return lines


def entries(paths: Optional[List[str]] = None) -> List[Tuple[str, Optional[dict], str]]:
    """(path, data or None, why not) of every cached entry (or of ``paths``)."""
    if paths is None:
        paths = [p for d in cache_dirs() for p in sorted(glob.glob(os.path.join(d, "dispatch-*.json")))]
    out = []
    for p in paths:
        try:
            with open(p) as f:
                data = json.load(f)
            out.append((p, data, "" if data.get("schema") == SCHEMA else f"schema {data.get('schema')!r}"))
        except (OSError, ValueError, AttributeError) as e:
            out.append((p, None, f"{type(e).__name__}: {e}"))
    return out


def doctor_lines() -> List[str]:
    """What the doctor prints: the mode, the file for this GPU's key and its decisions, other (stale) entries."""
    try:
        mode = policy.prefer_mode()
    except Exception as e:  # noqa: BLE001 - the doctor reports, never fails
        return [f"dispatch: {e}"]
    lines = [f"dispatch: {mode} ({policy.PREFER}={os.environ.get(policy.PREFER, '')!r}; accepted: "
             f"{', '.join(policy.PREFER_MODES)})"]
    d, why = cache_dir()
    lines.append(f"dispatch cache: {d}" + (f" ({why})" if why else ""))
    if not policy.device_info().names:
        return lines
    key = environment_key(0)
    path, entry, notes = find(key)
    if entry is None:
        lines.append(f"dispatch decisions for this set-up: none yet ({file_name(key)}: measured at the first start "
                     f"of a server)" + (f"; {'; '.join(notes)}" if notes else ""))
    else:
        lines.append(f"dispatch decisions for this set-up: {path}")
        lines += [f"  {x}" for x in describe(entry)]
    for p, diff in other_entries(key):
        lines.append(f"  other entry (not this set-up: {diff}): {p}")
    return lines


def clear() -> List[str]:
    """Delete every cached entry (and its lock file); returns the paths removed."""
    gone = []
    for d in cache_dirs():
        for p in glob.glob(os.path.join(d, "dispatch-*.json")) + glob.glob(os.path.join(d, "dispatch-*.json.lock")):
            try:
                os.unlink(p)
                gone.append(p)
            except OSError:
                pass
    return gone
