"""Turn the harness's session results into benchmarks/results/e2e.json's layout, its checks, a table and a plot.

Layout of e2e.json:
  harness:      SGLang version, TP size, seed, margins, the model's layer kinds
  setups:       per setup (a, b, c): title, what runs each piece (sparse MLA, indexer, mHC pre-norm, MoE, FP8 linears)
  sessions:     per session (<setup>-<graphs|eager>[-mtp][-soak]): start-up time, served, log findings (shim lines,
                our start-up lines, targets patched, hand-back warnings, error lines), weight fingerprints,
                throughput, profile, soak
  outputs:      per session, the greedy outputs (token ids, chosen and top-2 logprobs) the comparisons read
  comparisons:  candidate vs reference summaries (compare.py), each with its closeness
  throughput:   rows of the table, per setup (decode columns from the profiles' windows when no table ran)
  profiles:     per profile key (setup, or <setup>-native) and concurrency, the per-op profile of the decode step
                with its floors (report_profiles.py); profile_b: (b)'s profile at 8 streams (the earlier layout)
  gpu_fraction: per profile key, the one-stream GPU busy fraction against the depth model
  checks:       [{name, pass, detail, gating}], what the issue asks, each pass/fail
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Set, Tuple

import compare as cmp
import report_profiles as rprof
from model_config import layer_kinds
from sessions import parse_session

SGLANG_VERSION = "0.5.17"
# the targets of each op that must show "patched" in (b)'s log for SGLang 0.5.17 (deepseek_v4_kernel/patch/targets.py)
OP_TARGETS = {
    "sparse_decode": ("sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120",),
    "indexer_logits": ("sglang.kernels.ops.attention.dsa.tilelang_kernel.tilelang_fp8_paged_mqa_logits",
                       "sglang.srt.layers.attention.dsv4.indexer.fp8_paged_mqa_logits_torch_sm120"),
    "fp4_moe": ("sglang.srt.layers.quantization.fp8.Fp8MoEMethod.apply",),
    "hc_prenorm": ("sglang.srt.layers.deep_gemm_wrapper.entrypoint.tf32_hc_prenorm_gemm",
                   "deep_gemm.tf32_hc_prenorm_gemm", "SGLANG_OPT_DEEPGEMM_HC_PRENORM=1"),
}
# Relative agreement: (b) vs (c) must be at least as close as SGLang's own SM120 path (a) vs (c), with slack for 16
# prompts (a run's first-token differences vary by a few prompts; the agreed prefix by a quarter).
CLOSENESS_PREFIX_FRACTION = 0.75
CLOSENESS_FIRST_TOKEN_SLACK = 2
SOAK_GPU_GROWTH_MIB = 256     # after warm-up; SGLang preallocates its pools, so GPU memory should not move
SOAK_RSS_GROWTH_FRACTION = 0.10


def _steps(outputs: List[dict]) -> List[List[cmp.Step]]:
    return [[cmp.Step(int(tok), float(lp), [(float(t[0]), int(t[1])) for t in top])
             for (lp, tok), top in zip(o["output_token_logprobs"], o["output_top_logprobs"])] for o in outputs]


def comparisons(sessions: Dict[str, dict], margin: float, logprob_tol: float) -> List[dict]:
    pairs = []
    for variant in ("graphs", "eager"):
        for cand in ("b", "a"):
            pairs.append((f"{cand}-{variant}", f"c-{variant}"))
    pairs += [("b-graphs-mtp", "c-graphs"), ("c-graphs-mtp", "c-graphs"),
              ("b-graphs", "b-eager"), ("c-graphs", "c-eager")]
    out = []
    for cand, ref in pairs:
        c, r = sessions.get(cand, {}).get("outputs"), sessions.get(ref, {}).get("outputs")
        if not c or not r:
            continue
        res = cmp.compare(cand, _steps(c), ref, _steps(r), margin, logprob_tol)
        out.append(res.summary())
    return out


FORCED_FRACTION = 1.5   # teacher-forced: (b)'s median and p90 logprob differences at most this times (a)'s


def forced_comparisons(sessions: Dict[str, dict]) -> List[dict]:
    """Every session's teacher-forced scores of c-graphs' tokens against c-graphs' own (c-eager's: the floor)."""
    ref = (sessions.get("c-graphs") or {}).get("forced")
    if not ref:
        return []
    return [cmp.forced(name, s["forced"], "c-graphs", ref) for name, s in sorted(sessions.items())
            if name != "c-graphs" and s.get("forced")]


def forced_checks(forced: List[dict]) -> List[dict]:
    by = {f["candidate"]: f for f in forced}
    out = []
    for mode, cand in (("graphs", "b-graphs"), ("eager", "b-eager"), ("graphs", "b-graphs-measured")):
        b, a = by.get(cand), by.get(f"a-{mode}")
        if not b or not a or b["median_logprob_diff"] is None or a["median_logprob_diff"] is None:
            continue
        ok = (b["median_logprob_diff"] <= FORCED_FRACTION * a["median_logprob_diff"]
              and b["p90_logprob_diff"] <= FORCED_FRACTION * a["p90_logprob_diff"])
        floor = by.get("c-eager")
        def text(f):
            return (f"{f['candidate']}: median {f['median_logprob_diff']:.3f}, p90 {f['p90_logprob_diff']:.3f}, "
                    f"same top token {f['same_top_token']:.0%} of {f['positions']}")
        out.append(_check(f"{cand} scores c-graphs' tokens as closely as (a) does (teacher-forced)", ok,
                          f"{text(b)}; {text(a)}" + (f"; floor {text(floor)}" if floor else "")))
    return out


# the size class in a kept line's reason (patch/measured.py): "<op>: measured slower at <class> (...)" under
# DSV4_KERNEL_PREFER=measured, "<op> <class>: ..." for the built-in keep rules
KEPT_CLASS = re.compile(r"measured slower at (\S+)|^\w+ (\S+): ")


def kept_classes(kept: List[str]) -> Set[Tuple[str, str]]:
    """(op, size class) of each kept line server.parse_log collected ("<op>: <reason>")."""
    out = set()
    for line in kept:
        op, _, why = line.partition(": ")
        m = KEPT_CLASS.search(why)
        if m:
            out.add((op, m.group(1) or m.group(2)))
    return out


def measured_classes(doc: dict) -> Tuple[Set[Tuple[str, str]], Set[str]]:
    """From a user bench file: the (op, class) pairs where SGLang's kernel won and can run here (a -measured session
    must keep SGLang's kernel there and only there), and the ops ours won a class of (patched under it)."""
    losing, won_ops = set(), set()
    for op, rec in (doc.get("ops") or {}).items():
        for cls, v in ((rec or {}).get("classes") or {}).items():
            if v.get("winner") == "ours":
                won_ops.add(op)
            elif v.get("handback_runnable"):
                losing.add((op, cls))
    return losing, won_ops


