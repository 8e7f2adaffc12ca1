"""Per-process counters of the ops: calls by implementation, and the first word of every fallback.

Each op's public entry point calls ``count(op, impl)`` once per call it runs (so a CUDA graph counts its capture,
not its replays), and ``warn_once(op, message)`` where it takes a slower path than its default for a reason the user
should know (a missing extension, an unaligned input): logged at WARNING the first time a message is seen, counted
every time. The first call of each (op, impl) is logged at INFO, so a server's log says which kernels ran even when
the process is killed before it can print its exit summary. ``snapshot()`` is what the patch layer's exit summary,
the doctor and the end-to-end harness read; with ``DSV4_KERNEL_STATS_DIR`` set, every process also writes it to
``<dir>/<pid>.json`` whenever a new (op, impl) or fallback reason appears and at exit (the harness reads those).
Nothing here knows an engine.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
from collections import Counter
from typing import Dict

log = logging.getLogger("deepseek_v4_kernel")

STATS_DIR_ENV = "DSV4_KERNEL_STATS_DIR"

CALLS: Counter = Counter()        # (op, impl) -> calls
FALLBACKS: Counter = Counter()    # (op, message) -> calls
_lock = threading.Lock()


def count(op: str, impl: str) -> None:
    key = (op, impl)
    first = key not in CALLS
    CALLS[key] += 1   # (a Counter update is atomic enough under the GIL for a statistic)
    if first:
        log.info("deepseek_v4_kernel: %s: first call ran %s", op, impl)
        _write()


def warn_once(op: str, message: str) -> None:
    with _lock:
        first = (op, message) not in FALLBACKS
        FALLBACKS[(op, message)] += 1
    if first:
        log.warning("deepseek_v4_kernel: %s: %s", op, message)
        _write()


def snapshot() -> Dict[str, dict]:
    """{op: {"calls": {impl: n}, "fallbacks": {message: n}}} of this process."""
    out: Dict[str, dict] = {}
    for (op, impl), n in list(CALLS.items()):
        out.setdefault(op, {"calls": {}, "fallbacks": {}})["calls"][impl] = n
    for (op, msg), n in list(FALLBACKS.items()):
        out.setdefault(op, {"calls": {}, "fallbacks": {}})["fallbacks"][msg] = n
    return out


def summary() -> str:
    """One line: calls per op and implementation, fallbacks per op ("" when no op ran)."""
    snap = snapshot()
    parts = []
    for op in sorted(snap):
        calls = ", ".join(f"{impl} {n}" for impl, n in sorted(snap[op]["calls"].items()))
        falls = sum(snap[op]["fallbacks"].values())
        parts.append(f"{op}: {calls or 'no calls'}" + (f", {falls} slower-path calls" if falls else ""))
    return "; ".join(parts)


def _write() -> None:
    """The snapshot to $DSV4_KERNEL_STATS_DIR/<pid>.json (atomically), if that variable is set; never raises."""
    d = os.environ.get(STATS_DIR_ENV)
    if not d:
        return
    try:
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"{os.getpid()}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"pid": os.getpid(), "ops": snapshot()}, f)
        os.replace(path + ".tmp", path)
    except OSError as e:
        log.warning("deepseek_v4_kernel: cannot write the stats to %s: %s", d, e)


atexit.register(_write)


def reset() -> None:
    CALLS.clear()
    FALLBACKS.clear()
