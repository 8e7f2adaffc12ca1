"""``python -m deepseek_v4_kernel cache show [--json] [FILE...] | clear | measure --op OP --tp N [--rows 1,8,32]``:
the measured-dispatch cache (patch/decisions.py).

* ``show``: every cached entry (or the files named), its key and what it decides per TP size, op and class;
  ``--json`` prints ``[{"path", "key", "decisions": [{"tp", "op", "class", "winner", "runs", "ours_us", "sglang",
  "sglang_us", "why"}]}]`` (what the end-to-end harness reads).
* ``clear``: delete every entry; the next server start measures again.
* ``measure``: time ``--op`` (``fp4_moe_runner``: ours against SGLang's MXFP4 MoE runners, FlashInfer's and
  Marlin; or sparse_decode, indexer_logits, hc_prenorm, fp8_linear) for ``--tp`` at ``--rows`` decode rows on this
  GPU and put it in this set-up's entry, again even where a decision or a recorded "undecided" is there (what the
  patch layer runs in a subprocess from SGLang's launcher to choose the MoE runner at the first start).
"""

from __future__ import annotations

import json
import re
import sys
from typing import List, Optional

USAGE = ("usage: python -m deepseek_v4_kernel cache show [--json] [FILE...]\n"
         "       python -m deepseek_v4_kernel cache clear\n"
         "       python -m deepseek_v4_kernel cache measure --op OP[,OP] --tp N [--rows 1,8,32] [--budget S]")


def rows_of(path: str, data: dict) -> List[dict]:
    out = []
    for tp, sec in sorted((data.get("tp") or {}).items()):
        for op, rec in sorted((sec.get("ops") or {}).items()):
            for label, c in (rec.get("classes") or {}).items():
                ours = c.get("winner") == "ours" or not c.get("handback_runnable", True)
                out.append({"tp": int(tp), "op": op, "class": label, "winner": c.get("winner"),
                            "runs": "ours" if ours else "sglang", "ours_us": c.get("ours_us"),
                            "sglang": c.get("sglang"), "sglang_us": c.get("sglang_us"), "why": c.get("why", "")})
            for label, why in (rec.get("undecided") or {}).items():
                out.append({"tp": int(tp), "op": op, "class": label, "winner": None, "runs": "builtin",
                            "ours_us": None, "sglang": None, "sglang_us": None, "why": f"undecided: {why}"})
    return out


def show(paths: Optional[List[str]] = None) -> List[dict]:
    from .patch import decisions

    return [{"path": p, "key": (d or {}).get("key"), "error": why, "decisions": rows_of(p, d) if d else []}
            for p, d, why in decisions.entries(paths)]


_WORKER_LINE = re.compile(r"\[deepseek_v4_kernel\] pid (\d+) GPU (\d+): measured dispatch, TP (\d+): (.*) \(([\d.]+) s\)")
_MOE_LINE = re.compile(r"\[deepseek_v4_kernel\] MoE runner for DeepSeek-V4's MXFP4 experts: (.*?) - (.*)")


def from_log(text: str) -> dict:
    """What a server's log says measured dispatch did (for the end-to-end harness): per worker line {pid, gpu, tp,
    read, measured, path, seconds, notes}, and the launcher's MoE runner choice {runner, why, seconds}."""
    workers = []
    for m in _WORKER_LINE.finditer(text):
        body = m.group(4)
        read = re.search(r"(\d+) decisions read from ([^\s,;]+)", body)
        meas = re.search(r"(\d+) measured here and written to ([^\s,;]+)", body)
        workers.append({"pid": int(m.group(1)), "gpu": int(m.group(2)), "tp": int(m.group(3)),
                        "read": int(read.group(1)) if read else 0, "measured": int(meas.group(1)) if meas else 0,
                        "path": (read or meas).group(2) if (read or meas) else None, "seconds": float(m.group(5))})
    moe = []
    for m in _MOE_LINE.finditer(text):
        secs = re.search(r"measured at this first start \(([\d.]+) s\)", m.group(2))
        moe.append({"runner": "ours" if m.group(1).startswith("ours") else "sglang", "why": m.group(2),
                    "seconds": float(secs.group(1)) if secs else 0.0})
    return {"workers": workers, "moe_runner": moe}


def _measure(argv: List[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m deepseek_v4_kernel cache measure")
    ap.add_argument("--op", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--budget", type=float, default=None)
    args = ap.parse_args(argv)
    from .bench import startup

    ops = [o.strip() for o in args.op.split(",") if o.strip()]
    known = startup.OPS_AT_START + (startup.MOE_RUNNER,)
    bad = [o for o in ops if o not in known]
    if bad or not ops:
        ap.error(f"--op must be a comma-separated subset of {','.join(known)}, got {args.op!r}")
    try:
        rows = tuple(sorted({int(r) for r in args.rows.split(",") if r.strip()}))
    except ValueError:
        ap.error(f"--rows takes decode rows per call such as 1,8,32, got {args.rows!r}")
    if not rows or min(rows) < 1:
        ap.error(f"--rows takes positive decode rows per call such as 1,8,32, got {args.rows!r}")
    import torch

    from .patch import decisions, policy

    if not torch.cuda.is_available():
        print("cache measure: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    s = startup.ServerShapes(tp=args.tp, decode_rows=rows)
    s.moe_inter = startup.grid.MOE_INTER // args.tp
    s.num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    cases = startup.wanted_cases(s, ops, s.num_sms)
    budget = args.budget or startup.budget_s()

    def run(todo):
        return startup.measure_cases({op: {lb: cases[op][lb] for lb in labels} for op, labels in todo.items()},
                                     budget, lambda m: print(f"[cache measure] {m}", file=sys.stderr, flush=True),
                                     policy.sglang_version())

    a = decisions.ensure(args.tp, {op: list(v) for op, v in cases.items()}, run,
                         device_index=torch.cuda.current_device(), shapes=s.as_dict(), remeasure=True)
    print(a.line())
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    from .patch import decisions

    if cmd == "show":
        as_json = "--json" in rest
        paths = [a for a in rest if a != "--json"] or None
        found = show(paths)
        if as_json:
            print(json.dumps(found, indent=1))
            return 0
        d, why = decisions.cache_dir()
        print(f"cache directory: {d}" + (f" ({why})" if why else ""))
        if not found:
            print("no cached decisions (the first server start measures and writes them)")
        for e in found:
            print(f"{e['path']}" + (f": {e['error']}" if e["error"] else ""))
            if e["key"]:
                print("  key: " + ", ".join(f"{k} {v}" for k, v in e["key"].items()))
            for r in e["decisions"]:
                if r["runs"] == "builtin":
                    print(f"  tp{r['tp']} {r['op']} {r['class']}: {r['why']} (the built-in rules decide)")
                    continue
                print(f"  tp{r['tp']} {r['op']} {r['class']}: {r['runs']} runs (ours {r['ours_us']} us, "
                      f"{r['sglang']} {r['sglang_us']} us)" + (f" - {r['why']}" if r["why"] else ""))
        return 0
    if cmd == "clear":
        gone = decisions.clear()
        print(f"removed {len(gone)} file(s)" + "".join(f"\n  {p}" for p in gone))
        return 0
    if cmd == "measure":
        return _measure(rest)
    print(f"unknown cache command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2