def measured_checks(name: str, s: dict) -> List[dict]:
    """A -measured session: the patch read the prepare stage's bench file, and kept SGLang's kernel only in classes
    where that file says SGLang's kernel won (built-in keep rules do not apply under DSV4_KERNEL_PREFER=measured)."""
    f, lg = s.get("measured_file"), s.get("log", {})
    if not f:
        return [_check(f"{name}: a user bench file to read", False, "prepare wrote none (logs/user_bench.log)")]
    said = lg.get("measured", [])
    out = [_check(f"{name}: the patch read the user bench's file", any(ln.startswith("read ") and f["file"] in ln
                                                                          for ln in said), f"{f['file']}; said: {said}")]
    losing, _ = measured_classes(f)
    kept = kept_classes(lg.get("kept", []))
    out.append(_check(f"{name}: SGLang's kernel kept only where the file says it won", kept <= losing,
                      f"kept {sorted(kept) or 'none'}; the file's SGLang wins {sorted(losing) or 'none'}"
                      + (f"; kept against the file: {sorted(kept - losing)}" if kept - losing else "")))
    return out


def _check(name: str, ok: bool, detail: str, gating: bool = True) -> dict:
    """A check of the run; ``gating`` False marks a row shown for information (it does not fail the run)."""
    return {"name": name, "pass": bool(ok), "detail": detail, "gating": gating}


