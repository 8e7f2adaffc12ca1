"""Inputs of one bench case (bench/competitors.py's forms), rotated so that a timed call reads from HBM, and the
float64 reference of a few of their rows (deepseek_v4_kernel/reference) to check every kernel before it is timed.

The caches are packed by our reference packers (a seed of real packed pages, repeated over a pool several times
the GPU's L2, so that random rows of one call are not the rows the previous call left in L2); every set has its
own q, weights and indices / page tables / routing over the shared pool. The MoE weights are random packed bytes
(every byte is two valid e2m1 codes) with UE8M0 scales 2^-9 .. 2^-3, one weight set (GiBs: its experts are cold
for every call but the ones the previous call hit).
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import torch

from ..reference import fp4_moe as ref_moe
from ..reference import fp8_linear as ref_fp8
from ..reference import hc_prenorm as ref_hc
from ..reference import indexer_logits as ref_idx
from ..reference import sparse_decode as ref_sd
from . import shapes
from .timing import rotation_count

# Relative L2 error of the checked rows against the float64 reference beyond which a kernel is reported wrong
# (not timed). Well above each op's rounding (our kernels are within 1e-3 .. 1e-2 of these references; FlashInfer's
# fp8 Q / P and W4A8's fp8 activations a few 1e-2) and far below a layout or indexing mistake (order 1).
TOLERANCE = {"sparse_decode": 0.08, "indexer_logits": 0.02, "hc_prenorm": 0.01, "fp4_moe": 0.08,
             "fp8_linear": 0.08}   # fp8_linear: SGLang's backends quantize x to e4m3 per 1 x 128 (~3 % of the norm)
SWA_PAGE, EXTRA_PAGE = 256, 64
MAX_SETS = 64


def sglang_page_stride(page_size: int) -> int:
    """SGLang's bytes per page of the fp8_ds_mla cache: page_size * 584 rounded up to a multiple of 576."""
    return math.ceil(page_size * ref_sd.TOKEN_BYTES / 576) * 576


