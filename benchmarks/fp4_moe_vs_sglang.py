"""The "ours against SGLang's MoE runners" section of bench_fp4_moe.py (issue 59 item 4), kept apart so that the
bench's own section can change without touching this one.

Per TP shard (DeepSeek-V4-Flash: 256 experts, top-6, hidden 4096, I = 2048 / tp) and token count (default 1, 2, 4,
..., 256): ours (the impls of --vs-impls; "default" = the impl our op picks for the size, what the patch runs) and
each SGLang runner of deepseek_v4_kernel/bench/moe_competitors.py that runs here (Marlin MXFP4, FlashInfer's
flashinfer_mxfp4 paths), on the same weights (our packed bytes and UE8M0 scales, prepared for the competitor by
SGLang's own process_weights_after_loading) and the same rotated routing sets. Every kernel is first checked on set 0
against the float64 reference (deepseek_v4_kernel/reference/fp4_moe.py; relative L2 error of the first and last
token, limit TOLERANCE); a wrong one is reported, never timed. Timing: CUDA-graph replays over the rotated sets
(bench/timing.time_rotated: what one call reads is not in L2 from the previous call). Floor: the packed weight and
scale bytes of the experts each set hits / the copy bandwidth measured in this run; "% floor" = floor / time; "x/ours"
= that competitor's time / ours (> 1: ours faster; the issue-60 target against Marlin is >= 1.3 at every size).

The instruction class: Marlin and FlashInfer are CUDA (one class); our Triton parts follow DISABLE_MMA_V3, which the
caller sets for the whole process (tools/gpu_moe_competitors.sh runs the bench once natively, once with it).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Optional

from deepseek_v4_kernel.bench import moe_competitors as mc

VS_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Relative L2 error limits: the exact paths (ours, Marlin W4A16: bf16 gate/up and per-slot outputs) are within a few
# 1e-3 of the reference; MXFP8 activations (FlashInfer's SM120 W4A8, our mxfp8 impl) a few 1e-2; a layout or
# indexing mistake is order 1.
TOLERANCE = 0.02
TOLERANCE_MXFP8_ACT = 0.08
MAX_SETS = 16


def tolerance_for(name: str) -> float:
    return TOLERANCE_MXFP8_ACT if name in ("flashinfer_sm120", "ours_mxfp8") else TOLERANCE


def add_args(ap) -> None:
    ap.add_argument("--vs", default="marlin,flashinfer_sm120,flashinfer_sm90",
                    help="SGLang MoE runners to compare with (moe_competitors short names); '' for none (with "
                         "--vs-only: ours alone, e.g. for with_competitors_of)")
    ap.add_argument("--vs-tp", default="1,2,4", help="TP shards of the comparison (I = 2048 / tp)")
    ap.add_argument("--vs-tokens", default=",".join(map(str, VS_TOKENS)))
    ap.add_argument("--vs-impls", default="default",
                    help="our impls in the comparison ('default': the impl our op picks per size)")
    ap.add_argument("--vs-only", action="store_true", help="only the comparison (not the per-impl table)")
    ap.add_argument("--vs-require", default="",
                    help="exit with status 3 (after saying why) when one of these competitors cannot run here")
    ap.add_argument("--allow-jit", action="store_true",
                    help="let SGLang / FlashInfer JIT-compile missing modules (Marlin: ~5 min)")


def _ints(text: str, what: str) -> List[int]:
    try:
        vals = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise SystemExit(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise SystemExit(f"{what} must be positive integers, got {text!r}")
    return vals


def rel_error(out, ref) -> float:
    got = out.double().cpu().reshape(-1)
    want = ref.double().cpu().reshape(-1)
    if not bool(got.isfinite().all()):
        return float("inf")
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


class Required(SystemExit):
    """A competitor named by --vs-require cannot run here."""


def run(args, bench, bw: float, log=print, on_row=None) -> dict:
    """The comparison (``bench``: the bench_fp4_moe module: its shapes, weights, routing and our call; ``on_row``:
    called with the result so far after each row). Returns {"competitors", "rows", "mma_sync", "seconds", ...}.
    Raises Required (exit status 3) when a competitor of --vs-require cannot run."""
    import torch

    from deepseek_v4_kernel.bench.timing import l2_bytes, rotation_count, time_rotated
    from deepseek_v4_kernel.ops import fp4_moe as op
    from deepseek_v4_kernel.reference.fp4_moe import fp4_moe_reference

    t0 = time.time()
    include = tuple(n for n in args.vs.split(",") if n.strip())
    tps = _ints(args.vs_tp, "--vs-tp")
    tokens = _ints(args.vs_tokens, "--vs-tokens")
    impls = [i for i in args.vs_impls.split(",") if i.strip()]
    found = mc.moe_competitors(allow_jit=args.allow_jit or None, include=include)
    res = {"mma_sync": os.environ.get("DISABLE_MMA_V3") == "1", "tokens": tokens, "tp": tps, "impls": impls,
           "tolerance": {"default": TOLERANCE, "mxfp8 activations": TOLERANCE_MXFP8_ACT},
           "competitors": [dict(name=c.name, short=c.short, available=c.available, reason=c.reason, notes=c.notes)
                           for c in found],
           "rows": []}
    for c in found:
        log(f"vs: {c.short}: " + ("runs" if c.available else f"not timed: {c.reason}")
            + (f" ({'; '.join(c.notes)})" if c.notes else ""))
    required = {n.strip() for n in getattr(args, "vs_require", "").split(",") if n.strip()}
    lacking = [c for c in found if c.short in required and not c.available]
    missing = required - {c.short for c in found}
    if lacking or missing:
        log("vs: required competitor cannot run: " + "; ".join([f"{c.short}: {c.reason}" for c in lacking]
                                                             + [f"{n}: not in --vs" for n in sorted(missing)]))
        raise Required(3)
    runnable = [c for c in found if c.available]
    if not runnable and not args.vs_only:   # the bench's default run: no rows of ours alone (--vs-only times them)
        log("vs: no SGLang MoE runner runs here; section skipped")
        res["seconds"] = round(time.time() - t0, 1)
        return res
    l2 = l2_bytes()
    for tp in tps:
        shape = mc.moe_shape(tp)
        w = bench.make_weights(seed=tp, inter=shape.inter)
        weights = dict(w13=w[0], w13_scale=w[1], w2=w[2], w2_scale=w[3], swiglu_limit=bench.LIMIT,
                       routed_scaling_factor=bench.RSF, topk=bench.TOPK)
        prepared: Dict[str, object] = {}
        for c in runnable:
            tc = time.time()
            try:
                prepared[c.short] = c.prepare(weights)
                log(f"vs tp={tp}: {c.short} weights prepared by SGLang's method in {time.time() - tc:.1f} s")
            except Exception as e:  # noqa: BLE001
                prepared[c.short] = f"prepare: {type(e).__name__}: {str(e)[:200]}"
                log(f"vs tp={tp}: {c.short} prepare failed: {prepared[c.short]}")
        for M in tokens:
            tr = time.time()
            row = rows_for(M, tp, shape, w, weights, prepared, impls, bench, bw, l2, op, fp4_moe_reference,
                           rotation_count, time_rotated)
            res["rows"].append(row)
            if on_row:
                on_row(res)
            log(f"vs tp={tp} M={M}: " + ", ".join(f"{k} {v:.1f} us" for k, v in row["us"].items())
                + f"; floor {row['weight_floor_us']:.1f} us"
                + "".join(f"; {k} {v}" for k, v in row["status"].items()) + f" ({time.time() - tr:.1f} s)")
        del prepared, weights, w
        torch.cuda.empty_cache()
    res["seconds"] = round(time.time() - t0, 1)
    return res


def rows_for(M, tp, shape, w, weights, prepared, impls, bench, bw, l2, op, reference, rotation_count,
             time_rotated) -> dict:
    import torch

    per_call = mc.weight_bytes(shape, min(shape.experts, M * shape.topk))
    n_sets = rotation_count(per_call, l2, hi=MAX_SETS)
    sets = [bench.make_routing(M, seed=1000 * tp + 17 * M + s) for s in range(n_sets)]
    hit = [int(torch.unique(ids).numel()) for _, _, ids in sets]
    floor_us = sum(mc.weight_bytes(shape, u) for u in hit) / len(hit) / bw * 1e6
    x0, tw0, ids0 = sets[0]
    rows = [0] if M == 1 else [0, M - 1]
    ref = reference(x0[rows], *w, tw0[rows], ids0[rows], swiglu_limit=bench.LIMIT,
                    routed_scaling_factor=bench.RSF).cpu()
    row = {"tp": tp, "inter": shape.inter, "tokens": M, "sets": n_sets, "experts_hit": sum(hit) / len(hit),
           "weight_floor_us": floor_us, "default_impl": op.pick_impl(x0, w[0], w[2], bench.TOPK),
           "us": {}, "error": {}, "status": {}, "how": {}}
    out = torch.empty(M, shape.hidden, dtype=torch.bfloat16, device=x0.device)
    candidates = []
    for impl in impls:
        name = "ours" if impl == "default" and len(impls) == 1 else f"ours_{impl}"
        if impl == "cuda_decode" and M * shape.topk > op.DECODE_MAX_SLOTS:
            continue

        def make(a, impl=impl):
            x, tw, ids = a
            return lambda: bench.run_ours(x, w, tw, ids, None if impl == "default" else impl, out)
        candidates.append((name, make))
    for short, p in prepared.items():
        if isinstance(p, str):
            row["status"][short] = p
            continue
        candidates.append((short, lambda a, p=p: p.bind(*a)))
    for name, make in candidates:
        try:
            calls = [make(a) for a in sets]
            got = calls[0]()
            if got.is_cuda:
                torch.cuda.synchronize()
            err = rel_error(got[rows], ref)
            row["error"][name] = err
            if not err <= tolerance_for(name):
                row["status"][name] = f"WRONG: relative error {err:.3g} against the float64 reference " \
                                      f"(limit {tolerance_for(name)}); not timed"
                continue
            row["us"][name], row["how"][name] = time_rotated(calls)
        except Exception as e:  # noqa: BLE001
            row["status"][name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    ours = [v for k, v in row["us"].items() if k.startswith("ours")]
    if ours and "ours" not in row["us"]:
        row["us"]["ours"] = min(ours)
    row.update(mc.floor_summary(row["us"], floor_us))
    return row


def with_competitors_of(res: dict, other: dict, note: str) -> dict:
    """``res`` (ours only, e.g. the mma.sync pass) with the competitor times of ``other`` (the native pass of the same
    script run: the same weights and routing seeds; Marlin and FlashInfer are CUDA, the same kernels in both classes)
    at the same (tp, tokens), the ratios and floors recomputed; ``note`` says where they come from."""
    import copy

    out = copy.deepcopy(res)
    by_point = {(r["tp"], r["tokens"]): r for r in other.get("rows", [])}
    names = [c["short"] for c in other.get("competitors", []) if c["available"]]
    out["competitors"] = [c for c in other.get("competitors", [])]
    out["competitor_times_from"] = note
    for r in out["rows"]:
        o = by_point.get((r["tp"], r["tokens"]))
        if o is None:
            continue
        for n in names:
            if n in o["us"]:
                r["us"][n] = o["us"][n]
            elif n in o["status"]:
                r["status"][n] = o["status"][n]
        r.update(mc.floor_summary(r["us"], r["weight_floor_us"]))
    return out


def table(res: dict) -> str:
    """One line per (tp, tokens): floor, ours, each competitor's µs, % of floor and time / ours."""
    comps = [c["short"] for c in res.get("competitors", []) if c["available"]]
    names = ["ours"] + comps
    head = ["tp", "I", "tokens", "experts", "floor us", "our impl"]
    for n in names:
        head += [f"{n} us", f"{n} %floor"] + ([f"{n}/ours"] if n != "ours" else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in res.get("rows", []):
        cells = [str(r["tp"]), str(r["inter"]), str(r["tokens"]), f"{r['experts_hit']:.1f}",
                 f"{r['weight_floor_us']:.1f}", str(r.get("default_impl", "-"))]
        for n in names:
            us = r["us"].get(n)
            st = r["status"].get(n, "")
            cells.append(f"{us:.1f}" if us is not None else ("WRONG" if st.startswith("WRONG") else
                                                             "fail" if st else "-"))
            pct = r.get(f"{n}_pct_floor")
            cells.append(f"{pct:.0f}%" if pct is not None else "-")
            if n != "ours":
                ratio = r.get(f"{n}_over_ours")
                cells.append(f"{ratio:.2f}x" if ratio is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"  {c['short']}: not timed: {c['reason']}" for c in res.get("competitors", []) if not c["available"]]
    cls = "mma.sync builds (DISABLE_MMA_V3=1, SM120's class) for our Triton parts" if res.get("mma_sync") \
        else "native instruction class"
    src = res.get("competitor_times_from")
    notes += [f"  competitor times: {src}"] if src else []
    return "\n".join([f"ours vs SGLang's MoE runners ({cls}; x/ours > 1: ours faster):"] + lines + notes)


def ratio_summary(res: dict, name: str = "marlin", target: float = 1.3) -> Optional[str]:
    """'marlin/ours min 0.81x (tp 1, 8 tokens) ... ; n of m sizes >= 1.3x' or None without timed rows."""
    pts = [(r[f"{name}_over_ours"], r["tp"], r["tokens"]) for r in res.get("rows", [])
           if r.get(f"{name}_over_ours") is not None]
    if not pts:
        return None
    lo, hi = min(pts), max(pts)
    ok = sum(1 for p in pts if p[0] >= target)
    return (f"{name}/ours: min {lo[0]:.2f}x (tp {lo[1]}, {lo[2]} tokens), max {hi[0]:.2f}x (tp {hi[1]}, {hi[2]} "
            f"tokens); {ok} of {len(pts)} points >= {target}x")


def impl_ratios(res: dict, name: str = "marlin") -> Optional[str]:
    """With several of our impls (--vs-impls a,b,...): per impl and TP shard, ``name``'s time / that impl's time at each
    token count (> 1: ours faster), so that each streaming variant is compared with Marlin on the same rows."""
    impls = sorted({k for r in res.get("rows", []) for k in r["us"] if k.startswith("ours_")})
    if not impls or not any(name in r["us"] for r in res.get("rows", [])):
        return None
    lines = [f"{name} / each impl of ours (per tp: tokens -> ratio):"]
    for impl in impls:
        for tp in res.get("tp", []):
            pts = [(r["tokens"], r["us"][name] / r["us"][impl]) for r in res["rows"]
                   if r["tp"] == tp and name in r["us"] and impl in r["us"]]
            if pts:
                lines.append(f"  {impl[5:]:>24s} tp{tp}: " + " ".join(f"{t}:{v:.2f}" for t, v in pts))
    return "\n".join(lines)


def plot(ax, res: dict, device: str) -> None:
    """µs against tokens per TP shard: ours (solid), each timed competitor (dashed), the weight floor (dotted)."""
    names = ["ours"] + [c["short"] for c in res.get("competitors", [])]
    for tp in res.get("tp", []):
        rows = [r for r in res["rows"] if r["tp"] == tp]
        toks = [r["tokens"] for r in rows]
        ax.plot(toks, [r["weight_floor_us"] for r in rows], ":", color="gray")
        for n in names:
            pts = [(t, r["us"][n]) for t, r in zip(toks, rows) if n in r["us"]]
            if pts:
                ax.plot(*zip(*pts), "-" if n == "ours" else "--", marker="o", label=f"{n} tp{tp}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens")
    ax.set_ylabel("µs (dotted: weight floor)")
    ax.legend(fontsize=7)
    ax.set_title(f"ours vs SGLang MoE runners ({'mma.sync' if res.get('mma_sync') else 'native'}; {device})")