def checks(sessions: Dict[str, dict], weights: Dict[str, dict], comps: List[dict], tp: int) -> List[dict]:
    out = []
    for name, s in sorted(sessions.items()):
        if s.get("soak") is None:
            out.append(_check(f"{name}: starts and serves", s.get("started") and s.get("served"),
                              s.get("error") or f"ready in {s.get('ready_s', 0):.0f} s"))
        lg = s.get("log", {})
        lines = lg.get("shim_lines", [])
        if s.get("started"):
            out.append(_check(f"{name}: seeded dummy weights in each of the {tp} TP worker(s)",
                              lg.get("weights_seeded_processes") == tp,
                              f"{lg.get('weights_seeded_processes')} process(es) seeded their weights"))
        if s["setup"] in ("a", "b"):
            ok = lg.get("shim_processes", 0) >= 2 and all("SM120 view" in ln for ln in lines)
            out.append(_check(f"{name}: SM120 view in every SGLang process", ok,
                              f"{lg.get('shim_processes', 0)} processes; {lines[:2]}"))
            if s.get("instruction_class"):
                out.append(class_check(name, s))
        else:
            out.append(_check(f"{name}: native paths (no SM120 view)", not any("SM120 view" in ln for ln in lines),
                              f"{lg.get('shim_processes', 0)} processes"))
        if s["setup"] == "b":
            n_ours, n_shim = lg.get("dsv4_startup_lines", 0), lg.get("shim_processes", 0)
            active = all(" active:" in ln for ln in lg.get("dsv4_startup_examples", []))
            out.append(_check(f"{name}: our start-up line in every SGLang process",
                              n_ours >= 2 and n_ours == n_shim and active,
                              f"{n_ours} start-up lines, {n_shim} processes; {lg.get('dsv4_startup_examples', [])[:1]}"))
            # under DSV4_KERNEL_PREFER=measured an op SGLang won every class of is not patched at all
            ops = OP_TARGETS if not s.get("measured_file") else \
                {op: t for op, t in OP_TARGETS.items() if op in measured_classes(s["measured_file"])[1]}
            done = set(lg.get("patched", [])) | set(lg.get("env_set", []))
            missing = [op for op, targets in ops.items() if not done.intersection(targets)]
            out.append(_check(f"{name}: the log names each op's target patched", not missing,
                              f"patched: {sorted(done)}" + (f"; no target of {missing}" if missing else "")))
            ran = {r.split(":")[0] for r in lg.get("ran", [])}
            not_ran = [op for op in ops if op not in ran]
            out.append(_check(f"{name}: each of our ops ran (its first call logged)", not not_ran,
                              f"ran: {lg.get('ran', [])}" + (f"; never ran: {not_ran}" if not_ran else "")))
        if s["setup"] == "b" and name.endswith("-measured"):
            out += measured_checks(name, s)
        if _spec(name) is not None and _spec(name).default:
            out.append(default_row(name, s, sessions))
        if s.get("soak") is not None:
            sk = s["soak"]
            mem = sk.get("memory", {})
            gpu = (mem.get("gpu_mib") or {}).get("growth_mib")
            rss = mem.get("rss_mib") or {}
            rss_frac = (rss["growth_mib"] / rss["after_warmup"]) if rss.get("after_warmup") else None
            out.append(_check(f"{name}: {sk['requests']} requests, 0 failed", sk["failed"] == 0 and
                              sk["completed"] == sk["requests"], f"{sk['completed']} completed, {sk['failed']} failed, "
                              f"{sk['skipped']} skipped; {sk.get('failures', [])[:3]}"))
            out.append(_check(f"{name}: 0 server errors", lg.get("error_lines", 1) == 0,
                              f"{lg.get('error_lines')} error lines in the log"))
            out.append(_check(f"{name}: memory flat after warm-up",
                              mem.get("enough_samples") and gpu is not None and gpu <= SOAK_GPU_GROWTH_MIB
                              and rss_frac is not None and rss_frac <= SOAK_RSS_GROWTH_FRACTION,
                              f"GPU growth {gpu} MiB (limit {SOAK_GPU_GROWTH_MIB}), host RSS growth "
                              f"{rss_frac if rss_frac is None else f'{rss_frac:.1%}'} (limit "
                              f"{SOAK_RSS_GROWTH_FRACTION:.0%})"))
    prints = {}
    for name, models in weights.items():
        for model, rec in models.items():
            prints.setdefault(model, {}).setdefault(rec["fingerprint"], []).append(name)
    for model, by_print in prints.items():
        out.append(_check(f"same dummy weights in every session ({model})", len(by_print) == 1,
                          "; ".join(f"{fp}: {sorted(names)}" for fp, names in by_print.items())))
    # Token for token under the issue's margins: information where the native noise floor (c-graphs vs c-eager:
    # DeepSeek's own kernels under two batchings) fails it too, since then it cannot tell a wrong kernel from
    # rounding; a gating check while the floor passes. The relative checks below always gate.
    floor = next((c for c in comps if (c["candidate"], c["reference"]) == ("c-graphs", "c-eager")), None)
    strict_gates = floor is None or floor["pass"]
    for c in comps:
        out.append(_check(f"{c['candidate']} agrees with {c['reference']}", c["pass"],
                          f"{c['identical_prompts']}/{c['prompts']} prompts identical, "
                          f"{c['allowed_differences']} near-tie and {c['disallowed_differences']} clear differences, "
                          f"{c['logprob_violations']} logprobs over {c['logprob_tol']} (max {c['max_logprob_diff']:.3g})"
                          + ("" if strict_gates else "; information only: the native noise floor fails it too"),
                          gating=strict_gates))
    out += relative_checks(comps)
    out += forced_checks(forced_comparisons(sessions))
    return out


