"""Which MoE runner serves DeepSeek-V4's MXFP4 experts where SGLang's own default is FlashInfer's (``auto`` resolved to
``flashinfer_mxfp4``: 0.5.16+ on SM120, 0.5.23 on sm_90 too): decided in SGLang's launcher, where it resolves
``--moe-runner-backend auto`` (targets.py, the fp4_moe runner rows).

The candidates: SGLang's auto choice (``flashinfer_mxfp4``: FlashInfer's CUTLASS W4A8 kernel on SM120, W4A16 on
sm_90), SGLang's Marlin MXFP4 runner (``marlin``, W4A16 mma.sync: sm_90 and SM120), and ours (behind SGLang's
``triton`` runner, whose ``Fp8MoEMethod.apply`` patch/adapters.py replaces). FlashInfer's and Marlin's quant methods
process the weights into their own layouts at load, so the choice is made before the model loads, in the launcher.
It comes from measured dispatch's cache (patch/decisions.py, op ``fp4_moe_runner``): at the first start of a set-up
the launcher times all three in a subprocess (``python -m deepseek_v4_kernel cache measure --op fp4_moe_runner``,
MEASURE_TIMEOUT_S at most; SGLang's own weight preparation and call for theirs, bench/moe_competitors.py; the
subprocess's CUDA context is gone before SGLang starts its workers), later starts read the file.

The rule (``decide``): among the runners timed (and checked against float64) in every decode class timed
(DECODE_ROWS: 1, 8 and 32 tokens per call, each class at its largest size), the one with the least summed us per
call, i.e. the fastest over a decode step at each of those batch sizes. A runner that could not be timed is never
chosen; if SGLang's own choice could not be timed for a reason that may pass (it would JIT-compile first), SGLang's
choice stays; where it cannot run on this GPU the fastest of the others is taken. A backend the user passed is never
changed (SGLang declares flashinfer_mxfp4 only for ``auto``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Dict, Optional, Tuple

from . import decisions, policy

log = logging.getLogger("deepseek_v4_kernel")

OP = "fp4_moe_runner"
MEASURE_TIMEOUT_S = 30.0
DECODE_ROWS = (1, 8, 32)          # the decode classes the runner choice is timed at (tokens per call)
OURS_BACKEND = "triton"           # SGLang's runner whose quant method (Fp8MoEMethod.apply) our adapter replaces
FLASHINFER_BACKEND = "flashinfer_mxfp4"

_CHOICE: Optional[Tuple[str, str]] = None


def _labels() -> list:
    from . import measured

    return sorted({measured.size_class("fp4_moe", n) for n in DECODE_ROWS})


BACKENDS = (OURS_BACKEND, "marlin", FLASHINFER_BACKEND)


def runner_times(c: dict) -> Dict[str, Optional[float]]:
    """{backend: us} of one measured class (the start-up record's "runners"; an older record: ours and SGLang's)."""
    if isinstance(c.get("runners"), dict):
        return dict(c["runners"])
    return {OURS_BACKEND: c.get("ours_us"), FLASHINFER_BACKEND: c.get("sglang_us")}


def describe_runner(backend: str) -> str:
    return f"ours ({OURS_BACKEND} runner)" if backend == OURS_BACKEND else f"SGLang's {backend}"


def decide(classes: dict) -> Tuple[str, str]:
    """(backend, why) from the measured classes of op fp4_moe_runner (see the module docstring's rule)."""
    if not classes:
        return FLASHINFER_BACKEND, "nothing measured: SGLang's choice kept"
    labels = sorted(classes)
    if any("ours " in (c.get("why") or "") for c in classes.values()):
        bad = next(c["why"] for c in classes.values() if "ours " in (c.get("why") or ""))
    else:
        bad = ""
    times = {lb: runner_times(classes[lb]) for lb in labels}
    fi_cannot = all(not c.get("handback_runnable", True) and not c.get("default_not_timed")
                    for c in classes.values())
    per = "; ".join(f"{lb}: " + ", ".join(f"{b} {t[b]}" for b in BACKENDS if t.get(b) is not None) + " us"
                    for lb, t in times.items())
    if not fi_cannot and any(times[lb].get(FLASHINFER_BACKEND) is None for lb in labels):
        why = next((c["default_not_timed"] for c in classes.values() if c.get("default_not_timed")), "")
        return FLASHINFER_BACKEND, (f"SGLang's flashinfer_mxfp4 was not timed in every class"
                                    f"{' (' + why + ')' if why else ''}: SGLang's choice kept ({per})")
    full = {b: sum(times[lb][b] for lb in labels) for b in BACKENDS
            if all(times[lb].get(b) is not None for lb in labels) and not (b == OURS_BACKEND and bad)}
    if not full:
        return FLASHINFER_BACKEND, (f"no runner timed in every class ({per}){'; ' + bad if bad else ''}: SGLang's "
                                    f"choice kept")
    best = min(full, key=lambda b: (full[b], b != FLASHINFER_BACKEND))
    rule = "least summed us over the decode classes " + ", ".join(labels)
    fi_why = next((c.get("why") for c in classes.values() if c.get("why")), "")
    head = f"FlashInfer's MXFP4 runner cannot run on this GPU ({fi_why}); " if fi_cannot else ""
    tail = f"; ours not a candidate: {bad}" if bad else ""
    return best, f"{head}measured fastest ({rule}: {per}){tail}"


def _measure_in_subprocess(tp: int) -> str:
    """Run the timing in a child process (its CUDA context ends with it); '' or why it failed."""
    cmd = [sys.executable, "-m", "deepseek_v4_kernel", "cache", "measure", "--op", OP, "--tp", str(tp),
           "--rows", ",".join(map(str, DECODE_ROWS)), "--budget", str(MEASURE_TIMEOUT_S - 8)]
    env = dict(os.environ)
    env["DSV4_KERNEL_QUIET"] = "1"
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=MEASURE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return f"the timing subprocess ran past {MEASURE_TIMEOUT_S:.0f} s"
    except OSError as e:
        return f"the timing subprocess did not start: {e}"
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or [""]
        return f"the timing subprocess exited with {r.returncode}: {tail[0][:200]}"
    return ""


def choose(tp: int, measure=_measure_in_subprocess) -> Tuple[str, str]:
    """(backend, why) for this launcher; decided once per process."""
    global _CHOICE
    if _CHOICE is not None:
        return _CHOICE
    mode = policy.prefer_mode()
    if mode == "ours":
        _CHOICE = (OURS_BACKEND, f"{policy.PREFER}=ours")
        return _CHOICE
    if mode == "builtin":
        _CHOICE = (FLASHINFER_BACKEND, f"{policy.PREFER}=builtin: SGLang's default kept")
        return _CHOICE
    t0 = time.monotonic()
    key = decisions.environment_key(0)
    labels = _labels()
    path, entry, _ = decisions.find(key)
    how = f"read from {path}"
    if entry is None or decisions.missing(entry, tp, {OP: labels}):
        why = measure(tp)
        path, entry, _ = decisions.find(key)
        how = f"measured at this first start ({time.monotonic() - t0:.1f} s), written to {path}"
        if entry is None or decisions.missing(entry, tp, {OP: labels}) == {OP: labels}:
            _CHOICE = (FLASHINFER_BACKEND, f"not measured ({why or 'no decision written'}): SGLang's default kept")
            return _CHOICE
    classes = {k: v for k, v in decisions._classes_of(entry, tp).get(OP, {}).items() if k in labels}
    und = decisions.undecided_of(entry, tp, {OP: labels}).get(OP, {})
    if und and not classes:
        _CHOICE = (FLASHINFER_BACKEND, "undecided (" + "; ".join(f"{k}: {w}" for k, w in sorted(und.items()))[:300]
                   + f"): SGLang's default kept; {how}")
        return _CHOICE
    backend, why = decide(classes)
    _CHOICE = (backend, f"{why}; {how}")
    return _CHOICE


def apply(declared: dict, view) -> dict:
    """SGLang's resolution declared ``declared`` for DeepSeek-V4; where it chose FlashInfer's MXFP4 runner (which it
    does only for ``--moe-runner-backend auto``: a backend the user passed is never changed), take the runner the
    measurement chose. Says the choice once (start-up line of the launcher and the log)."""
    if not isinstance(declared, dict) or declared.get("moe_runner_backend") != FLASHINFER_BACKEND:
        return declared
    try:
        tp = int(getattr(view, "tp_size", 1) or 1)
    except Exception:  # noqa: BLE001
        tp = 1
    try:
        backend, why = choose(tp)
    except Exception as e:  # noqa: BLE001 - never break SGLang's resolution: its own choice stands
        backend, why = FLASHINFER_BACKEND, f"choosing failed ({type(e).__name__}: {e}): SGLang's default kept"
    if backend not in BACKENDS:
        backend, why = FLASHINFER_BACKEND, f"unknown runner {backend!r} ({why}): SGLang's default kept"
    text = f"MoE runner for DeepSeek-V4's MXFP4 experts: {describe_runner(backend)} - {why}"
    log.info("deepseek_v4_kernel: %s", text)
    if not policy.env_flag(policy.QUIET):
        print(f"[deepseek_v4_kernel] {text}", file=sys.stderr, flush=True)
    return declared if backend == FLASHINFER_BACKEND else {**declared, "moe_runner_backend": backend}


def _reset_for_tests() -> None:
    global _CHOICE
    _CHOICE = None
