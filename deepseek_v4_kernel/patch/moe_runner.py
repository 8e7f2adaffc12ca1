"""Which MoE runner serves DeepSeek-V4's MXFP4 experts where SGLang's own default is FlashInfer's (0.5.16+ on SM120):
decided in SGLang's launcher, where it resolves ``--moe-runner-backend auto`` (targets.py, the fp4_moe runner rows).

Ours runs behind SGLang's Triton runner (``Fp8MoEMethod.apply``, replaced by patch/adapters.py); FlashInfer's
``flashinfer_mxfp4`` runner (CUTLASS W4A8 on SM120, W4A16 on sm_90) processes the weights into its own layout at
load, so the choice must be made before the model loads, in the launcher. It comes from measured dispatch's cache
(patch/decisions.py, op ``fp4_moe_runner``): at the first start of a set-up the launcher times both in a subprocess
(``python -m deepseek_v4_kernel cache measure --op fp4_moe_runner``, MEASURE_TIMEOUT_S at most; the subprocess's CUDA
context is gone before SGLang starts its workers), later starts read the file. Ours is chosen where it was measured
faster over the decode classes timed (summed), or where FlashInfer's runner cannot run on this GPU; FlashInfer's stays
where it won, where ours failed, and where nothing could be measured (the reason is logged).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from typing import Optional, Tuple

from . import decisions, policy

log = logging.getLogger("deepseek_v4_kernel")

OP = "fp4_moe_runner"
MEASURE_TIMEOUT_S = 30.0
DECODE_ROWS = (1, 8, 32)          # the decode classes the runner choice is timed at (tokens per call)
OURS_BACKEND = "triton"           # SGLang's runner whose quant method (Fp8MoEMethod.apply) our adapter replaces
FLASHINFER_BACKEND = "flashinfer_mxfp4"

_CHOICE: Optional[Tuple[bool, str]] = None


def _labels() -> list:
    from . import measured

    return sorted({measured.size_class("fp4_moe", n) for n in DECODE_ROWS})


def decide(classes: dict) -> Tuple[bool, str]:
    """(ours?, why) from the measured classes of op fp4_moe_runner."""
    if not classes:
        return False, "nothing measured"
    if all(c.get("winner") == "ours" and not c.get("handback_runnable", True) for c in classes.values()):
        why = next((c.get("why") for c in classes.values() if c.get("why")), "")
        return True, f"FlashInfer's MXFP4 runner cannot run on this GPU ({why})" if why else \
            "FlashInfer's MXFP4 runner cannot run on this GPU"
    both = {k: c for k, c in classes.items() if c.get("ours_us") and c.get("sglang_us")}
    if any("ours " in (c.get("why") or "") for c in classes.values()):
        return False, "ours failed its check: " + next(c["why"] for c in classes.values() if "ours " in
                                                          (c.get("why") or ""))
    if not both:
        return False, "no class timed on both runners"
    ours = sum(c["ours_us"] for c in both.values())
    theirs = sum(c["sglang_us"] for c in both.values())
    per = ", ".join(f"{k} {c['ours_us']} / {c['sglang_us']} us" for k, c in sorted(both.items()))
    if ours <= theirs:
        return True, f"ours measured faster than FlashInfer's MXFP4 runner ({per})"
    return False, f"FlashInfer's MXFP4 runner measured faster ({per})"


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


def choose(tp: int, measure=_measure_in_subprocess) -> Tuple[bool, str]:
    """(ours?, why) for this launcher; decided once per process."""
    global _CHOICE
    if _CHOICE is not None:
        return _CHOICE
    mode = policy.prefer_mode()
    if mode == "ours":
        _CHOICE = (True, f"{policy.PREFER}=ours")
        return _CHOICE
    if mode == "builtin":
        _CHOICE = (False, f"{policy.PREFER}=builtin: SGLang's default kept")
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
            _CHOICE = (False, f"not measured ({why or 'no decision written'}): SGLang's default kept")
            return _CHOICE
    classes = {k: v for k, v in decisions._classes_of(entry, tp).get(OP, {}).items() if k in labels}
    ours, why = decide(classes)
    _CHOICE = (ours, f"{why}; {how}")
    return _CHOICE


def apply(declared: dict, view) -> dict:
    """SGLang's resolution declared ``declared`` for DeepSeek-V4; where it chose FlashInfer's MXFP4 runner (which it
    does only for ``--moe-runner-backend auto``: a backend the user passed is never changed), take ours instead if
    the measurement says so. Says the choice once (start-up line of the launcher and the log)."""
    if not isinstance(declared, dict) or declared.get("moe_runner_backend") != FLASHINFER_BACKEND:
        return declared
    try:
        tp = int(getattr(view, "tp_size", 1) or 1)
    except Exception:  # noqa: BLE001
        tp = 1
    try:
        ours, why = choose(tp)
    except Exception as e:  # noqa: BLE001 - never break SGLang's resolution: its own choice stands
        ours, why = False, f"choosing failed ({type(e).__name__}: {e}): SGLang's default kept"
    runner = f"ours ({OURS_BACKEND} runner)" if ours else f"SGLang's {FLASHINFER_BACKEND}"
    text = f"MoE runner for DeepSeek-V4's MXFP4 experts: {runner} - {why}"
    log.info("deepseek_v4_kernel: %s", text)
    if not policy.env_flag(policy.QUIET):
        print(f"[deepseek_v4_kernel] {text}", file=sys.stderr, flush=True)
    return {**declared, "moe_runner_backend": OURS_BACKEND} if ours else declared


def _reset_for_tests() -> None:
    global _CHOICE
    _CHOICE = None