def _spec(name: str):
    try:
        return parse_session(name)
    except ValueError:
        return None


TL_LINE = "TileLang: tl.disable_wgmma"


def class_check(name: str, s: dict) -> dict:
    """An SM120-view session built its Triton and TileLang kernels in the class it asked for: mma (DISABLE_MMA_V3=1
    in the environment, the shim's TileLang line in every SGLang process) or native (neither)."""
    env, lines = s.get("env") or {}, (s.get("log") or {}).get("shim_lines", [])
    tl = [TL_LINE in ln for ln in lines]
    if s["instruction_class"] == "mma":
        ok = env.get("DISABLE_MMA_V3") == "1" and bool(tl) and all(tl)
        what = "SM120's instruction class: DISABLE_MMA_V3=1 and TileLang's tl.disable_wgmma in every SGLang process"
    else:
        ok = "DISABLE_MMA_V3" not in env and not any(tl)
        what = "the test GPU's own instruction class (no DISABLE_MMA_V3, no forced TileLang pass config)"
    return _check(f"{name}: {what}", ok, f"DISABLE_MMA_V3={env.get('DISABLE_MMA_V3')}, TRITON_CACHE_DIR="
                  f"{env.get('TRITON_CACHE_DIR')}; TileLang line in {sum(tl)}/{len(lines)} shim lines")


def default_row(name: str, s: dict, sessions: Dict[str, dict]) -> dict:
    """(b) with default settings: what the start said (information; the measured-by-default dispatch is issue 62's)."""
    lg = s.get("log") or {}
    first = sessions.get(name[:-len("-restart")]) if name.endswith("-restart") else None
    detail = (f"ready in {s.get('ready_s') or 0:.0f} s" + (f" (first start {first.get('ready_s') or 0:.0f} s)"
                                                            if first else "")
              + f"; cache {((s.get('kernel_cache') or {}).get('files_at_start') or [])[:6]} at start; start-up line "
              f"{(lg.get('dsv4_startup_examples') or ['none'])[0][:300]}; measured {lg.get('measured', [])}; "
              f"kept {lg.get('kept', [])[:4]}; ran {lg.get('ran', [])}" + (f"; error {s['error'][:200]}"
                                                                           if s.get("error") else ""))
    return _check(f"{name}: start-up with default settings "
                  f"({'second start' if name.endswith('-restart') else 'first start, empty kernel cache'})",
                  bool(s.get("started") and s.get("served")), detail, gating=False)