def _tile_pages(seed: torch.Tensor, pages: int) -> torch.Tensor:
    reps = -(-pages // seed.shape[0])
    return seed.repeat(reps, 1)[:pages].contiguous()


def packed_pool(pages: int, page_size: int, gen: torch.Generator, device) -> torch.Tensor:
    """[pages, page_size, 1, 584] fp8_ds_mla cache (SGLang's page stride) filled with reference-packed pages."""
    stride = sglang_page_stride(page_size)
    seed_pages = min(pages, 16)
    kv = torch.randn(seed_pages * page_size, 512, generator=gen)
    seed = ref_sd.pack_fp8_ds_mla(kv, page_size, stride)                # CPU, uint8 view over [seed_pages, stride]
    raw_seed = torch.as_strided(seed, (seed_pages, stride), (stride, 1)).to(device)
    raw = _tile_pages(raw_seed, pages)
    return torch.as_strided(raw, (pages, page_size, 1, ref_sd.TOKEN_BYTES), (stride, ref_sd.TOKEN_BYTES,
                                                                                ref_sd.TOKEN_BYTES, 1))


def compact_pages(cache: torch.Tensor, indices: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """The pages ``indices`` touch, copied to the CPU as a small cache, and the indices remapped onto it (so that
    the float64 reference unpacks a few pages, not the pool)."""
    ps, stride = cache.shape[1], cache.stride(0)
    raw = torch.as_strided(cache, (cache.shape[0], stride), (stride, 1))
    idx = indices.long()
    valid = idx >= 0
    page = torch.where(valid, idx // ps, torch.zeros_like(idx))
    used = torch.unique(page[valid])
    remap = torch.full((cache.shape[0],), -1, dtype=torch.long, device=idx.device)
    remap[used] = torch.arange(used.numel(), device=idx.device)
    new_idx = torch.where(valid, remap[page] * ps + idx % ps, torch.full_like(idx, -1)).int()
    sub = raw[used].cpu().contiguous().view(-1)
    small = torch.as_strided(sub, (used.numel(), ps, 1, ref_sd.TOKEN_BYTES), (stride, ref_sd.TOKEN_BYTES,
                                                                               ref_sd.TOKEN_BYTES, 1))
    return small, new_idx.cpu()


def check_rows(n: int) -> List[int]:
    return [0] if n == 1 else [0, n - 1]


# ----------------------------------------------------------------------------- builders
class Pools:
    """Shared per-run storage (cache pools, MoE weights), built on first use and kept for the next cases."""

    def __init__(self, device, l2: int, seed: int = 0):
        self.device, self.l2 = device, l2
        self.gen_cpu = torch.Generator().manual_seed(seed)
        self.gen = torch.Generator(device=device).manual_seed(seed)
        self._store: Dict[str, object] = {}

    def get(self, key, make):
        if key not in self._store:
            self._store[key] = make()
        return self._store[key]

    def drop(self, prefix: str):
        for k in [k for k in self._store if k.startswith(prefix)]:
            del self._store[k]
        torch.cuda.empty_cache()


def sparse_decode_sets(case: shapes.Case, pools: Pools) -> List[dict]:
    b, h, extra = case.n, case.get("heads"), case.get("extra")
    dev, g = pools.device, pools.gen
    main = pools.get("sd.main", lambda: packed_pool(max(64, math.ceil(2 * pools.l2 / sglang_page_stride(SWA_PAGE))),
                                                    SWA_PAGE, pools.gen_cpu, dev))
    ext = pools.get("sd.extra", lambda: packed_pool(max(256, math.ceil(6 * pools.l2 / sglang_page_stride(EXTRA_PAGE))),
                                                    EXTRA_PAGE, pools.gen_cpu, dev))
    main_tokens, extra_tokens = main.shape[0] * SWA_PAGE, ext.shape[0] * EXTRA_PAGE
    n = rotation_count(shapes.case_bytes(case)["bytes"], pools.l2, hi=MAX_SETS)
    sink = torch.randn(h, device=dev, generator=g)
    sets = []
    for _ in range(n):
        start = torch.randint(0, main_tokens - shapes.MAIN_TOPK, (b, 1, 1), device=dev, generator=g)
        sets.append(dict(
            q=(torch.randn(b, 1, h, 512, device=dev, generator=g) * 0.5).bfloat16(),
            k_cache=main,
            indices=(start + torch.arange(shapes.MAIN_TOPK, device=dev)).int(),   # a request's window: contiguous
            topk_length=torch.full((b,), shapes.MAIN_TOPK, dtype=torch.int32, device=dev),
            extra_k_cache=ext,
            extra_indices=torch.randint(0, extra_tokens, (b, 1, extra), device=dev, generator=g, dtype=torch.int32),
            extra_topk_length=torch.full((b,), extra, dtype=torch.int32, device=dev),
            attn_sink=sink))
    return sets


def sparse_decode_reference(a: dict, rows: List[int]) -> torch.Tensor:
    r = torch.tensor(rows, device=a["q"].device)
    main, idx = compact_pages(a["k_cache"], a["indices"][r])
    ext, eidx = compact_pages(a["extra_k_cache"], a["extra_indices"][r])
    out, _ = ref_sd.sparse_decode_ref(a["q"][r].cpu(), main, idx, a["topk_length"][r].cpu(), ext, eidx,
                                      a["extra_topk_length"][r].cpu(), a["attn_sink"].cpu())
    return out


def indexer_sets(case: shapes.Case, pools: Pools) -> List[dict]:
    b, ctx = case.n, case.get("ctx")
    dev, g = pools.device, pools.gen
    pages = -(-ctx // ref_idx.BLOCK_KV)
    per_block = ref_idx.BLOCK_KV * (ref_idx.HEAD_DIM + 4)

    def pool():
        blocks = max(math.ceil(6 * pools.l2 / per_block), 256)   # page tables draw from it with replacement
        seed = ref_idx.pack_paged_k_cache(torch.randn(256, ref_idx.BLOCK_KV, ref_idx.HEAD_DIM, device=dev,
                                                      generator=g))
        return _tile_pages(seed.view(256, per_block), blocks).view(blocks, ref_idx.BLOCK_KV, 1, ref_idx.HEAD_DIM + 4)
    cache = pools.get("idx.pool", pool)
    n = rotation_count(shapes.case_bytes(case)["bytes"], pools.l2, hi=MAX_SETS)
    sets = []
    for _ in range(n):
        sets.append(dict(
            q=torch.randn(b, 1, shapes.INDEXER_HEADS, shapes.INDEXER_DIM, device=dev, generator=g).to(ref_idx.FP8),
            kv_cache=cache,
            weights=torch.randn(b, shapes.INDEXER_HEADS, device=dev, generator=g) * 0.1,
            seq_lens=torch.full((b,), ctx, dtype=torch.int32, device=dev),
            page_table=torch.randint(0, cache.shape[0], (b, pages), device=dev, generator=g, dtype=torch.int32),
            max_seq_len=ctx))
    return sets


def indexer_reference(a: dict, rows: List[int]) -> torch.Tensor:
    r = torch.tensor(rows, device=a["q"].device)
    table = a["page_table"][r].long()
    used, inv = torch.unique(table, return_inverse=True)
    small = a["kv_cache"][used].cpu()
    return ref_idx.paged_mqa_logits_ref(a["q"][r].cpu(), small, a["weights"][r].cpu(), a["seq_lens"][r].cpu(),
                                        inv.int().cpu(), a["max_seq_len"])


def hc_prenorm_sets(case: shapes.Case, pools: Pools) -> List[dict]:
    m, s = case.n, case.get("splits")
    dev, g = pools.device, pools.gen
    n = rotation_count(shapes.case_bytes(case)["bytes"], pools.l2, hi=48)
    shape = (m,) if s is None else (s, m)
    return [dict(x=torch.randn(m, shapes.HC_K, device=dev, generator=g).bfloat16(),
                 fn=torch.randn(shapes.HC_N, shapes.HC_K, device=dev, generator=g) * 0.05, num_splits=s,
                 out=torch.empty(*shape, shapes.HC_N, device=dev), sqrsum=torch.empty(*shape, device=dev))
            for _ in range(n)]


def hc_prenorm_reference(a: dict, rows: List[int]) -> Tuple[torch.Tensor, torch.Tensor]:
    out, sq = ref_hc.hc_prenorm_gemm_ref(a["x"][rows].cpu(), a["fn"].cpu(), None)
    return out, sq


def fp4_moe_sets(case: shapes.Case, pools: Pools) -> List[dict]:
    M, inter = case.n, case.get("inter")
    dev, g = pools.device, pools.gen
    E, H = shapes.MOE_EXPERTS, shapes.MOE_HIDDEN

    def weights():
        pools.drop("moe.")
        return dict(
            w13=torch.randint(0, 256, (E, 2 * inter, H // 2), device=dev, generator=g, dtype=torch.uint8),
            w13_scale=torch.randint(118, 125, (E, 2 * inter, H // 32), device=dev, generator=g, dtype=torch.uint8),
            w2=torch.randint(0, 256, (E, H, inter // 2), device=dev, generator=g, dtype=torch.uint8),
            w2_scale=torch.randint(118, 125, (E, H, inter // 32), device=dev, generator=g, dtype=torch.uint8))
    w = pools.get(f"moe.{inter}", weights)
    n = rotation_count(shapes.case_bytes(case)["bytes"], pools.l2, hi=16)
    sets = []
    for _ in range(n):
        ids = torch.rand(M, E, device=dev, generator=g).topk(shapes.MOE_TOPK, dim=1).indices.int()
        sets.append(dict(w, x=torch.randn(M, H, device=dev, generator=g).bfloat16(), topk_ids=ids,
                         topk_weights=torch.rand(M, shapes.MOE_TOPK, device=dev, generator=g) * 0.9 + 0.1,
                         swiglu_limit=shapes.MOE_SWIGLU_LIMIT))
    return sets


def fp4_moe_reference(a: dict, rows: List[int]) -> torch.Tensor:
    return ref_moe.fp4_moe_reference(a["x"][rows], a["w13"], a["w13_scale"], a["w2"], a["w2_scale"],
                                     a["topk_weights"][rows], a["topk_ids"][rows],
                                     swiglu_limit=a["swiglu_limit"]).cpu()


def fp8_linear_sets(case: shapes.Case, pools: Pools) -> List[dict]:
    """Each set its own weight (the weight is what a decode-size call reads: cold in L2 for every call): e4m3 of
    unit-variance values, power-of-two fp32 block scales 2^-8 .. 2^-5 (what SGLang keeps in weight_scale_inv for the
    Triton / CUTLASS runners; exact in DeepGEMM's UE8M0 requant), x bf16."""
    M, N, K = case.n, case.get("N"), case.get("K")
    dev, g = pools.device, pools.gen
    n = rotation_count(shapes.case_bytes(case)["bytes"], pools.l2, hi=16)
    sets = []
    for _ in range(n):
        w = torch.randn(N, K, device=dev, generator=g).clamp(-8, 8).to(torch.float8_e4m3fn)
        e = torch.randint(-8, -4, (-(-N // 128), -(-K // 128)), device=dev, generator=g)
        sets.append(dict(x=torch.randn(M, K, device=dev, generator=g).bfloat16(), weight=w,
                         weight_scale=torch.exp2(e.float()).contiguous()))
    return sets


def fp8_linear_reference(a: dict, rows: List[int]) -> torch.Tensor:
    return ref_fp8.fp8_linear_reference(a["x"][rows], a["weight"], a["weight_scale"]).cpu()


SETS = {"sparse_decode": sparse_decode_sets, "indexer_logits": indexer_sets, "hc_prenorm": hc_prenorm_sets,
        "fp4_moe": fp4_moe_sets, "fp8_linear": fp8_linear_sets}
REFERENCE = {"sparse_decode": sparse_decode_reference, "indexer_logits": indexer_reference,
             "hc_prenorm": hc_prenorm_reference, "fp4_moe": fp4_moe_reference,
             "fp8_linear": fp8_linear_reference}


def rel_error(op: str, result, ref, a: dict, rows: List[int]) -> float:
    """Relative L2 error of ``result`` (the op's output form) on ``rows`` against the float64 reference."""
    if op == "hc_prenorm":
        out, sq = result
        n = a["fn"].shape[0]
        out = out.reshape(-1, out.shape[-2], out.shape[-1]).sum(0)[rows, :n].double().cpu()
        sq = sq.reshape(-1, sq.shape[-1]).sum(0)[rows].double().cpu()
        if not (torch.isfinite(out).all() and torch.isfinite(sq).all()):
            return float("inf")
        return max(float((out - ref[0]).norm() / ref[0].norm().clamp_min(1e-30)),   # each on its own scale
                   float((sq - ref[1]).norm() / ref[1].norm().clamp_min(1e-30)))
    elif op == "indexer_logits":
        L = a["max_seq_len"]
        lens = a["seq_lens"][rows].cpu().long()
        mask = torch.arange(L)[None, :] < lens[:, None]
        got, want = result[rows, :L].double().cpu()[mask], ref[mask]
    else:
        got, want = result[rows].double().cpu().reshape(-1), ref.reshape(-1)
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - want).norm() / want.norm().clamp_min(1e-30))
