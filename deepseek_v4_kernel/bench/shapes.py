"""DeepSeek-V4-Flash shapes the bench measures, per op, size class and TP size (pure Python: CPU-tested).

Size classes are patch/measured.py's (the per-call decisions read the same labels). Facts (model_facts.md):
64 attention heads (MQA), per TP rank 64 / tp, and SGLang pads a decode q of at most 64 tokens to 64 heads unless
the kernel takes the rank's own (SGLang 0.5.20+, FlashInfer's or ours); main (SWA) set 128 tokens, the extra
(compressed) set top-k 512 on C4 layers and context / 128 on C128 layers; indexer 64 heads x 128 (replicated, not
split by TP) over the compressed context (context / 4); mHC pre-norm GEMM x [m, 4 * 4096], 24 mixes; MoE 256
experts, top-6, hidden 4096, expert intermediate 2048 split over the TP ranks (SGLang's MoE tensor parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..patch.measured import CLASS_VARIABLE, OPS, size_class

TP_SIZES = (1, 2, 4, 8)
HEADS = 64
DECODE_PAD_HEADS, DECODE_PAD_MAX_TOKENS = 64, 64   # SGLang's SM120 decode q padding (SM120_DECODE_MAX_TOKENS)
MAIN_TOPK = 128
EXTRA_TOPK = (512, 2048)            # C4 top-k; C128 at 256K context
INDEXER_HEADS, INDEXER_DIM = 64, 128
INDEXER_CONTEXTS = (4096, 16384, 65536)   # compressed tokens (16K / 64K / 256K of context)
HC_K, HC_N = 4 * 4096, 24
MOE_EXPERTS, MOE_TOPK, MOE_HIDDEN, MOE_INTER = 256, 6, 4096, 2048
MOE_SWIGLU_LIMIT = 10.0

GRIDS = {   # the class variable's grid points (measured.CLASS_BOUNDS) and the quick subset
    "sparse_decode": ((1, 8, 32, 128), (1, 32)),
    "indexer_logits": ((1, 8, 32), (1, 32)),
    "hc_prenorm": ((1, 8, 64, 256, 1024, 4096), (8, 256, 4096)),
    "fp4_moe": ((1, 8, 32, 128, 1024), (8, 128)),
    "fp8_linear": ((1, 8, 16, 64), (1, 16)),
}
# fp8_linear: the dense block-FP8 projections per rank (ops/fp8_linear/shapes.py, plain data); the start-up timing
# takes three of them (the largest column- and row-parallel ones and a replicated one), the bench every plain one
FP8_STARTUP_SHAPES = ("wq_b", "wo_b", "wq_a")
FP8_MAX_M = 64   # above it SGLang's GEMM runs anyway (patch/fp8_adapters.py FP8_LINEAR_MAX_M)


@dataclass(frozen=True)
class Case:
    op: str
    n: int                               # batch rows / m / tokens: the class variable
    size_class: str                      # measured.size_class label (what a per-call decision looks up)
    params: Tuple[Tuple[str, object], ...] = ()

    def get(self, key, default=None):
        return dict(self.params).get(key, default)

    @property
    def label(self) -> str:
        """e.g. 'b=8 heads=64(pad) extra=512', 'm=64 splits=None', 'tokens=8 inter=512'."""
        parts = [f"{CLASS_VARIABLE[self.op]}={self.n}"]
        for k, v in self.params:
            if k == "padded" or k == "experts":
                continue
            parts.append(f"{k}={v}" + ("(pad)" if k == "heads" and self.get("padded") else ""))
        return " ".join(parts)


def check_tp(tp) -> int:
    if not isinstance(tp, int) or tp not in TP_SIZES:
        raise ValueError(f"tp must be one of {', '.join(map(str, TP_SIZES))} (DeepSeek-V4-Flash's {HEADS} heads split "
                         f"evenly over the ranks), got {tp!r}")
    return tp


def sglang_mhc_splits(m: int, num_sms: int, K: int = HC_K) -> int:
    """SGLang's split count for the pre-norm GEMM (mhc._compute_num_split_for_mhc_pre: 64 x 64 tiles over the SMs)."""
    grid = (m + 63) // 64
    return max(1, min(num_sms // max(grid, 1), ((K + 63) // 64) // 4))


def sparse_decode_cases(tp: int, pad: bool = True, quick: bool = False) -> List[Case]:
    """b rows of one decode token at the rank's own heads (64 / tp), plus, with ``pad``, SGLang's 64-head pad for
    calls of up to 64 tokens (what runs where q stays padded: SGLang < 0.5.20, or its pad left on)."""
    heads_rank = HEADS // check_tp(tp)
    grid = GRIDS["sparse_decode"][1 if quick else 0]
    extras = EXTRA_TOPK[:1] if quick else EXTRA_TOPK
    cases = []
    for b in grid:
        heads = [heads_rank]
        if pad and b <= DECODE_PAD_MAX_TOKENS and heads_rank != DECODE_PAD_HEADS:
            heads.insert(0, DECODE_PAD_HEADS)
        for h in heads:
            for e in extras:
                cases.append(Case("sparse_decode", b, size_class("sparse_decode", b, heads=h),
                                  (("heads", h), ("extra", e), ("padded", h != heads_rank))))
    return cases


def indexer_cases(tp: int, quick: bool = False) -> List[Case]:
    check_tp(tp)
    grid = GRIDS["indexer_logits"][1 if quick else 0]
    contexts = INDEXER_CONTEXTS[1:2] if quick else INDEXER_CONTEXTS
    return [Case("indexer_logits", b, size_class("indexer_logits", b), (("ctx", c),)) for b in grid for c in contexts]


def hc_prenorm_cases(tp: int, num_sms: int, quick: bool = False) -> List[Case]:
    """Each m with num_splits None (hc_pre's DeepGEMM branch) and SGLang's split count (mhc_pre / the fused step)."""
    check_tp(tp)
    if not isinstance(num_sms, int) or num_sms < 1:
        raise ValueError(f"num_sms must be the GPU's SM count (a positive int), got {num_sms!r}")
    grid = GRIDS["hc_prenorm"][1 if quick else 0]
    cases = []
    for m in grid:
        for s in (None, sglang_mhc_splits(m, num_sms)):
            cases.append(Case("hc_prenorm", m, size_class("hc_prenorm", m), (("splits", s),)))
    return cases


def fp4_moe_cases(tp: int, quick: bool = False) -> List[Case]:
    inter = MOE_INTER // check_tp(tp)
    grid = GRIDS["fp4_moe"][1 if quick else 0]
    return [Case("fp4_moe", t, size_class("fp4_moe", t), (("inter", inter), ("experts", MOE_EXPERTS)))
            for t in grid]


def fp8_linear_shapes(tp: int, names: Optional[Tuple[str, ...]] = None):
    """The plain (not grouped) dense FP8 projections of one rank, as (name, N, K); ``names``: those only."""
    from ..ops.fp8_linear.shapes import model_shapes

    out = [(s.name, s.N, s.K) for s in model_shapes(check_tp(tp)) if s.groups is None]
    return [o for o in out if names is None or o[0] in names]


def fp8_linear_case(m: int, name: str, N: int, K: int) -> Case:
    return Case("fp8_linear", m, size_class("fp8_linear", m), (("shape", name), ("N", N), ("K", K)))


def fp8_linear_cases(tp: int, quick: bool = False) -> List[Case]:
    grid = GRIDS["fp8_linear"][1 if quick else 0]
    shp = fp8_linear_shapes(tp, FP8_STARTUP_SHAPES if quick else None)
    return [fp8_linear_case(m, *s) for m in grid for s in shp]


def cases(op: str, tp: int, num_sms: int, quick: bool = False, pad: bool = True) -> List[Case]:
    if op == "sparse_decode":
        return sparse_decode_cases(tp, pad, quick)
    if op == "indexer_logits":
        return indexer_cases(tp, quick)
    if op == "hc_prenorm":
        return hc_prenorm_cases(tp, num_sms, quick)
    if op == "fp4_moe":
        return fp4_moe_cases(tp, quick)
    if op == "fp8_linear":
        return fp8_linear_cases(tp, quick)
    raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")


def parse_ops(text: Optional[str]) -> List[str]:
    """'--ops a,b' -> the op names, in the order given; every name checked."""
    if text is None or text.strip() == "":
        return list(OPS)
    ops = [t.strip() for t in text.split(",") if t.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise ValueError(f"--ops must be a comma-separated subset of {','.join(OPS)}, got {text!r}"
                         + (f" ({', '.join(bad)} unknown)" if bad else ""))
    return list(dict.fromkeys(ops))


def case_bytes(case: Case) -> Dict[str, float]:
    """Bytes a call must move at least (read once, written once): the byte floor's numerator."""
    if case.op == "sparse_decode":
        h, e = case.get("heads"), case.get("extra")
        return {"bytes": case.n * (MAIN_TOPK + e) * 584 + 2 * case.n * h * 512 * 2}
    if case.op == "indexer_logits":
        c = case.get("ctx")
        return {"bytes": case.n * c * (132 + 4) + case.n * INDEXER_HEADS * (INDEXER_DIM + 4)}
    if case.op == "hc_prenorm":
        s = case.get("splits") or 1
        return {"bytes": case.n * HC_K * 2 + HC_N * HC_K * 4 + s * case.n * (HC_N + 1) * 4}
    if case.op == "fp8_linear":
        N, K = case.get("N"), case.get("K")
        return {"bytes": N * K + (-(-N // 128)) * (-(-K // 128)) * 4 + case.n * (K + N) * 2}
    inter = case.get("inter")
    per_expert = 3 * MOE_HIDDEN * inter // 2 + 3 * MOE_HIDDEN * inter // 32
    distinct = MOE_EXPERTS * (1 - (1 - MOE_TOPK / MOE_EXPERTS) ** case.n)   # expected experts hit by random routing
    return {"bytes": distinct * per_expert + 2 * case.n * MOE_HIDDEN * 2}