def _closeness_text(c: dict) -> str:
    k = c.get("closeness") or cmp.closeness(c["per_prompt"])
    med = k.get("median_logprob_diff")
    return (f"{c['candidate']} vs {c['reference']}: agreed prefix {k['mean_agreed_prefix']:.2f} tokens, first token "
            f"differs in {k['first_token_differences']}/{k['prompts']}" + (f", median |dlogprob| {med:.3f}"
                                                                             if med is not None else ""))


def relative_checks(comps: List[dict]) -> List[dict]:
    """(b) vs (c) against (a) vs (c) in each mode: our patch may not move the outputs further from DeepSeek's own
    kernels than SGLang's own SM120 path does; the native noise floor (c-graphs vs c-eager) is named beside."""
    by_pair = {(c["candidate"], c["reference"]): c for c in comps}
    floor = by_pair.get(("c-graphs", "c-eager"))
    out = []
    for mode in ("graphs", "eager"):
        b, a = by_pair.get((f"b-{mode}", f"c-{mode}")), by_pair.get((f"a-{mode}", f"c-{mode}"))
        if not b or not a:
            continue
        kb = b.get("closeness") or cmp.closeness(b["per_prompt"])
        ka = a.get("closeness") or cmp.closeness(a["per_prompt"])
        ok = (kb["mean_agreed_prefix"] >= CLOSENESS_PREFIX_FRACTION * ka["mean_agreed_prefix"]
              and kb["first_token_differences"] <= ka["first_token_differences"] + CLOSENESS_FIRST_TOKEN_SLACK)
        detail = f"{_closeness_text(b)}; {_closeness_text(a)}"
        if floor:
            detail += f"; native noise floor {_closeness_text(floor)}"
        out.append(_check(f"b-{mode} is as close to c-{mode} as SGLang's SM120 path (a) is", ok, detail))
    return out


def throughput_rows(sessions: Dict[str, dict]) -> List[dict]:
    rows = []
    for key in ("a", "b", "c"):
        t = sessions.get(f"{key}-graphs", {}).get("throughput")
        if not t:
            continue
        row = {"setup": key}
        for d in t.get("decode", []):
            row[f"decode_c{d['concurrency']}_tok_s"] = d["aggregate_tok_s"]
        for p in t.get("prefill", []):
            row[f"prefill_{p['prompt_tokens'] // 1024}k_tok_s"] = p["prefill_tok_s"]
        row["decode_64k_tok_s"] = (t.get("decode_64k") or {}).get("per_stream_tok_s")
        row["decode_64k_vs_2k"] = t.get("decode_64k_vs_2k")
        rows.append(row)
    return rows


def build(sessions: Dict[str, dict], weights: Dict[str, dict], setups, *, margin: float, logprob_tol: float,
          tp: int, seed: int, config: dict, bandwidth: Optional[dict] = None) -> dict:
    comps = comparisons(sessions, margin, logprob_tol)
    profiles = rprof.build_profiles(sessions, config, tp, bandwidth)
    fractions = rprof.gpu_fractions(profiles, len(config["compress_ratios"]))
    rows = throughput_rows(sessions)
    have = {r["setup"] for r in rows}
    rows += [r for r in rprof.decode_rows(profiles) if r["setup"] not in have]
    slim = {name: {k: v for k, v in s.items() if k not in ("outputs", "forced", "profile")}
            for name, s in sessions.items()}
    outputs = {name: [{k: o.get(k) for k in ("output_ids", "output_token_logprobs", "output_top_logprobs")}
                      for o in s["outputs"]] for name, s in sessions.items() if s.get("outputs")}
    return {
        "harness": {"sglang": SGLANG_VERSION, "tp": tp, "seed": seed, "margin_nats": margin,
                    "logprob_tol_nats": logprob_tol, "layers": layer_kinds(config),
                    "mtp_layers": config.get("num_nextn_predict_layers"), "copy_bandwidth": bandwidth},
        "setups": {k: {"title": s.title, "moe_runner": s.moe_runner, "server_args": list(s.server_args),
                       "env": dict(s.env), "pieces": s.pieces} for k, s in setups.items()},
        "sessions": slim,
        "outputs": outputs,
        "comparisons": comps,
        "forced": forced_comparisons(sessions),
        "throughput": rows,
        "profile_b": (profiles.get("b") or {}).get("8"),
        "profiles": profiles,
        "gpu_fraction": fractions,
        "checks": checks(sessions, weights, comps, tp) + rprof.profile_checks(profiles, fractions),
    }


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if isinstance(v, float) and v < 10 else (f"{v:.0f}" if isinstance(v, float) else str(v))


