"""Quick GPU self-test of every op against its float64 reference (run by the doctor).

Each check draws fresh random inputs at a DeepSeek-V4-like shape, poisons the output, runs
the op and reports the relative error ||out - ref|| / ||ref|| against a per-dtype bound.
The full coverage lives in tests/; this is the "does it work on this machine" answer.
"""

from __future__ import annotations

import time
import traceback
from typing import Callable, Dict, List, Optional


class CheckFailed(Exception):
    """An op's result outside its bound. Raised, never asserted: ``python -O`` strips asserts, and the doctor would
    then say PASS for a broken op."""


def _within(op: str, what: str, value: float, bound: float, why: str, inclusive: bool = False) -> None:
    """Raise CheckFailed naming the op, the quantity, its value and the bound unless value < bound (<= where
    ``inclusive``); a NaN value fails."""
    ok = value <= bound if inclusive else value < bound
    if not ok:
        raise CheckFailed(f"{op}: {what} = {value:.3g}, not {'<=' if inclusive else '<'} the bound {bound:g} ({why})")


def _rel(out, ref) -> float:
    import torch

    out = out.double().cpu()
    ref = ref.double().cpu()
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(out)):
        return float("inf")
    num = (out[finite] - ref[finite]).norm().item()
    den = ref[finite].norm().item()
    return num / max(den, 1e-30)


def check_sparse_decode(device: str = "cuda") -> str:
    import torch

    from .ops.sparse_decode import sparse_decode
    from .reference.sparse_decode import out_error_ratios, pack_fp8_ds_mla, sparse_decode_ref

    g = torch.Generator(device="cpu").manual_seed(int(time.time()))
    b, s_q, h_q, page, topk, extra_topk = 2, 2, 64, 64, 128, 192
    kv = torch.randn(8 * page, 512, generator=g).to(torch.bfloat16)
    ekv = torch.randn(4 * page, 512, generator=g).to(torch.bfloat16)
    cache = pack_fp8_ds_mla(kv, page).to(device)
    ecache = pack_fp8_ds_mla(ekv, page).to(device)
    q = (torch.randn(b, s_q, h_q, 512, generator=g) * 0.5).to(torch.bfloat16).to(device)
    idx = torch.randint(-1, kv.shape[0], (b, s_q, topk), generator=g, dtype=torch.int32).to(device)
    eidx = torch.randint(-1, ekv.shape[0], (b, s_q, extra_topk), generator=g, dtype=torch.int32).to(device)
    tl_ = torch.tensor([topk - 5, 37], dtype=torch.int32).to(device)
    etl = torch.tensor([extra_topk, 101], dtype=torch.int32).to(device)
    sink = torch.randn(h_q, generator=g).to(device)
    kwargs = dict(topk_length=tl_, extra_k_cache=ecache, extra_indices=eidx, extra_topk_length=etl, attn_sink=sink,
                  softmax_scale=512 ** -0.5)
    out, lse = sparse_decode(q, cache, idx, **kwargs)
    ref_out, ref_lse, scales = sparse_decode_ref(q, cache, idx, **kwargs, error_scales=True)
    e = _rel(out, ref_out)
    el = _rel(lse, ref_lse)
    # and the tests' bounds from the bf16 rounding (per element, per head row; reference.sparse_decode)
    be, br = (x.max().item() for x in out_error_ratios(out, ref_out, scales))
    _within("sparse_decode", "out rel err", e, 1e-2, "bf16 output")
    _within("sparse_decode", "lse rel err", el, 1e-3, "fp32 log-sum-exp")
    _within("sparse_decode", "out's share of the per-element rounding bound", be, 1, "bf16 rounding", inclusive=True)
    _within("sparse_decode", "out's share of the per-head-row rounding bound", br, 1, "bf16 rounding", inclusive=True)
    return f"b={b} s_q={s_q} h_q={h_q} topk={topk}+{extra_topk} sink: out rel err {e:.1e} ({be:.2f} / {br:.2f} of " \
           f"the rounding bounds), lse {el:.1e}"


def check_indexer_logits(device: str = "cuda") -> str:
    import torch

    from .ops.indexer_logits import paged_mqa_logits  # noqa: I001
    from .reference.indexer_logits import pack_paged_k_cache, paged_mqa_logits_ref

    b, next_n, H, blocks_per_row = 3, 2, 64, 5
    max_len = blocks_per_row * 64
    k = torch.randn(b * blocks_per_row, 64, 128)
    cache = pack_paged_k_cache(k).to(device)
    q = (torch.randn(b, next_n, H, 128) * 0.3).to(torch.float8_e4m3fn).to(device)
    w = torch.randn(b * next_n, H).to(device)
    lens = torch.tensor([max_len, 77, 1], dtype=torch.int32).to(device)
    perm = torch.randperm(b * blocks_per_row).to(torch.int32)
    table = perm.reshape(b, blocks_per_row).to(device)
    out = paged_mqa_logits(q, cache, w, lens, table, max_len, clean_logits=True)
    ref = paged_mqa_logits_ref(q, cache, w, lens, table, max_len)
    e = _rel(out, ref)
    _within("indexer_logits", "rel err", e, 2e-3, "fp8 products exact, fp32 accumulation")
    return f"paged b={b} next_n={next_n} H={H} len<={max_len}: rel err {e:.1e}"


