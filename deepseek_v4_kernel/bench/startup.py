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

Each size class those rows fall in is timed at the largest rows the server runs in it. Bounds: a total budget
(DSV4_KERNEL_MEASURE_BUDGET_S, default 25 s) shared by the ops, each op getting what is left over the ops left;
SGLang's kernel at the call site is timed first, others only while the op's share lasts; each timing is a CUDA-graph
replay of a few rotated input sets (``time_rotated``: a 7-replay median, each replay <= 60 ms). A class whose
timing did not fit is left undecided (the built-in rules decide it, and the next start tries it again). Every
kernel is checked against the float64 reference first: a wrong or failing competitor is reported, never chosen;
where ours fails, SGLang's kernel runs.
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
OPS_AT_START = ("sparse_decode", "indexer_logits", "hc_prenorm")   # per-call ops decided in the workers
MOE_RUNNER = "fp4_moe_runner"    # ours (SGLang's Triton runner path) against FlashInfer's MXFP4 runner: launcher-side


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
    out: Dict[str, List[grid.Case]] = {}
    for n in sorted(set(rows)):
        for case in make(n):
            out.setdefault(case.size_class, {})[case.params] = case    # the largest n of a class wins
    return {label: list(v.values()) for label, v in out.items()}


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

    makers = {"sparse_decode": (sparse, s.decode_rows), "indexer_logits": (indexer, s.decode_rows),
              "hc_prenorm": (hc, tuple(s.decode_rows) + ((s.prefill_rows,) if s.prefill_rows else ())),
              MOE_RUNNER: (moe, s.decode_rows)}
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
    """A competitor that could run but was not ready to time (FlashInfer would JIT-compile first): undecided, tried
    again at the next start, rather than "cannot run here"."""
    return "JIT" in (c.reason or "")


def measure_cases(cases: Dict[str, Dict[str, List[grid.Case]]], budget: float, say: Callable[[str], None],
                  sglang_version: Optional[str] = None, competitor_filter=None, device=None,
                  l2: Optional[int] = None) -> Dict[str, dict]:
    """Time each op's classes (see the module docstring) -> {op: {"classes": {label: decision}, "sglang_default",
    "competitors", "undecided": {label: why}}}; a decision is runner.classes_of's verdict plus each competitor's
    status per case (a wrong one reported)."""
    import torch

    from . import competitors as comp
    from . import inputs, runner
    from .timing import l2_bytes

    t0 = time.monotonic()
    device = device if device is not None else torch.device("cuda", torch.cuda.current_device())
    pools = inputs.Pools(device, l2 if l2 is not None else l2_bytes())
    results: Dict[str, dict] = {}
    ops = [op for op in cases if cases[op]]
    for i, op in enumerate(ops):
        kernel_op = "fp4_moe" if op == MOE_RUNNER else op
        now = time.monotonic()
        deadline = now + max(0.0, t0 + budget - now) / (len(ops) - i)   # an equal share of what is left
        found = comp.discover(kernel_op)
        if competitor_filter is not None:
            found = [c for c in found if competitor_filter(op, c)]
        if op == MOE_RUNNER:   # the runner SGLang picks by default on SM120 (0.5.16+): FlashInfer's MXFP4 one
            default = next((c.name for c in found if c.name.startswith("flashinfer")), None)
            why_default = "SGLang's default MoE runner for MXFP4 experts (flashinfer_mxfp4)"
        else:
            default, why_default = comp.sglang_default(op, [c.name for c in found], sglang_version)
        order = sorted((c for c in found if c.runnable), key=lambda c: c.name != default)
        blocked = {c.name: c for c in found if not c.runnable}
        rec = {"sglang_default": default, "sglang_default_why": why_default, "classes": {}, "undecided": {},
               "competitors": {c.name: ("runs" if c.runnable else (c.reason or f"same as {c.same_as}"))
                               for c in found}}
        rows_by_class: Dict[str, List[dict]] = {}
        for label, class_cases in cases[op].items():
            for case in class_cases:
                if time.monotonic() > deadline:
                    rec["undecided"][label] = f"over this op's share of the {budget:.0f} s budget"
                    break
                sets = inputs.SETS[kernel_op](case, pools)[:4]
                check = inputs.check_rows(case.n)
                ref = inputs.REFERENCE[kernel_op](sets[0], check)
                row = {"class": label, "label": case.label, "n": case.n, "params": dict(case.params), "results": {}}
                row["results"]["ours"] = runner.measure(kernel_op, "ours", runner.ours_prepare(kernel_op), sets, ref,
                                                        check)
                for c in order:
                    if c.name != default and time.monotonic() > deadline:
                        row["results"][c.name] = {"status": "skipped", "reason": "budget"}
                        continue
                    row["results"][c.name] = runner.measure(kernel_op, c.name, c.prepare, sets, ref, check)
                runner._decide(row, default)
                rows_by_class.setdefault(label, []).append(row)
                del sets
            if label in rec["undecided"]:
                rows_by_class.pop(label, None)
        pools.drop(runner.POOL_PREFIX[kernel_op])
        for label, class_rows in rows_by_class.items():
            if default in blocked and _transient(blocked[default]):
                rec["undecided"][label] = f"{default}: {blocked[default].reason}"
                continue
            if default is not None and any(r["results"].get(default, {}).get("status") == "skipped"
                                           for r in class_rows):
                rec["undecided"][label] = "SGLang's kernel not timed within the budget"
                continue
            v = runner.classes_of(class_rows)[label]
            v["cases"] = [{"label": r["label"], "results": {k: {x: (round(y, 3) if isinstance(y, float) else y)
                                                                 for x, y in res.items()}
                                                             for k, res in r["results"].items()}}
                          for r in class_rows]
            ours_bad = [r["results"]["ours"] for r in class_rows if r["results"]["ours"].get("status") != "ok"]
            if ours_bad:
                v["why"] = f"ours {ours_bad[0].get('status')}: {ours_bad[0].get('reason', '')}"
            elif not v["handback_runnable"]:
                sg = default and next((r["results"].get(default) for r in class_rows
                                       if r["results"].get(default, {}).get("status") != "ok"), None)
                v["why"] = (f"SGLang's {default} {sg.get('status')}: {sg.get('reason', '')}" if sg else
                            f"SGLang's {default or 'path'} cannot run here: "
                            f"{blocked[default].reason if default in blocked else 'not found'}")
            rec["classes"][label] = v
            say(f"{op} {label}: {'ours' if v['winner'] == 'ours' else 'SGLang' + chr(39) + 's'} "
                f"(ours {v['ours_us']} us, {default} {v['sglang_us']} us){' - ' + v['why'] if v.get('why') else ''}")
        for label, why in rec["undecided"].items():
            say(f"{op} {label}: undecided ({why}): the built-in rules decide")
        results[op] = rec
    del pools
    if torch.cuda.is_available():
        torch.cuda.empty_cache()   # SGLang sizes its KV cache from the free memory next
    return results


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
