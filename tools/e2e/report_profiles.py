"""The per-op decode-step profiles of a run in e2e.json's layout, with floors, the one-stream GPU fraction, their
checks and tables (report.py calls these; pure).

e2e.json ``profiles``: {profile key: {concurrency: profile}}, the key being the setup ("a", "b", "c") or
"<setup>-native" for an SM120-view setup in the test GPU's own instruction class; each profile (workloads.
profile_decode, kernel_ops.analyse) holds ``concurrency``, ``steps``, ``us_per_step`` (GPU kernel us per op and step),
``gpu_busy_us_per_step`` (merged kernel intervals), ``wall_us_per_step`` (from the streams' token rate, unprofiled),
``gpu_busy_fraction``, ``top_kernels``, and ``floors`` added here: per op the bytes it must read in the step
(step_model.step_bytes at the profile's concurrency and context), the floor at the run's copy bandwidth and the
measured time's % of it. ``gpu_fraction``: per key, the one-stream fraction against the depth model's prediction.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional

import kernel_ops
import step_model
from sessions import parse_session

FRACTION_TARGET = step_model.DEPTH_MODEL["target"]


def enrich(profile: dict, config: Mapping, tp: int, bandwidth: Optional[dict]) -> dict:
    """The profile with its floors (bytes from the config at its concurrency and context)."""
    out = dict(profile)
    if not profile.get("us_per_step"):
        return out
    bw = (bandwidth or {}).get("bytes_per_s")
    nbytes = step_model.step_bytes(config, int(profile["concurrency"]), float(profile.get("context_tokens") or 0), tp)
    out["floors"] = step_model.floors(nbytes, profile["us_per_step"], bw)
    out["floors_basis"] = {"copy_bytes_per_s": bw, "context_tokens": profile.get("context_tokens"),
                           "moe": "estimate: distinct experts under uniform routing x one expert's MXFP4 bytes"}
    return out


def build_profiles(sessions: Mapping[str, dict], config: Mapping, tp: int,
                   bandwidth: Optional[dict]) -> Dict[str, Dict[str, dict]]:
    profiles: Dict[str, Dict[str, dict]] = {}
    for name, s in sorted(sessions.items()):
        prof = s.get("profile")
        if not isinstance(prof, dict) or not prof:
            continue
        try:
            spec = parse_session(name)
        except ValueError:
            continue
        if not spec.timed:
            continue
        if "us_per_step" in prof or "share" in prof:   # an earlier harness's single profile (concurrency 8)
            prof = {str(prof.get("concurrency", 8)): prof}
        profiles[spec.profile_key] = {c: enrich(p, config, tp, bandwidth) for c, p in prof.items()
                                      if isinstance(p, dict)}
    return profiles


def gpu_fractions(profiles: Mapping[str, Mapping[str, dict]], layers: int) -> Dict[str, dict]:
    """One stream: GPU busy time per step against the step's wall time, beside the depth model's prediction."""
    out = {}
    for key, by_conc in profiles.items():
        p = by_conc.get("1")
        if not p:
            continue
        setup = key.split("-")[0]
        out[key] = {"gpu_busy_us_per_step": p.get("gpu_busy_us_per_step"), "wall_us_per_step": p.get("wall_us_per_step"),
                    "fraction": p.get("gpu_busy_fraction"), "fraction_in_trace": p.get("gpu_busy_fraction_in_trace"),
                    "target": FRACTION_TARGET, "layers": layers,
                    "model": round(step_model.gpu_fraction(layers, setup, pessimistic=False), 3)
                    if setup in step_model.DEPTH_MODEL["gpu_per_layer_us"] else None}
    return out


def decode_rows(profiles: Mapping[str, Mapping[str, dict]]) -> List[dict]:
    """Decode tok/s per key and concurrency from the profiles' unprofiled windows (the throughput table's decode
    columns when no --throughput table ran)."""
    rows = []
    for key in sorted(profiles):
        row = {"setup": key, "source": "profile windows"}
        for conc, p in profiles[key].items():
            row[f"decode_c{conc}_tok_s"] = p.get("decode_tok_s")
        rows.append(row)
    return rows


def _check(name: str, ok: bool, detail: str, gating: bool = True) -> dict:
    return {"name": name, "pass": bool(ok), "detail": detail, "gating": gating}


def profile_checks(profiles: Mapping[str, Mapping[str, dict]], fractions: Mapping[str, dict]) -> List[dict]:
    out = []
    for key, by_conc in sorted(profiles.items()):
        bad = [c for c, p in by_conc.items() if p.get("error") or not p.get("us_per_step")]
        # steps found in the trace against the steps asked for: far off means the step detection counted another
        # unit (e.g. two graph launches a step), which the per-step numbers would then be off by
        odd = [f"c{c}: {p.get('steps')} steps ({p.get('step_method')}) for {p.get('requested_steps')} asked"
               for c, p in by_conc.items() if p.get("requested_steps") and p.get("steps")
               and not 0.5 <= p["steps"] / p["requested_steps"] <= 1.5]
        out.append(_check(f"profile {key}: every concurrency profiled", not bad and bool(by_conc),
                          f"concurrencies {sorted(by_conc, key=int)}" + (f"; failed {bad}: "
                          + "; ".join(str(by_conc[c].get("error"))[:150] for c in bad) if bad else "")
                          + (f"; step count off: {odd}" if odd else "")))
    for key, f in sorted(fractions.items()):
        frac = f.get("fraction")
        out.append(_check(f"profile {key}: GPU busy >= {FRACTION_TARGET:.0%} of the one-stream step "
                          f"({f['layers']} layers)", frac is not None and frac >= FRACTION_TARGET,
                          f"GPU busy {f.get('gpu_busy_us_per_step') or 0:.0f} us of {f.get('wall_us_per_step') or 0:.0f}"
                          f" us per step = {frac if frac is None else f'{frac:.0%}'} (in the trace "
                          f"{f.get('fraction_in_trace') if f.get('fraction_in_trace') is None else format(f['fraction_in_trace'], '.0%')}"
                          f"); depth model {f.get('model')}", gating=False))
    return out


def _fmt(v, digits: int = 0) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}f}"


def markdown(doc: dict) -> List[str]:
    profiles = doc.get("profiles") or {}
    if not profiles:
        return []
    keys = [k for k in ("a", "b", "c", "a-native", "b-native") if k in profiles] + \
        sorted(k for k in profiles if k not in ("a", "b", "c", "a-native", "b-native"))
    concs = sorted({c for p in profiles.values() for c in p}, key=int)
    bw = next((p.get("floors_basis", {}).get("copy_bytes_per_s") for by in profiles.values() for p in by.values()
               if p.get("floors_basis")), None)
    out = ["", f"## Decode step per op: GPU us per step, floor us and % of floor "
               f"(copy bandwidth {_fmt(bw / 1e12 if bw else None, 2)} TB/s)"]
    fr = doc.get("gpu_fraction") or {}
    if fr:
        out += ["", "| one stream | GPU busy us / step | wall us / step | GPU fraction | in the trace | model |",
                "|---|---|---|---|---|---|"]
        for key in [k for k in keys if k in fr]:
            f = fr[key]
            out.append(f"| ({key}) | {_fmt(f.get('gpu_busy_us_per_step'))} | {_fmt(f.get('wall_us_per_step'))} | "
                       f"{_fmt(100 * f['fraction'] if f.get('fraction') is not None else None)} % | "
                       f"{_fmt(100 * f['fraction_in_trace'] if f.get('fraction_in_trace') is not None else None)} % |"
                       f" {_fmt(100 * f['model'] if f.get('model') is not None else None)} % |")
    for conc in concs:
        present = [k for k in keys if conc in profiles[k]]
        out += ["", f"### {conc} stream{'s' if conc != '1' else ''}", "",
                "| op | " + " | ".join(f"({k}) us / floor / %" for k in present) + " |",
                "|---" * (len(present) + 1) + "|"]
        for op in list(kernel_ops.OPS) + ["total"]:
            cells, seen = [], False
            for k in present:
                p = profiles[k][conc]
                if op == "total":
                    us, fl = p.get("kernel_us_per_step"), None
                    known = [v["floor_us"] for v in (p.get("floors") or {}).values() if v["floor_us"] is not None]
                    fl = sum(known) if known else None
                else:
                    us = (p.get("us_per_step") or {}).get(op)
                    fl = ((p.get("floors") or {}).get(op) or {}).get("floor_us")
                seen = seen or us is not None
                pct = f"{100 * fl / us:.0f}" if fl and us else "-"
                cells.append(f"{_fmt(us, 1)} / {_fmt(fl, 1)} / {pct}")
            if seen:
                out.append(f"| {kernel_ops.OP_TITLES.get(op, op)} | " + " | ".join(cells) + " |")
        walls = [profiles[k][conc].get("wall_us_per_step") for k in present]
        out.append("| wall us per step (unprofiled) | " + " | ".join(f"{_fmt(w, 0)}" for w in walls) + " |")
    return out