def check_hc_prenorm(device: str = "cuda", K: int = 16384) -> str:
    """Decode-sized calls with the caller's splits (SGLang's 64: the compiled few-rows kernel at m = 5, the MMA
    kernel's 16-row tiles at m = 40; 4: the Triton kernel) and without (hc_pre's num_splits None at m = 1: the whole-K
    kernel; m = 3: the few-rows kernel's sub-slices, added by float atomics unless deterministic sums are asked for,
    and, where the atomic sum ran, once more with the fixed-order one, the exchange; m = 40: the 16-row tiles), and
    a prefill-sized one without (the compiled MMA kernel where Triton builds mma.sync, e.g. SM120; "auto" picks)."""
    import torch

    from .ops import hc_prenorm as hp
    from .reference.hc_prenorm import hc_prenorm_gemm_ref

    sums = {"xchg": ", exchange", "atomic": ", atomic sum", "reduce": ", reduce grid"}
    parts = []
    for m, S in ((5, 64), (40, 64), (1, None), (3, None), (3, "fixed"), (40, None), (37, 4), (300, None)):
        if S == "fixed":   # the fixed-order sum of the same call, where "auto" took the atomic one
            if parts[-1][1] != "atomic":
                continue
            S, impl, cfg = None, "cuda", {"atomic": False}
        else:
            impl = cfg = None
        n = 24
        x = torch.randn(m, K).to(torch.bfloat16).to(device)
        fn = (torch.randn(n, K) * K ** -0.5).to(device)
        out = torch.full((m, n) if S is None else (S, m, n), float("nan"), device=device)
        sq = torch.full((m,) if S is None else (S, m), float("nan"), device=device)
        hp.hc_prenorm_gemm(x, fn, out, sq, S, impl=impl, _config=cfg)
        ref_out, ref_sq = hc_prenorm_gemm_ref(x, fn, S)
        e, es = _rel(out, ref_out), _rel(sq, ref_sq)
        _within("hc_prenorm", f"m={m} splits={S}: out rel err", e, 2e-3, "tf32 class")
        _within("hc_prenorm", f"m={m} splits={S}: sqrsum rel err", es, 1e-5, "fp32 sums of squares")
        how, summed = hp.api.last_launch[0], None
        if how == "cuda":
            summed = hp.api.last_launch[3]
            how += ((", whole K" if hp.api.last_launch[2] == "fnrow" else "") + sums.get(summed, "")
                    + (f", {hp.api.last_launch[4]}-row MMA tiles" if hp.api.last_launch[4] in hp.MMA_ROWS else ""))
        parts.append((f"m={m} splits={S} ({how}): out rel err {e:.1e}, sqrsum {es:.1e}", summed))
    return f"K={K}: " + "; ".join(p for p, _ in parts)


def check_fp4_moe(device: str = "cuda", hidden: int = 4096, inter: int = 2048, experts: int = 16) -> str:
    """A few V4-Flash-sized experts (hidden 4096, I 2048, top-6, swiglu clamp, routed scale),
    scales as SGLang keeps them (fp32 powers of two), one slot of an expert on another EP rank."""
    import torch

    from .ops.fp4_moe import LAST_KERNELS, fp4_moe
    from .reference.fp4_moe import fp4_moe_reference, quantize_mxfp4

    M, k = 9, 6
    w13, s13 = quantize_mxfp4(torch.randn(experts, 2 * inter, hidden) * 0.05, scale_dtype=torch.float32)
    w2, s2 = quantize_mxfp4(torch.randn(experts, hidden, inter) * 0.05, scale_dtype=torch.float32)
    x = torch.randn(M, hidden).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(experts)[:k] for _ in range(M)]).to(torch.int32)
    ids[2, 1] = -1
    tw = torch.rand(M, k)
    ref = fp4_moe_reference(x, w13, s13, w2, s2, tw, ids, swiglu_limit=10.0, routed_scaling_factor=1.5)
    args = [t.to(device) for t in (x, w13.view(torch.int8), s13, w2.view(torch.int8), s2, tw, ids)]
    out = torch.full((M, hidden), float("nan"), dtype=torch.bfloat16, device=device)
    fp4_moe(*args, swiglu_limit=10.0, routed_scaling_factor=1.5, out=out)
    e = _rel(out, ref)
    # weights and scales are exact; h between the GEMMs, each slot's y and the output are bf16
    # (measured ~6e-3 at tiny sizes under TRITON_INTERPRET, whose dots are a little coarser)
    _within("fp4_moe", "out rel err", e, 2e-2, "bf16 h, y and output")
    impl = LAST_KERNELS["config"][2]
    return f"M={M} top-{k} of {experts} experts, hidden={hidden} I={inter} ({impl}): out rel err {e:.1e}"


CHECKS: Dict[str, Callable[..., str]] = {   # each takes device="cuda:N"
    "sparse_decode": check_sparse_decode,
    "indexer_logits": check_indexer_logits,
    "hc_prenorm": check_hc_prenorm,
    "fp4_moe": check_fp4_moe,
}


def cuda_devices() -> List[str]:
    import torch

    return [f"cuda:{i}" for i in range(torch.cuda.device_count())]


def run_all(devices: Optional[List[str]] = None) -> List[dict]:
    """Every check on every device in ``devices`` (default: each visible GPU). The current device is left
    as it is (cuda:0 unless the caller set another), so the checks on the other GPUs also show that each
    op runs on the GPU that holds its inputs, as in a process that drives several GPUs."""
    results = []
    for dev in cuda_devices() if devices is None else devices:
        for op, fn in CHECKS.items():
            try:
                detail = fn(device=dev)
                results.append({"op": op, "device": dev, "ok": True, "detail": detail})
            except Exception as e:
                tb = traceback.format_exc(limit=3).strip().splitlines()[-1]
                results.append({"op": op, "device": dev, "ok": False, "detail": f"{type(e).__name__}: {e} ({tb})"})
    return results
