"""The first-start measurement of measured dispatch (patch/decisions.py): ours against SGLang's kernels, on this GPU,
at the shapes this server will run, within a time budget.

Called in each TP worker right after SGLang's ``ModelRunner.load_model`` returns (patch/adapters.py:
``model_runner_load_model``): the weights are loaded, the KV cache is not yet allocated (SGLang sizes it from the
free memory afterwards: everything timed here is freed first) and no CUDA graph is being captured (checked:
``torch.cuda.is_current_stream_capturing()``, a capture never sees a timing run). The shapes come from the worker:

* decode rows per call: SGLang's CUDA-graph batch sizes (``server_args.cuda_graph_config.decode.bs`` 0.5.17-0.5.20,
  ``get_exec().graph.cuda_graph_config.decode.bs`` 0.5.21+, ``server_args.cuda_graph_bs`` 0.5.12) times the tokens
  a request decodes per step (``speculative_num_draft_tokens`` under speculative decoding, else 1);
* the prefill chunk (``chunked_prefill_size``) for the mHC pre-norm GEMM;
* the model config (heads, index top-k and heads, hidden size, experts), the TP size (heads per rank, expert
  shards) and the context length (the indexer's compressed context, up to 16K compressed tokens).

Each size class those rows fall in is timed at the largest rows the server runs in it (fp8_linear: every class up
to 64 rows, at wq_b, wo_b and wq_a of the rank). Only ours and the kernel at SGLang's call site (what a hand-back
runs: ``competitors.sglang_default``; fp8_linear: the block-FP8 function the server resolved, its activation
quantization included) are timed: the other kernels of the user bench decide nothing here and cost their first
calls (Triton / DeepGEMM JIT compiles: timing every competitor took 15 s for 2 decisions on an H200, DeepSeek-V4-Flash
shapes, TP 1). Order: round-robin
over the ops, each op's classes the most common first (``_by_class``), so a budget that runs out leaves rare classes
undecided, never a whole op. Bounds: a total budget (DSV4_KERNEL_MEASURE_BUDGET_S, default 25 s), checked before
each case; each timing is a CUDA-graph replay of a few rotated input sets (``time_rotated``: a 7-replay median,
each replay <= 60 ms). A class whose timing did not fit is recorded undecided with the reason (the built-in rules
decide it; later starts read that and time nothing: ``cache measure`` times it). Every kernel is checked against
the float64 reference first: a wrong or failing competitor is reported, never chosen; where ours fails, SGLang's
kernel runs. Each case keeps the wall seconds of its reference and of each candidate (first call, a JIT compile,
included), and each op its discovery time: the log says where the time went.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from . import shapes as grid

log = logging.getLogger("deepseek_v4_kernel")

BUDGET_ENV = "DSV4_KERNEL_MEASURE_BUDGET_S"
DEFAULT_BUDGET_S = 25.0
INDEXER_MAX_CTX = 16384          # compressed tokens (64K of context): the indexer's cost grows linearly beyond
DEFAULT_DECODE_BS = (1, 2, 4, 8, 16, 24, 32)   # where the CUDA-graph batch sizes cannot be read
OPS_AT_START = ("sparse_decode", "indexer_logits", "hc_prenorm", "fp8_linear")   # per-call ops, in the workers
MOE_RUNNER = "fp4_moe_runner"    # ours (behind SGLang's triton runner), FlashInfer's MXFP4 runner, Marlin: launcher


@dataclass
class ServerShapes:
    tp: int = 1
    decode_rows: Tuple[int, ...] = DEFAULT_DECODE_BS
    prefill_rows: int = 0
    heads: int = grid.HEADS                  # attention heads of the model (before TP)
    extra_topk: int = 512                    # the indexer's top-k (the compressed set one decode token reads)
    indexer_ctx: int = 4096                  # compressed context tokens
    moe_inter: int = grid.MOE_INTER // 1
    num_sms: int = 0
    notes: List[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _first(*getters):
    for g in getters:
        try:
            v = g()
        except Exception:  # noqa: BLE001
            continue
        if v:
            return v
    return None


def cuda_graph_batch_sizes(server_args) -> Tuple[Optional[List[int]], str]:
    """SGLang's decode CUDA-graph batch sizes, wherever this version keeps them, and where they came from."""
    def exec_ctx():
        from sglang.srt.runtime_context import get_exec   # 0.5.21+

        return list(get_exec().graph.cuda_graph_config.decode.bs)

    for where, get in (("server_args.cuda_graph_config.decode.bs",
                        lambda: list(server_args.cuda_graph_config.decode.bs)),
                       ("get_exec().graph.cuda_graph_config.decode.bs", exec_ctx),
                       ("server_args.cuda_graph_bs", lambda: list(server_args.cuda_graph_bs))):
        try:
            bs = get()
        except Exception:  # noqa: BLE001
            continue
        if bs:
            return sorted({int(b) for b in bs if int(b) > 0}), where
    return None, "not found"


