"""Run the bench: for each op and case, ours and every runnable competitor, each checked against the float64
reference on the case's own inputs, then timed by CUDA-graph replay over rotated input sets (bench/timing.py).

A competitor that fails, or whose result is off by more than inputs.TOLERANCE, is reported with the reason and not
timed; a shape its SGLang call site never sends it is "n/a". Progress goes to ``log`` (one line per case)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

from . import competitors as comp
from . import inputs, shapes
from .timing import time_rotated


POOL_PREFIX = {"sparse_decode": "sd.", "indexer_logits": "idx.", "hc_prenorm": "hc.", "fp4_moe": "moe.",
               "fp8_linear": "fp8."}


@dataclass
class Options:
    tp: int = 1
    ops: List[str] = field(default_factory=lambda: list(shapes.OPS))
    quick: bool = False
    mma_sync: bool = False
    pad: bool = True
    allow_jit: bool = False
    source_versions: tuple = ()          # SGLang versions to load from unpacked sources besides the installed one
    hc_impls: tuple = ()                 # also time ours with these hc_prenorm impls ("triton", "cuda", "auto")
    floor_bw: Optional[float] = None     # copy bandwidth (B/s) for the byte floor, when measured


def ours_prepare(op: str, impl: Optional[str] = None) -> Callable[[dict], Callable[[], object]]:
    """Our op as the patch runs it at SGLang's call site, in the competitors' call form."""
    if op == "sparse_decode":
        from ..ops.sparse_decode import sparse_decode

        return lambda a: (lambda: sparse_decode(a["q"], a["k_cache"], a["indices"], a["topk_length"],
                                                a["extra_k_cache"], a["extra_indices"], a["extra_topk_length"],
                                                a["attn_sink"])[0])
    if op == "indexer_logits":
        from ..ops.indexer_logits import paged_mqa_logits

        return lambda a: (lambda: paged_mqa_logits(a["q"], a["kv_cache"], a["weights"], a["seq_lens"],
                                                   a["page_table"], a["max_seq_len"], clean_logits=True))
    if op == "hc_prenorm":
        from ..ops.hc_prenorm import hc_prenorm_gemm

        def prepare(a):
            def call():
                hc_prenorm_gemm(a["x"], a["fn"], a["out"], a["sqrsum"], a["num_splits"], impl=impl)
                return a["out"], a["sqrsum"]
            return call
        return prepare
    if op == "fp8_linear":   # bf16 x as the patch hands it over (SGLang's activation quantization skipped)
        from ..ops.fp8_linear import fp8_linear

        return lambda a: (lambda: fp8_linear(a["x"], a["weight"], a["weight_scale"], block_size=(128, 128)))
    from ..ops.fp4_moe import fp4_moe

    return lambda a: (lambda: fp4_moe(a["x"], a["w13"], a["w13_scale"], a["w2"], a["w2_scale"], a["topk_weights"],
                                      a["topk_ids"], swiglu_limit=a["swiglu_limit"]))


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160] if text else ''}"


def measure(op: str, name: str, prepare, sets: List[dict], ref, rows: List[int]) -> dict:
    """Check on set 0, then time over all sets. Returns {us, how, error} or {status, reason, error}."""
    try:
        calls = [prepare(a) for a in sets]
    except comp.NotApplicable as e:
        return {"status": "n/a", "reason": str(e)}
    except Exception as e:  # noqa: BLE001
        return {"status": "failed", "reason": _short(e)}
    try:
        result = calls[0]()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        err = inputs.rel_error(op, result, ref, sets[0], rows)
        del result
    except Exception as e:  # noqa: BLE001
        return {"status": "failed", "reason": _short(e)}
    if not err <= inputs.TOLERANCE[op]:
        return {"status": "wrong", "error": err,
                "reason": f"relative error {err:.3g} against the float64 reference (limit {inputs.TOLERANCE[op]})"}
    try:
        us, how = time_rotated(calls)
    except Exception as e:  # noqa: BLE001
        return {"status": "failed", "reason": f"timing: {_short(e)}", "error": err}
    return {"status": "ok", "us": us, "how": how, "error": err}


def run_op(op: str, opt: Options, pools: inputs.Pools, log: Callable[[str], None], num_sms: int,
           sglang_version: Optional[str]) -> dict:
    t0 = time.time()
    found = comp.discover(op, mma_sync=opt.mma_sync, source_versions=opt.source_versions, allow_jit=opt.allow_jit)
    if op == "fp4_moe":   # SGLang's Marlin MXFP4 runner, through SGLang's own weight preparation and call
        from .moe_competitors import user_bench_competitors

        found = found + user_bench_competitors(allow_jit=opt.allow_jit)
    default, default_why = comp.sglang_default(op, [c.name for c in found], sglang_version)
    for c in found:
        state = "runs" if c.runnable else (f"same kernel as {c.same_as}" if c.same_as else f"not timed: {c.reason}")
        log(f"  {op}: {c.name} [{c.role}]: {state}")
    log(f"  {op}: SGLang's path at the patched call site: {default or 'none'} ({default_why})")
    ours_variants = [("ours", ours_prepare(op))]
    if op == "hc_prenorm":
        ours_variants += [(f"ours impl={i}", ours_prepare(op, i)) for i in opt.hc_impls]
    runnable = [c for c in found if c.runnable]
    failures: Dict[str, Dict[str, int]] = {}
    rows_out = []
    cases = shapes.cases(op, opt.tp, num_sms, opt.quick, opt.pad)
    for i, case in enumerate(cases, 1):
        tc = time.time()
        sets = inputs.SETS[op](case, pools)
        check = inputs.check_rows(case.n)
        ref = inputs.REFERENCE[op](sets[0], check)
        row = {"class": case.size_class, "label": case.label, "n": case.n, "params": dict(case.params),
               "sets": len(sets), "results": {}}
        for name, prep in ours_variants:
            row["results"][name] = measure(op, name, prep, sets, ref, check)
        for c in runnable:
            seen = failures.get(c.name, {})
            repeated = [r for r, k in seen.items() if k >= 2]
            if repeated:
                row["results"][c.name] = {"status": "failed", "reason": f"skipped after failing twice: {repeated[0]}"}
                continue
            res = measure(op, c.name, c.prepare, sets, ref, check)
            if res["status"] == "failed":
                failures.setdefault(c.name, {}).setdefault(res["reason"], 0)
                failures[c.name][res["reason"]] += 1
            row["results"][c.name] = res
        if opt.floor_bw:
            row["floor_us"] = shapes.case_bytes(case)["bytes"] / opt.floor_bw * 1e6
        _decide(row, default)
        rows_out.append(row)
        del sets
        ours = row["results"]["ours"]
        best = row.get("best")
        log(f"[{op} {i}/{len(cases)}] {case.label}: ours {_fmt(ours)}"
            + (f", best other {best} {row['best_us']:.1f} us" if best else "")
            + (f", SGLang's {row['sglang_us']:.1f} us" if row.get("sglang_us") else "")
            + f" ({time.time() - tc:.1f}s)")
    pools.drop(POOL_PREFIX[op])   # the next op's inputs get the memory
    return {"competitors": [dict(name=c.name, role=c.role, origin=c.origin, runnable=c.runnable, reason=c.reason,
                                 same_as=c.same_as) for c in found],
            "sglang_default": default, "sglang_default_why": default_why, "rows": rows_out,
            "classes": classes_of(rows_out), "seconds": round(time.time() - t0, 1)}


def _fmt(res: dict) -> str:
    return f"{res['us']:.1f} us" if res.get("status") == "ok" else f"{res.get('status')} ({res.get('reason', '')})"


def _decide(row: dict, default: Optional[str]) -> None:
    """Fill best (fastest timed competitor), sglang (the patched call site's original), ratio and winner."""
    timed = {k: v["us"] for k, v in row["results"].items() if v.get("status") == "ok" and not k.startswith("ours")}
    ours = row["results"]["ours"]
    row["ours_us"] = ours.get("us")
    if timed:
        row["best"] = min(timed, key=timed.get)
        row["best_us"] = timed[row["best"]]
    row["sglang"] = default
    row["sglang_us"] = timed.get(default) if default else None
    row["handback_runnable"] = row["sglang_us"] is not None
    if row["ours_us"] is None:
        row["winner"] = "sglang"
    elif row["sglang_us"] is None:
        row["winner"] = "ours"          # SGLang's path at the call site cannot run here
    else:
        row["winner"] = "ours" if row["ours_us"] <= row["sglang_us"] else "sglang"
    row["ratio"] = (row["sglang_us"] / row["ours_us"]) if row["ours_us"] and row["sglang_us"] else None


def classes_of(rows: List[dict]) -> Dict[str, dict]:
    """One verdict per size class over its rows (summed times: each variant of the class weighs its own time)."""
    out: Dict[str, dict] = {}
    for r in rows:
        c = out.setdefault(r["class"], {"ours_us": 0.0, "sglang_us": 0.0, "sglang": r["sglang"], "rows": 0,
                                        "handback_runnable": True, "ours_failed": False})
        c["rows"] += 1
        for name, res in r["results"].items():   # every competitor timed in every row of the class: summed
            if not name.startswith("ours"):
                c.setdefault("_sums", {}).setdefault(name, []).append(res.get("us") if res.get("status") == "ok"
                                                                      else None)
        if r["ours_us"] is None:
            c["ours_failed"] = True
        else:
            c["ours_us"] += r["ours_us"]
        if r["sglang_us"] is None:
            c["handback_runnable"] = False
        else:
            c["sglang_us"] += r["sglang_us"]
    for c in out.values():
        if c["ours_failed"]:
            c["winner"] = "sglang"
        elif not c["handback_runnable"]:
            c["winner"], c["sglang_us"] = "ours", None
        else:
            c["winner"] = "ours" if c["ours_us"] <= c["sglang_us"] else "sglang"
        c["ratio"] = (c["sglang_us"] / c["ours_us"]) if c["sglang_us"] and c["ours_us"] else None
        full = {n: sum(v) for n, v in c.pop("_sums", {}).items() if len(v) == c["rows"] and None not in v}
        c["best"] = min(full, key=full.get) if full else None
        c["best_us"] = round(full[c["best"]], 2) if full else None
        c["ours_us"] = round(c["ours_us"], 2)
        c["sglang_us"] = round(c["sglang_us"], 2) if c["sglang_us"] is not None else None
        del c["ours_failed"]
    return out