def markdown(doc: dict) -> str:
    out = ["## What ran (SGLang 0.5.17, TP %d)" % doc["harness"]["tp"], "",
           "| setup | sparse MLA | indexer logits | mHC pre-norm | MoE experts | FP8 linears |", "|---|---|---|---|---|---|"]
    for k, s in doc["setups"].items():
        p = s["pieces"]
        out.append(f"| ({k}) {s['title']} | {p['sparse_mla']} | {p['indexer_logits']} | {p['hc_prenorm']} | "
                   f"{p['moe']} | {p['fp8_linear']} |")
    rows = doc["throughput"]
    if rows:
        cols = ["decode_c1_tok_s", "decode_c8_tok_s", "decode_c32_tok_s", "prefill_2k_tok_s", "prefill_32k_tok_s",
                "decode_64k_tok_s", "decode_64k_vs_2k"]
        out += ["", "## Throughput (CUDA graphs on; rows marked * from the profiles' unprofiled windows)", "",
                "| setup | " + " | ".join(cols) + " |",
                "|---" * (len(cols) + 1) + "|"]
        for r in rows:
            mark = " *" if r.get("source") else ""
            out.append(f"| {r['setup']}{mark} | " + " | ".join(_fmt(r.get(c)) for c in cols) + " |")
    if doc.get("comparisons"):
        out += ["", "## Agreement (16 prompts x 32 greedy tokens)", "",
                "| candidate | reference | identical prompts | mean agreed prefix | first token differs | "
                "median / max chosen-token dlogprob (nats) |", "|---|---|---|---|---|---|"]
        for c in doc["comparisons"]:
            k = c.get("closeness") or cmp.closeness(c["per_prompt"])
            out.append(f"| {c['candidate']} | {c['reference']} | {c['identical_prompts']}/{c['prompts']} | "
                       f"{k['mean_agreed_prefix']:.2f} | {k['first_token_differences']}/{k['prompts']} | "
                       f"{_fmt(k['median_logprob_diff'])} / {c['max_logprob_diff']:.2f} |")
    if doc.get("forced"):
        out += ["", "## Teacher-forced scores of c-graphs' tokens (logprob difference to c-graphs, nats)", "",
                "| session | positions | median | p90 | max | same top token |", "|---|---|---|---|---|---|"]
        for f in doc["forced"]:
            nats = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            out.append(f"| {f['candidate']} | {f['positions']} | {nats(f['median_logprob_diff'])} | "
                       f"{nats(f['p90_logprob_diff'])} | {nats(f['max_logprob_diff'])} | "
                       f"{nats(f['same_top_token'])} |")
    out += rprof.markdown(doc)
    for name, s in sorted(doc["sessions"].items()):
        hb = (s.get("log") or {}).get("handback_warnings") or {}
        if s.get("setup") == "b":
            out.append(f"\n{name}: {sum(hb.values())} hand-back warning(s)" + "".join(f"\n- {k}" for k in hb))
            kept = (s.get("log") or {}).get("kept") or []
            if kept:
                out.append(f"{name}: SGLang's kernel kept where measured faster: " + "; ".join(kept))
    out += ["", "## Checks", "", "| check | result | detail |", "|---|---|---|"]
    for c in doc["checks"]:
        verdict = "pass" if c["pass"] else ("FAIL" if c.get("gating", True) else "fail (information)")
        out.append(f"| {c['name']} | {verdict} | {c['detail'][:300]} |")
    return "\n".join(out) + "\n"