def server_shapes(model_runner) -> ServerShapes:
    """The shapes of this worker's server (see the module docstring); what could not be read is said in notes."""
    sa = getattr(model_runner, "server_args", None)
    s = ServerShapes()
    s.tp = int(_first(lambda: model_runner.tp_size, lambda: sa.tp_size) or 1)
    bs, where = cuda_graph_batch_sizes(sa)
    if bs is None:
        bs = list(DEFAULT_DECODE_BS)
        s.notes.append(f"CUDA-graph batch sizes not found, timed at {bs}")
    spec = _first(lambda: sa.speculative_algorithm)
    per_req = int(_first(lambda: sa.speculative_num_draft_tokens) or 1) if spec else 1
    s.decode_rows = tuple(sorted({b * per_req for b in bs}))
    s.prefill_rows = int(_first(lambda: sa.chunked_prefill_size) or 0)
    hf = _first(lambda: model_runner.model_config.hf_text_config, lambda: model_runner.model_config.hf_config)
    s.heads = int(_first(lambda: hf.num_attention_heads) or grid.HEADS)
    s.extra_topk = int(_first(lambda: hf.index_topk) or 512)
    ctx = int(_first(lambda: model_runner.model_config.context_len, lambda: sa.context_length) or 65536)
    s.indexer_ctx = max(256, min(ctx // 4, INDEXER_MAX_CTX))
    inter = int(_first(lambda: hf.moe_intermediate_size) or grid.MOE_INTER)
    s.moe_inter = inter // s.tp
    return s


# ----------------------------------------------------------------------------- which classes, at which shapes
def _by_class(op: str, rows, make) -> Dict[str, List[grid.Case]]:
    """{label: cases} in the order the timing takes them: the class more of the server's rows fall in first (a
    budget that runs out leaves the rarer ones undecided), then the smaller rows."""
    out: Dict[str, Dict[tuple, grid.Case]] = {}
    count: Dict[str, int] = {}
    first: Dict[str, int] = {}
    for n in sorted(set(rows)):
        for case in make(n):
            out.setdefault(case.size_class, {})[case.params] = case    # the largest n of a class wins
            count[case.size_class] = count.get(case.size_class, 0) + 1
            first.setdefault(case.size_class, n)
    order = sorted(out, key=lambda lb: (-count[lb], first[lb]))
    return {label: list(out[label].values()) for label in order}


def fp8_rows(decode_rows) -> Tuple[int, ...]:
    """The fp8_linear rows timed: the server's decode rows up to 64 and each class's top (a prefill of few tokens
    calls it eagerly at any size up to 64: every class ours may take is decided)."""
    return tuple(sorted({min(n, grid.FP8_MAX_M) for n in decode_rows} | set(measured_bounds("fp8_linear"))))


def measured_bounds(op: str) -> Tuple[int, ...]:
    from ..patch.measured import CLASS_BOUNDS

    return CLASS_BOUNDS[op]


def wanted_cases(s: ServerShapes, ops=OPS_AT_START, num_sms: int = 132) -> Dict[str, Dict[str, List[grid.Case]]]:
    """{op: {class label: [cases]}}: each class the server's calls fall in, at the largest rows it runs there."""
    heads_rank = max(1, s.heads // s.tp)
    out: Dict[str, Dict[str, List[grid.Case]]] = {}

    def sparse(n):
        heads = [heads_rank]
        if n <= grid.DECODE_PAD_MAX_TOKENS and heads_rank != grid.DECODE_PAD_HEADS:   # SGLang's 64-head pad
            heads.append(grid.DECODE_PAD_HEADS)
        return [grid.Case("sparse_decode", n, grid.size_class("sparse_decode", n, heads=h),
                          (("heads", h), ("extra", s.extra_topk), ("padded", h != heads_rank))) for h in heads]

    def indexer(n):
        return [grid.Case("indexer_logits", n, grid.size_class("indexer_logits", n), (("ctx", s.indexer_ctx),))]

    def hc(n):
        return [grid.Case("hc_prenorm", n, grid.size_class("hc_prenorm", n), (("splits", sp),))
                for sp in (None, grid.sglang_mhc_splits(n, num_sms))]

    def moe(n):
        return [grid.Case("fp4_moe", n, grid.size_class("fp4_moe", n),
                          (("inter", s.moe_inter), ("experts", grid.MOE_EXPERTS)))]

    tp_fp8 = s.tp if s.tp in grid.TP_SIZES else 1

    def fp8(n):
        return [grid.fp8_linear_case(n, *shp) for shp in grid.fp8_linear_shapes(tp_fp8, grid.FP8_STARTUP_SHAPES)]

    makers = {"sparse_decode": (sparse, s.decode_rows), "indexer_logits": (indexer, s.decode_rows),
              "hc_prenorm": (hc, tuple(s.decode_rows) + ((s.prefill_rows,) if s.prefill_rows else ())),
              "fp8_linear": (fp8, fp8_rows(s.decode_rows)), MOE_RUNNER: (moe, s.decode_rows)}
    for op in ops:
        make, rows = makers[op]
        out[op] = _by_class(op, rows, make)
    return out


# ----------------------------------------------------------------------------- timing
def budget_s() -> float:
    raw = os.environ.get(BUDGET_ENV, "").strip()
    if not raw:
        return DEFAULT_BUDGET_S
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"{BUDGET_ENV} must be a number of seconds, got {raw!r}") from None
    if v <= 0:
        raise ValueError(f"{BUDGET_ENV} must be > 0 seconds, got {raw!r}")
    return v


def _transient(c) -> bool:
    """A competitor that could run but was not ready to time (it would JIT-compile first)."""
    return "JIT" in (c.reason or "")


def _schedule(cases: Dict[str, Dict[str, list]]) -> List[Tuple[str, str]]:
    """(op, label) round-robin over the ops, each op's classes in their order (the most common first): whatever the
    budget leaves undecided is the rarer classes of every op, never a whole op."""
    lists = {op: list(v) for op, v in cases.items() if v}
    out = []
    for r in range(max((len(v) for v in lists.values()), default=0)):
        out += [(op, labels[r]) for op, labels in lists.items() if r < len(labels)]
    return out


def _moe_runner_found(kernel_op: str):
    """The MoE runner candidates: SGLang's auto choice (FlashInfer's MXFP4 runner: W4A8 on SM120, W4A16 on sm_90,
    through SGLang's own weight preparation and call) and SGLang's Marlin MXFP4 runner (bench/moe_competitors.py)."""
    import torch

    from .moe_competitors import user_bench_competitors

    fi = "flashinfer_sm120" if torch.cuda.get_device_capability()[0] == 12 else "flashinfer_sm90"
    return user_bench_competitors(include=(fi, "marlin"))


RUNNER_OF = {"ours": "triton"}   # the MoE runner each candidate is (patch/moe_runner.py), by moe_competitors' name


def _runner_backend(name: str) -> str:
    from . import moe_competitors as mc

    return {mc.MARLIN: "marlin", mc.FLASHINFER_SM120: "flashinfer_mxfp4",
            mc.FLASHINFER_SM90: "flashinfer_mxfp4"}.get(name, RUNNER_OF.get(name, name))


def measure_cases(cases: Dict[str, Dict[str, List[grid.Case]]], budget: float, say: Callable[[str], None],
                  sglang_version: Optional[str] = None, competitor_filter=None, device=None,
                  l2: Optional[int] = None, all_competitors: bool = False) -> Dict[str, dict]:
    """Time each op's classes (see the module docstring) -> {op: {"classes": {label: decision}, "sglang_default",
    "competitors", "undecided": {label: why}, "seconds"}}; a decision is runner.classes_of's verdict plus each
    candidate's status and wall seconds per case (a wrong one reported). Only ours and SGLang's kernel at the call
    site are timed (``all_competitors``: every runnable one too); the MoE runner op times every runner."""
    import torch

    from . import competitors as comp
    from . import inputs, runner
    from .timing import l2_bytes

    t0 = time.monotonic()
    device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
    pools = inputs.Pools(device, l2 if l2 is not None else l2_bytes())
    results: Dict[str, dict] = {}
    state: Dict[str, dict] = {}

    def left() -> float:
        return t0 + budget - time.monotonic()

    def setup(op):
        if op in state:
            return state[op]
        ts = time.monotonic()
        kernel_op = "fp4_moe" if op == MOE_RUNNER else op
        found = _moe_runner_found(kernel_op) if op == MOE_RUNNER else comp.discover(kernel_op)
        if competitor_filter is not None:
            found = [c for c in found if competitor_filter(op, c)]
        if op == MOE_RUNNER:   # SGLang's auto choice (0.5.16+ on SM120, 0.5.23 on sm_90 too): FlashInfer's
            default = next((c.name for c in found if c.name.startswith("sglang flashinfer")), None)
            why_default = "SGLang's auto MoE runner for MXFP4 experts (flashinfer_mxfp4)"
        else:
            default, why_default = comp.sglang_default(op, [c.name for c in found], sglang_version)
        timed = [c for c in found if c.runnable and (all_competitors or op == MOE_RUNNER or c.name == default)]
        st = {"kernel_op": kernel_op, "default": default, "timed": sorted(timed, key=lambda c: c.name != default),
              "blocked": {c.name: c for c in found if not c.runnable}, "rows": {}, "seconds": {}}
        results[op] = {"sglang_default": default, "sglang_default_why": why_default, "classes": {}, "undecided": {},
                       "competitors": {c.name: ("runs" if c.runnable else (c.reason or f"same as {c.same_as}"))
                                       for c in found}}
        st["seconds"]["discovery"] = round(time.monotonic() - ts, 3)
        state[op] = st
        return st

    for op, label in _schedule(cases):
        if left() <= 0:
            results.setdefault(op, {"classes": {}, "undecided": {}})["undecided"][label] = (
                f"budget: the {budget:g} s ({BUDGET_ENV}) ran out before this class")
            continue
        st = setup(op)
        kernel_op, default = st["kernel_op"], st["default"]
        rows = []
        for case in cases[op][label]:
            if left() <= 0:
                results[op]["undecided"][label] = f"budget: the {budget:g} s ({BUDGET_ENV}) ran out within this class"
                break
            sets = inputs.SETS[kernel_op](case, pools)[:4]
            check = inputs.check_rows(case.n)
            tr = time.monotonic()
            ref = inputs.REFERENCE[kernel_op](sets[0], check)
            row = {"class": label, "label": case.label, "n": case.n, "params": dict(case.params), "results": {},
                   "seconds": {"reference": round(time.monotonic() - tr, 3)}}
            cands = [("ours", runner.ours_prepare(kernel_op))] + [(c.name, c.prepare) for c in st["timed"]]
            for name, prep in cands:
                if name not in ("ours", default) and left() <= 0:
                    row["results"][name] = {"status": "skipped", "reason": "budget"}
                    continue
                tc = time.monotonic()
                row["results"][name] = runner.measure(kernel_op, name, prep, sets, ref, check)
                row["seconds"][name] = round(time.monotonic() - tc, 3)   # its first call (a JIT compile) included
            runner._decide(row, default)
            rows.append(row)
            del sets
        if label in results[op]["undecided"]:
            continue
        blocked = st["blocked"]
        untimed = default in blocked and _transient(blocked[default])
        if untimed and op != MOE_RUNNER:
            results[op]["undecided"][label] = f"SGLang's {default} not timed: {blocked[default].reason}"
            say(f"{op} {label}: undecided ({results[op]['undecided'][label]}): the built-in rules decide")
            continue
        v = runner.classes_of(rows)[label]
        if untimed:   # the MoE runner: the others' times are kept; SGLang's own choice stays (patch/moe_runner.py)
            v["default_not_timed"] = f"SGLang's {default} not timed: {blocked[default].reason}"
        v["cases"] = [{"label": r["label"], "seconds": r["seconds"],
                       "results": {k: {x: (round(y, 3) if isinstance(y, float) else y) for x, y in res.items()}
                                   for k, res in r["results"].items()}} for r in rows]
        if op == MOE_RUNNER:
            v["runners"] = _runner_times(rows)
        ours_bad = [r["results"]["ours"] for r in rows if r["results"]["ours"].get("status") != "ok"]
        if v.get("default_not_timed"):
            v["why"] = v["default_not_timed"]
        elif ours_bad:
            v["why"] = f"ours {ours_bad[0].get('status')}: {ours_bad[0].get('reason', '')}"
        elif not v["handback_runnable"]:
            sg = default and next((r["results"].get(default) for r in rows
                                   if r["results"].get(default, {}).get("status") != "ok"), None)
            v["why"] = (f"SGLang's {default} {sg.get('status')}: {sg.get('reason', '')}" if sg else
                        f"SGLang's {default or 'path'} cannot run here: "
                        f"{blocked[default].reason if default in blocked else 'not found'}")
        results[op]["classes"][label] = v
        secs = sum(sum(r["seconds"].values()) for r in rows)
        runners = (" [" + ", ".join(f"{k} {u} us" for k, u in v["runners"].items()) + "]") if v.get("runners") else ""
        say(f"{op} {label}: {'ours' if v['winner'] == 'ours' else 'SGLang' + chr(39) + 's'} "
            f"(ours {v['ours_us']} us, {default} {v['sglang_us']} us){runners}"
            f"{' - ' + v['why'] if v.get('why') else ''} ({secs:.2f} s)")
    for op, rec in results.items():
        for label, why in rec["undecided"].items():
            if why.startswith("budget"):
                say(f"{op} {label}: undecided ({why}): the built-in rules decide")
        st = state.get(op)
        if st:
            per = {}
            for label, v in rec["classes"].items():
                for c in v.get("cases", []):
                    for k, sec in c["seconds"].items():
                        per[k] = per.get(k, 0.0) + sec
            rec["seconds"] = dict(st["seconds"], **{k: round(x, 3) for k, x in per.items()})
            slow = sorted(per.items(), key=lambda kv: -kv[1])[:2]
            say(f"{op}: {len(rec['classes'])} decided, {len(rec['undecided'])} undecided; seconds: discovery "
                f"{st['seconds']['discovery']:.2f}" + "".join(f", {k} {x:.2f}" for k, x in slow))
            pools.drop(runner.POOL_PREFIX[st["kernel_op"]])
    del pools
    if torch.cuda.is_available():
        torch.cuda.empty_cache()   # SGLang sizes its KV cache from the free memory next
    return results


def _runner_times(rows: List[dict]) -> Dict[str, Optional[float]]:
    """{backend: summed us over the class's rows, or None where it was not timed ok in every row}."""
    out: Dict[str, Optional[float]] = {}
    for name in rows[0]["results"]:
        ts = [r["results"].get(name, {}) for r in rows]
        ok = all(t.get("status") == "ok" for t in ts)
        out[_runner_backend(name)] = round(sum(t["us"] for t in ts), 2) if ok else None
    return out


# ----------------------------------------------------------------------------- at model load
def _say(msg: str) -> None:
    log.info("deepseek_v4_kernel: %s", msg)


def decide_at_model_load(model_runner, stream=None) -> Optional[object]:
    """Decide (read or time) this worker's classes; prints one line (unless DSV4_KERNEL_QUIET=1). Never raises."""
    from ..patch import decisions, measured, policy

    try:
        if policy.prefer_mode() != measured.MEASURED or measured.bench_file_decides():
            return None
        if decisions.active() is not None:     # a draft model's runner in the same process: decided already
            return decisions.active()
        import torch

        if not torch.cuda.is_available():
            return None
        if torch.cuda.is_current_stream_capturing():
            _say("measured dispatch: a CUDA graph is being captured, nothing timed (the built-in rules decide)")
            return None
        s = server_shapes(model_runner)
        from . import fp8_competitors

        fp8_competitors.RESOLVED = fp8_competitors.from_model(getattr(model_runner, "model", None))
        s.num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
        cases = wanted_cases(s, OPS_AT_START, s.num_sms)
        wanted = {op: list(v) for op, v in cases.items()}
        budget = budget_s()

        def run(todo):
            sub = {op: {lb: cases[op][lb] for lb in labels} for op, labels in todo.items()}
            return measure_cases(sub, budget, _say, policy.sglang_version())

        a = decisions.ensure(s.tp, wanted, run, device_index=torch.cuda.current_device(), shapes=s.as_dict())
        a.notes = s.notes + a.notes
        line = f"[deepseek_v4_kernel] pid {os.getpid()} GPU {torch.cuda.current_device()}: {a.line()}"
        _say(a.line())
        if not policy.env_flag(policy.QUIET):
            print(line, file=stream or sys.stderr, flush=True)
        return a
    except Exception as e:  # noqa: BLE001 - a start never fails for this: the built-in rules decide
        log.warning("deepseek_v4_kernel: measured dispatch failed, the built-in rules decide: %s: %s",
                    type(e).__name__, e)
        return None
