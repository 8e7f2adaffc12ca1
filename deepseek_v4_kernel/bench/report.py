"""The bench's JSON (what DSV4_KERNEL_PREFER=measured reads: patch/measured.py) and its one printed table."""

from __future__ import annotations

import datetime
import json
import os
from typing import Dict, List, Optional

from ..patch import measured

VERSIONED = {   # name in the JSON -> distributions that may provide it
    "torch": ("torch",), "triton": ("triton",), "sglang": ("sglang",),
    "flashinfer": ("flashinfer-python", "flashinfer"), "tilelang": ("tilelang",),
    "deep_gemm": ("sgl-deep-gemm", "deep-gemm", "deep_gemm"), "sgl_kernel": ("sglang-kernel", "sgl-kernel"),
}


def versions() -> Dict[str, Optional[str]]:
    from importlib import metadata

    out = {}
    for key, dists in VERSIONED.items():
        out[key] = None
        for d in dists:
            try:
                out[key] = metadata.version(d)
                break
            except Exception:  # noqa: BLE001
                continue
    return out


def gpu_info(device=None) -> dict:
    import torch

    dev = torch.cuda.current_device() if device is None else device
    p = torch.cuda.get_device_properties(dev)
    return {"name": torch.cuda.get_device_name(dev), "capability": list(torch.cuda.get_device_capability(dev)),
            "sm_count": p.multi_processor_count, "l2_bytes": int(getattr(p, "L2_cache_size", 0))}


def build(gpu: dict, vers: dict, tp: int, options: dict, ops: Dict[str, dict], package_version: str) -> dict:
    """The JSON document (schema measured.SCHEMA); ``ops`` from runner.run_op."""
    return {"schema": measured.SCHEMA, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "deepseek_v4_kernel": package_version, "gpu": gpu, "versions": vers, "tp": tp, "options": options,
            "ops": {op: {"sglang_default": rec.get("sglang_default"), "sglang_default_why": rec.get("sglang_default_why"),
                         "competitors": rec.get("competitors", []), "classes": rec.get("classes", {}),
                         "rows": [_compact_row(r) for r in rec.get("rows", [])], "seconds": rec.get("seconds")}
                    for op, rec in ops.items()}}


def _compact_row(r: dict) -> dict:
    res = {}
    for name, v in r["results"].items():
        res[name] = {k: (round(x, 3) if isinstance(x, float) else x) for k, x in v.items()}
    keep = {k: r.get(k) for k in ("class", "label", "n", "params", "sets", "ours_us", "best", "best_us", "sglang",
                                   "sglang_us", "ratio", "winner", "handback_runnable", "floor_us")}
    keep["results"] = res
    return keep


REQUIRED = {"schema", "deepseek_v4_kernel", "gpu", "versions", "tp", "ops"}
CLASS_KEYS = {"winner", "ours_us", "sglang_us", "sglang", "ratio", "handback_runnable"}


def schema_errors(doc: dict) -> List[str]:
    """What a bench JSON lacks (each names the field); [] when it is complete."""
    errs = [f"missing top-level field {k!r}" for k in sorted(REQUIRED - set(doc))]
    gpu = doc.get("gpu") or {}
    for k in ("name", "capability", "sm_count"):
        if k not in gpu:
            errs.append(f"missing gpu.{k}")
    if not isinstance(gpu.get("capability"), list) or len(gpu.get("capability") or []) != 2:
        errs.append(f"gpu.capability must be [major, minor], got {gpu.get('capability')!r}")
    for k in ("torch", "triton", "sglang", "flashinfer", "tilelang"):
        if k not in (doc.get("versions") or {}):
            errs.append(f"missing versions.{k}")
    for op, rec in (doc.get("ops") or {}).items():
        if op not in measured.OPS:
            errs.append(f"ops.{op}: unknown op (expected one of {', '.join(measured.OPS)})")
        for label, c in (rec.get("classes") or {}).items():
            miss = CLASS_KEYS - set(c)
            if miss:
                errs.append(f"ops.{op}.classes.{label}: missing {', '.join(sorted(miss))}")
            if c.get("winner") not in ("ours", "sglang"):
                errs.append(f"ops.{op}.classes.{label}.winner must be 'ours' or 'sglang', got {c.get('winner')!r}")
    return errs


def write(doc: dict, path: str) -> str:
    errs = schema_errors(doc)
    if errs:
        raise ValueError("bench JSON incomplete: " + "; ".join(errs))
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=False)
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- the table
def _cell(res: Optional[dict]) -> str:
    if not res:
        return "-"
    if res.get("status") == "ok":
        return f"{res['us']:.1f}" + ("*" if not str(res.get("how", "graph")).startswith("graph") else "")
    return {"n/a": "n/a", "wrong": "WRONG", "failed": "fail"}.get(res.get("status"), "?")


def table(doc: dict) -> str:
    """One table: op, case, ours µs, each timed competitor's µs (columns keyed in a legend), SGLang's path / ours,
    and what the patch runs there. '*' = eager timing (capture failed); WRONG / fail / n/a: see the JSON."""
    lines = []
    for op, rec in doc["ops"].items():
        names = [c["name"] for c in rec["competitors"] if c["runnable"]]
        names += sorted({n for r in rec["rows"] for n in r["results"]
                         if n.startswith("ours ") and n not in names})
        keys = {n: f"c{i}" for i, n in enumerate(names, 1)}
        head = ["op", "class", "case", "ours"] + [keys[n] for n in names] + ["sglang/ours", "runs"]
        body = []
        for r in rec["rows"]:
            runs = "ours" if r["winner"] == "ours" else f"sglang ({keys.get(r['sglang'], r['sglang'])})"
            ratio = f"{r['ratio']:.2f}x" if r.get("ratio") else "-"
            body.append([op, r["class"], r["label"], _cell(r["results"].get("ours"))]
                        + [_cell(r["results"].get(n)) for n in names] + [ratio, runs])
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        fmt = "  ".join("{:<%d}" % w for w in widths)
        lines.append(fmt.format(*head))
        lines += [fmt.format(*row) for row in body]
        default = rec.get("sglang_default")
        lines.append(f"  SGLang's path at the patched call site: {keys.get(default, default) or 'none'} "
                     f"({rec.get('sglang_default_why')})")
        for n in names:
            lines.append(f"  {keys[n]} = {n}")
        for c in rec["competitors"]:
            if not c["runnable"]:
                why = f"same kernel as {c['same_as']}" if c["same_as"] else c["reason"]
                lines.append(f"  not timed: {c['name']}: {why}")
        for label, c in rec["classes"].items():
            lines.append(f"  class {label}: {c['winner']} runs"
                         + (f" (SGLang's {c['sglang_us']} us / ours {c['ours_us']} us)" if c.get("sglang_us") else ""))
        lines.append("")
    return "\n".join(lines)