def plot(doc: dict, path: str) -> Optional[str]:
    """Bars of decode and prefill tok/s per setup; None where matplotlib is missing or nothing was measured."""
    rows = doc["throughput"]
    if not rows:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    groups = [("decode tok/s (2K context)", ["decode_c1_tok_s", "decode_c8_tok_s", "decode_c32_tok_s"],
               ["conc 1", "conc 8", "conc 32"]),
              ("prefill tok/s", ["prefill_2k_tok_s", "prefill_32k_tok_s"], ["2K", "32K"]),
              ("decode tok/s, one stream", ["decode_c1_tok_s", "decode_64k_tok_s"], ["2K ctx", "64K ctx"])]
    fig, axes = plt.subplots(1, len(groups), figsize=(15, 4.5))
    width = 0.8 / len(rows)
    for ax, (title, cols, labels) in zip(axes, groups):
        for i, r in enumerate(rows):
            vals = [r.get(c) or 0 for c in cols]
            ax.bar([x + i * width for x in range(len(cols))], vals, width, label=f"({r['setup']})")
        ax.set_xticks([x + width * (len(rows) - 1) / 2 for x in range(len(cols))])
        ax.set_xticklabels(labels)
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle(f"DeepSeek-V4-Flash widths, {len(doc['harness']['layers'])} layers, SGLang 0.5.17, "
                 f"TP {doc['harness']['tp']}: (a) stock SM120 paths, (b) with our patch, (c) native sm_90")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def recheck(doc: dict, weights: Dict[str, dict], tp: int) -> dict:
    """The checks of a finished e2e.json computed again (after a change of the checks): sessions and comparisons
    as recorded, the weight fingerprints from the run's weight logs."""
    doc = dict(doc)
    rows = checks(doc["sessions"], weights, doc["comparisons"], tp)
    if doc.get("forced") and not forced_comparisons(doc["sessions"]):   # the JSON keeps them apart from the sessions
        rows += forced_checks(doc["forced"])
    doc["checks"] = rows + rprof.profile_checks(doc.get("profiles") or {}, doc.get("gpu_fraction") or {})
    return doc


def main(argv=None) -> int:
    import argparse
    import json
    import os

    import run_e2e

    ap = argparse.ArgumentParser(description="Recompute the checks, table and plot of a finished e2e.json")
    ap.add_argument("e2e_json")
    ap.add_argument("--weights", required=True, help="the run's weight logs (e2e_logs.tar.xz: weights/)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--invalid", action="append", default=[], metavar="CHECK=REASON",
                    help="a gating check this run cannot decide, and why (e.g. the run served different weights in "
                         "one setup): recorded in the JSON as invalid_checks; tests/e2e/test_report.py accepts a "
                         "failed gating check only if it is listed there with its reason")
    args = ap.parse_args(argv)
    with open(args.e2e_json) as f:
        doc = json.load(f)
    weights = {name: run_e2e.weight_fingerprint(os.path.join(args.weights, name))
               for name in sorted(os.listdir(args.weights))}
    doc = recheck(doc, weights, doc["harness"]["tp"])
    invalid = dict(doc.get("invalid_checks") or {})
    for item in args.invalid:
        name, sep, reason = item.partition("=")
        if not sep or not reason.strip():
            ap.error(f"--invalid takes CHECK=REASON, got {item!r}")
        if name not in {c["name"] for c in doc["checks"]}:
            ap.error(f"--invalid: no check named {name!r} in this run")
        invalid[name] = reason.strip()
    if invalid:
        doc["invalid_checks"] = invalid
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(args.out, "e2e_table.md"), "w") as f:
        f.write(markdown(doc))
    plot(doc, os.path.join(args.out, "e2e_throughput.png"))
    gating = [c for c in doc["checks"] if c.get("gating", True)]
    print(f"gating checks {sum(c['pass'] for c in gating)}/{len(gating)} passed ({len(doc['checks'])} rows)")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
