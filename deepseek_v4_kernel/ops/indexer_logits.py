"""Lightning-indexer MQA logits (DeepGEMM ``fp8_paged_mqa_logits`` / ``fp8_mqa_logits``) in Triton.

logits[row, t] = k_scale[t] * sum_h weights[row, h] * relu(q[row, h] . k[t])

* paged (decode / MTP verify): q fp8 [b, next_n, H, 128]; kv cache bytes [num_blocks, 64, 1, 132]
  (per 64-token block: 64x128 fp8 values, then 64 fp32 scales); context_lens int32 [b]
  (row (i, j) sees ``len[i] - next_n + 1 + j`` tokens, DeepGEMM's 1-D convention) or [b, next_n]
  (row (i, j) sees ``len[i, j]`` tokens); block_table int32 [b, max_blocks]; next_n 1..8 (from 5, or where
  next_n * heads rounded up exceeds 256, as rows of next_n = 1).
  Out fp32 [b * next_n, max_context_len].
  Indices, for any value: lengths are clipped to [0, max_context_len]; a token whose block-table column is past the
  table (a length beyond 64 * max_blocks) or whose page id is < 0 or >= num_blocks is skipped: logit -inf, nothing
  read. Checked in the kernel (no host sync).
* flat (prefill): q fp8 [rows, H, 128]; kv = (fp8 [n, 128], fp32 [n]); per-row window [ks, ke), clipped to
  [0, n).
  Out fp32 [rows, n] (absolute columns) or, with ``max_seqlen_k > 0``, [rows, max_seqlen_k] with
  column c = position ks[row] + c (DeepGEMM's "compressed logits").

One program = one batch entry (all next_n rows) or one block of rows, times one chunk of context;
the fp8 dot runs on tensor cores (fp32 accumulate), relu / head weights / head reduction / scale
happen in registers. No [rows, H, T] intermediate. Grids depend only on shapes (CUDA-graph safe).
Past a row's length: -inf when ``clean_logits`` (inside computed tiles -inf is written anyway);
with ``clean_logits=False`` columns past the length that no computed tile covers are left as
``torch.empty`` garbage, like DeepGEMM.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import triton
import triton.language as tl

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops._device import check_kernel_device, on_input_device, sm_count, triton_interpret
from deepseek_v4_kernel.ops._stats import count

_HEAD_DIM = 128
_BLOCK_KV = 64
_BLOCK_BYTES = _BLOCK_KV * (_HEAD_DIM + 4)  # 8448
_FP8 = torch.float8_e4m3fn
SMEM_LIMIT = 101376  # bytes of shared memory per block on SM120 (sm_120a)

__all__ = [
    "paged_mqa_logits",
    "mqa_logits",
    "fp8_paged_mqa_logits",
    "fp8_mqa_logits",
    "get_paged_mqa_logits_metadata",
]


def _bad(op: str, msg: str):
    raise UnsupportedCase(f"{op}: {msg}")


def _sm_count(device: torch.device) -> int:
    return sm_count(device) if device.type == "cuda" else 4


@triton.jit
def _paged_tile(t0, t_loc, hi, c1, q, w, lens, n_ok, out_rows, kv8_ptr, kv32_ptr, bt_row, d, max_blocks, num_blocks,
                NP: tl.constexpr, H: tl.constexpr, BLOCK_T: tl.constexpr):
    t = t0 + t_loc
    col = t // 64
    # a token counts only where its block-table entry exists (col < max_blocks) and names a page of the cache
    # (0 <= page < num_blocks); any other is skipped (-inf), never read
    t_ok = (t < hi) & (col < max_blocks)
    page = tl.load(bt_row + col, mask=t_ok, other=-1)
    t_ok = t_ok & (page >= 0) & (page < num_blocks)
    page = tl.where(t_ok, page, 0).to(tl.int64)
    base = page * 8448 + (t % 64) * 128
    k = tl.load(kv8_ptr + base[:, None] + d[None, :], mask=t_ok[:, None], other=0.0)
    sc = tl.load(kv32_ptr + page * 2112 + 2048 + (t % 64), mask=t_ok, other=0.0)
    s = tl.dot(k, tl.trans(q))  # [BLOCK_T, NP*H] fp32, tensor cores
    s = tl.maximum(s, 0.0) * w[None, :]
    s = tl.sum(tl.reshape(s, [BLOCK_T, NP, H]), axis=2)  # [BLOCK_T, NP]
    s = s * sc[:, None]
    s = tl.where((t[:, None] < lens[None, :]) & t_ok[:, None], s, float("-inf"))
    tl.store(out_rows[None, :] + t[:, None], s, mask=(t[:, None] < c1) & n_ok[None, :])

@triton.jit
def _flat_tile(t0, t_loc, lo, hi, c1, q, w, ks, ke, ri_ok, out_rows, k_ptr, ks_ptr,
               stride_kn, stride_sn, width, d,
               BR: tl.constexpr, H: tl.constexpr, BLOCK_T: tl.constexpr, RELATIVE: tl.constexpr):
    t = t0 + t_loc
    t_ok = (t < hi) & (t >= lo)
    t64 = t.to(tl.int64)
    k = tl.load(k_ptr + t64[:, None] * stride_kn + d[None, :], mask=t_ok[:, None], other=0.0)
    sc = tl.load(ks_ptr + t64 * stride_sn, mask=t_ok, other=0.0)
    s = tl.dot(k, tl.trans(q))  # [BLOCK_T, BR*H]
    s = tl.maximum(s, 0.0) * w[None, :]
    s = tl.sum(tl.reshape(s, [BLOCK_T, BR, H]), axis=2)  # [BLOCK_T, BR]
    s = s * sc[:, None]
    valid = (t[:, None] >= ks[None, :]) & (t[:, None] < ke[None, :])
    if RELATIVE:
        col = t[:, None] - ks[None, :]
        tl.store(out_rows[None, :] + col, s, mask=valid & (col < width))
    else:
        s = tl.where(valid, s, float("-inf"))
        tl.store(out_rows[None, :] + t[:, None], s, mask=(t[:, None] < c1) & ri_ok[None, :])

@triton.jit
def _paged_kernel(
    q_ptr, kv8_ptr, kv32_ptr, w_ptr, len_ptr, bt_ptr, out_ptr,
    stride_qb, stride_qn, stride_qh,
    stride_wr, stride_lb, stride_ln, stride_btb, stride_or,
    max_context_len, chunk, max_blocks, num_blocks,
    NEXT_N: tl.constexpr, NP: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
    BLOCK_T: tl.constexpr, LENS_2D: tl.constexpr, CLEAN: tl.constexpr,
    NUM_STAGES: tl.constexpr, INTERPRET: tl.constexpr, BT_GROUP: tl.constexpr,
):
    b = tl.program_id(0)
    c0 = tl.program_id(1) * chunk
    c1 = tl.minimum(c0 + chunk, max_context_len)
    b64 = b.to(tl.int64)

    n_idx = tl.arange(0, NP)
    n_ok = n_idx < NEXT_N
    if LENS_2D:
        lens = tl.load(len_ptr + b64 * stride_lb + n_idx * stride_ln, mask=n_ok, other=0)
    else:
        lb = tl.load(len_ptr + b64 * stride_lb)
        lens = lb - NEXT_N + 1 + n_idx
    lens = tl.where(n_ok, tl.maximum(lens, 0), 0)
    lmax = tl.max(lens, axis=0)

    # q tile [NP*H, D] (rows ordered (n, h)) and weights [NP*H]
    r = tl.arange(0, NP * H)
    rn = r // H
    rh = r % H
    d = tl.arange(0, D)
    q_rows = q_ptr + b64 * stride_qb + rn * stride_qn + rh * stride_qh
    r_ok = rn < NEXT_N
    q = tl.load(q_rows[:, None] + d[None, :], mask=r_ok[:, None], other=0.0)
    w = tl.load(w_ptr + (b64 * NEXT_N + rn) * stride_wr + rh, mask=r_ok, other=0.0).to(tl.float32)

    out_rows = out_ptr + (b64 * NEXT_N + n_idx.to(tl.int64)) * stride_or
    t_loc = tl.arange(0, BLOCK_T)
    hi = tl.minimum(c1, lmax)
    if INTERPRET:  # the interpreter cannot take tensor loop bounds in range(); same body
        t0 = c0 + b * 0
        while t0 < hi:
            _paged_tile(t0, t_loc, hi, c1, q, w, lens, n_ok, out_rows, kv8_ptr, kv32_ptr,
                        bt_ptr + (b64 // BT_GROUP) * stride_btb, d, max_blocks, num_blocks, NP, H, BLOCK_T)
            t0 += BLOCK_T
    else:
        for t0 in tl.range(c0, hi, BLOCK_T, num_stages=NUM_STAGES):
            _paged_tile(t0, t_loc, hi, c1, q, w, lens, n_ok, out_rows, kv8_ptr, kv32_ptr,
                        bt_ptr + (b64 // BT_GROUP) * stride_btb, d, max_blocks, num_blocks, NP, H, BLOCK_T)
    if CLEAN:
        start = tl.maximum(c0, hi)
        t0 = c0 + ((start - c0) // BLOCK_T) * BLOCK_T
        ninf = tl.full([BLOCK_T, NP], float("-inf"), tl.float32)
        while t0 < c1:
            t = t0 + t_loc
            m = (t[:, None] < c1) & (t[:, None] >= hi) & n_ok[None, :]
            tl.store(out_rows[None, :] + t[:, None], ninf, mask=m)
            t0 += BLOCK_T

@triton.jit
def _flat_kernel(
    q_ptr, k_ptr, ks_ptr, w_ptr, kst_ptr, ke_ptr, out_ptr,
    rows, n_kv, width, chunk,
    stride_qr, stride_qh, stride_kn, stride_sn, stride_wr, stride_or,
    BR: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
    RELATIVE: tl.constexpr, CLEAN: tl.constexpr, NUM_STAGES: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    rb = tl.program_id(0)
    c0 = tl.program_id(1) * chunk
    c1 = tl.minimum(c0 + chunk, n_kv)

    ri = rb * BR + tl.arange(0, BR)
    ri_ok = ri < rows
    ri64 = ri.to(tl.int64)
    ks = tl.load(kst_ptr + ri, mask=ri_ok, other=0)
    ke = tl.load(ke_ptr + ri, mask=ri_ok, other=0)
    ks = tl.maximum(ks, 0)
    ke = tl.minimum(ke, n_kv)
    ke = tl.where(ri_ok, ke, 0)
    ks = tl.where(ri_ok, ks, n_kv)
    lo = tl.maximum(tl.min(ks, axis=0), c0)
    hi = tl.minimum(tl.max(ke, axis=0), c1)

    r = tl.arange(0, BR * H)
    rr = rb * BR + r // H
    rh = r % H
    r_ok = rr < rows
    rr64 = rr.to(tl.int64)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + rr64[:, None] * stride_qr + rh[:, None] * stride_qh + d[None, :],
                mask=r_ok[:, None], other=0.0)
    w = tl.load(w_ptr + rr64 * stride_wr + rh, mask=r_ok, other=0.0).to(tl.float32)

    out_rows = out_ptr + ri64 * stride_or
    t_loc = tl.arange(0, BLOCK_T)
    lo_al = c0 + ((lo - c0) // BLOCK_T) * BLOCK_T
    if INTERPRET:  # the interpreter cannot take tensor loop bounds in range(); same body
        t0 = lo_al
        while t0 < hi:
            _flat_tile(t0, t_loc, lo, hi, c1, q, w, ks, ke, ri_ok, out_rows, k_ptr, ks_ptr,
                       stride_kn, stride_sn, width, d, BR, H, BLOCK_T, RELATIVE)
            t0 += BLOCK_T
    else:
        for t0 in tl.range(lo_al, hi, BLOCK_T, num_stages=NUM_STAGES):
            _flat_tile(t0, t_loc, lo, hi, c1, q, w, ks, ke, ri_ok, out_rows, k_ptr, ks_ptr,
                       stride_kn, stride_sn, width, d, BR, H, BLOCK_T, RELATIVE)
    if CLEAN:
        # absolute layout only: -inf on [c0, c1) outside the tiles computed above
        ninf = tl.full([BLOCK_T, BR], float("-inf"), tl.float32)
        hi_al = lo_al + tl.cdiv(tl.maximum(hi - lo_al, 0), BLOCK_T) * BLOCK_T
        t0 = c0 + rb * 0
        while t0 < c1:
            # a tile the loop above did not compute; a branch, not a scalar term in the mask: Triton 3.9's
            # interpreter broadcasts a scalar comparison as int32 and then refuses the mask (compiled code is fine)
            if (t0 < lo_al) | (t0 >= hi_al):
                t = t0 + t_loc
                tl.store(out_rows[None, :] + t[:, None], ninf, mask=(t[:, None] < c1) & ri_ok[None, :])
            t0 += BLOCK_T



def _kernels():
    return _paged_kernel, _flat_kernel


# Tuning overrides (bench sweeps only): keys block_t, num_warps, num_stages, tiles.
_TUNE_PAGED: dict = {}
_TUNE_FLAT: dict = {}


def _interpret() -> bool:
    return triton_interpret()


def _next_pow2(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


def _check_q_fp8(op, name, q, ndim):
    if not isinstance(q, torch.Tensor):
        _bad(op, f"{name} must be a float8_e4m3fn tensor, got {type(q).__name__}")
    if q.dtype != _FP8 or q.dim() != ndim or q.shape[-1] != _HEAD_DIM:
        _bad(op, f"{name} must be float8_e4m3fn with {ndim} dims and last dim {_HEAD_DIM}, "
                 f"got {q.dtype} {list(q.shape)}")
    H = q.shape[-2]
    if H not in (16, 32, 64, 128):
        _bad(op, f"{name}: number of heads must be 16, 32, 64 or 128, got {H}")


def _check_device(op: str, dev: torch.device, **tensors):
    """Every tensor on q's device (else Triton would fail with a pointer error naming no argument)."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device != dev:
            _bad(op, f"{name} must be on {dev} (the device of q), got {t.device}")


# Launch configurations (also what tests/test_indexer_logits.py compiles for sm_120a on the CPU: the
# tiles must fit SM120's 101376 B of shared memory, which the H100 (227 KB) would not reveal).
def paged_config(next_n: int, heads: int) -> Tuple[int, int, int, int]:
    """(NP, BLOCK_T, num_warps, num_stages) of the paged kernel; NP = next_n rounded up to a power of 2."""
    NP = _next_pow2(next_n)
    block_t = _TUNE_PAGED.get("block_t", 128 if NP * heads <= 128 else 64)
    num_warps = _TUNE_PAGED.get("num_warps", 4 if NP * heads * block_t <= 8192 else 8)
    # 2 stages: H200, mma.sync builds (SM120's class), H 64, b 2 / 8 / 8 / 32 at 16K / 4K / 16K / 16K compressed
    # context: 5.5 / 5.7 / 12.2 / 41.0 us against 5.8 / 6.0 / 12.3 / 41.9 with 3
    return NP, block_t, num_warps, _TUNE_PAGED.get("num_stages", 2)


def flat_config(heads: int) -> Tuple[int, int, int, int]:
    """(BR rows per program, BLOCK_T, num_warps, num_stages) of the flat kernel."""
    BR = max(1, _TUNE_FLAT.get("rows_h", 128) // heads)
    return BR, _TUNE_FLAT.get("block_t", 128), _TUNE_FLAT.get("num_warps", 8), _TUNE_FLAT.get("num_stages", 3)


def _chunk(total_tiles: int, programs_other: int, block_t: int, device) -> int:
    """Context tiles per program: 4 (q and the weights loaded once per 4 K tiles), halved while that leaves fewer
    programs than SMs, doubled while it makes more than 8 per SM. H200, mma.sync builds (SM120's class), H 64, 2 stages,
    tiles per program 1 / 2 / 4 / 8 / 16: b 8 at 16K compressed context 13.7 / 12.5 / 12.2 / - / - us, b 32 at 16K
    47.4 / 43.0 / 41.2 / 46.5 / -, b 8 at 64K - / 43.1 / 41.2 / 47.4 / -, b 32 at 64K: 16 tiles 140.3, 8 tiles 139.9;
    b 1 / 2 at 16K and b 8 at 4K: one tile (4.3 / 5.5 / 5.7). The same rule natively (wgmma) was within 3 % of the
    best tile count but at b 8, 16K (8.3 against 7.2 us with 2 tiles), as the rule before it (4 x SMs programs)."""
    sms = _sm_count(device)
    tiles = 4
    while tiles > 1 and programs_other * -(-total_tiles // tiles) < sms:
        tiles //= 2
    while tiles < 64 and programs_other * -(-total_tiles // tiles) > 8 * sms:
        tiles *= 2
    return tiles * block_t


def _int_arg(op: str, name: str, v, lo: int) -> int:
    """An integer argument (a Python int, a numpy / torch integer scalar) >= lo, else UnsupportedCase naming it."""
    try:
        iv = int(v)
        ok = not isinstance(v, (bool, float, str)) and iv == v
    except (TypeError, ValueError, RuntimeError):
        ok = False
    if not ok or iv < lo:
        _bad(op, f"{name} must be an integer >= {lo}, got {v!r}")
    return iv


def _check_tensor(op: str, name: str, t, what: str):
    if not isinstance(t, torch.Tensor):
        _bad(op, f"{name} must be {what}, got {type(t).__name__}")


# next_n the kernel takes in one program (its NP * heads q rows); a larger one (DSpark verify: up to 8 draft tokens)
# runs as next_n = 1 rows, each with its own length
MAX_NEXT_N_TILE = 4
MAX_NEXT_N = 8


@on_input_device
def paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    clean_logits: bool = True,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Paged fp8 MQA logits; see module docstring. Returns fp32 [b * next_n, max_context_len].

    Any index is safe: a row's length is clipped to [0, max_context_len]; a token whose block-table column is past
    the table (length > 64 * max_blocks) or whose page id is < 0 or >= num_blocks is skipped (logit -inf, nothing
    read for it). No host sync: these tests run in the kernel."""
    op = "paged_mqa_logits"
    _check_q_fp8(op, "q", q, 4)
    B, N, H, D = q.shape
    if not 1 <= N <= MAX_NEXT_N:
        _bad(op, f"q next_n must be 1..{MAX_NEXT_N}, got {N} (q {list(q.shape)})")
    _check_tensor(op, "kv_cache", kv_cache, "a 1-byte [num_blocks, 64, 1, 132] tensor")
    _check_tensor(op, "weights", weights, f"a float32 or bf16 [{B * N}, {H}] tensor")
    _check_tensor(op, "context_lens", context_lens, f"an int32 [{B}] or [{B}, {N}] tensor")
    _check_tensor(op, "block_table", block_table, f"an int32 [{B}, max_blocks] tensor")
    if kv_cache.element_size() != 1 or kv_cache.dim() != 4 or tuple(kv_cache.shape[1:]) != (_BLOCK_KV, 1, _HEAD_DIM + 4):
        _bad(op, f"kv_cache must be 1-byte [num_blocks, 64, 1, 132], got {kv_cache.dtype} {list(kv_cache.shape)}")
    if not kv_cache.is_contiguous():
        _bad(op, f"kv_cache must be contiguous, got strides {tuple(kv_cache.stride())}")
    dev = q.device
    check_kernel_device(op, q=q)
    _check_device(op, dev, kv_cache=kv_cache, weights=weights, context_lens=context_lens, block_table=block_table,
                  out=out)
    if weights.dim() == 3 and weights.shape[-1] == 1:
        weights = weights.squeeze(-1)
    if weights.dtype not in (torch.float32, torch.bfloat16) or tuple(weights.shape) != (B * N, H):
        _bad(op, f"weights must be float32 or bf16 [{B * N}, {H}], got {weights.dtype} {list(weights.shape)}")
    if weights.stride(-1) != 1:
        weights = weights.contiguous()
    if context_lens.dtype not in (torch.int32, torch.int64):
        _bad(op, f"context_lens must be int32 or int64, got {context_lens.dtype}")
    if context_lens.dim() == 1 and context_lens.shape[0] == B:
        lens_2d = False
    elif context_lens.dim() == 2 and context_lens.shape[0] == B and context_lens.shape[1] == N:
        lens_2d = N > 1
    else:
        _bad(op, f"context_lens must be int32 [{B}] or [{B}, {N}], got {context_lens.dtype} {list(context_lens.shape)}")
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype not in (torch.int32, torch.int64):
        _bad(op, f"block_table must be int32 or int64 [{B}, max_blocks], got {block_table.dtype} {list(block_table.shape)}")
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    max_context_len = _int_arg(op, "max_context_len", max_context_len, 0)
    if q.stride(-1) != 1:
        q = q.contiguous()
    rows = B * N
    if out is None:
        out = torch.empty((rows, max_context_len), dtype=torch.float32, device=dev)
    elif not isinstance(out, torch.Tensor):
        _bad(op, f"out must be None or a float32 [{rows}, {max_context_len}] tensor, got {type(out).__name__}")
    elif out.dtype != torch.float32 or tuple(out.shape) != (rows, max_context_len) or out.stride(1) != 1:
        _bad(op, f"out must be float32 [{rows}, {max_context_len}] with unit column stride, got {out.dtype} "
                 f"{list(out.shape)} strides {tuple(out.stride())}")
    if rows == 0 or max_context_len == 0:
        return out

    bt_group = 1
    if N > MAX_NEXT_N_TILE or _next_pow2(N) * H > 256:
        # one program per (batch entry, draft token): rows of next_n = 1 with their own lengths (computed on the
        # device: no sync) and the batch entry's block-table row (BT_GROUP = next_n rows share it)
        if lens_2d or context_lens.dim() == 2:
            lens_rows = context_lens.reshape(rows)
        else:
            lens_rows = (context_lens.view(B, 1) - (N - 1) + torch.arange(N, device=dev, dtype=context_lens.dtype)
                         ).view(rows)
        context_lens, lens_2d, bt_group = lens_rows, False, N
        q = q.reshape(rows, 1, H, D)
        B, N = rows, 1
    if context_lens.dtype != torch.int32:
        context_lens = context_lens.to(torch.int32)
    stride_lb = context_lens.stride(0)
    stride_ln = context_lens.stride(1) if context_lens.dim() == 2 else 0

    kv8 = kv_cache.view(torch.uint8).view(_FP8)
    kv32 = kv_cache.view(torch.uint8).view(-1).view(torch.float32)
    NP, block_t, num_warps, num_stages = paged_config(N, H)
    if "tiles" in _TUNE_PAGED:
        chunk = _TUNE_PAGED["tiles"] * block_t
    else:
        chunk = _chunk(-(-max_context_len // block_t), B, block_t, dev)
    grid = (B, -(-max_context_len // chunk))
    paged, _ = _kernels()
    count("indexer_logits", "triton_paged")
    paged[grid](
        q, kv8, kv32, weights, context_lens, block_table, out,
        q.stride(0), q.stride(1), q.stride(2),
        weights.stride(0), stride_lb, stride_ln, block_table.stride(0), out.stride(0),
        max_context_len, chunk, block_table.shape[1], kv_cache.shape[0],
        NEXT_N=N, NP=NP, H=H, D=D, BLOCK_T=block_t, LENS_2D=lens_2d, CLEAN=bool(clean_logits),
        NUM_STAGES=num_stages, INTERPRET=_interpret(), BT_GROUP=bt_group, num_warps=num_warps,
    )
    return out


@on_input_device
def mqa_logits(
    q: torch.Tensor,
    kv: Tuple[torch.Tensor, torch.Tensor],
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    clean_logits: bool = True,
    max_seqlen_k: int = 0,
) -> torch.Tensor:
    """Flat fp8 MQA logits; see module docstring. Any window is safe: [ks, ke) is clipped to [0, n) (an empty or
    reversed window gives a row of -inf when clean)."""
    op = "mqa_logits"
    _check_q_fp8(op, "q", q, 3)
    M, H, D = q.shape
    if not (isinstance(kv, (tuple, list)) and len(kv) == 2):
        _bad(op, f"kv must be a tuple (fp8 [n, 128], fp32 [n]), got {type(kv).__name__}")
    k, k_scale = kv
    _check_tensor(op, "kv[0]", k, "a float8_e4m3fn [n, 128] tensor")
    _check_tensor(op, "kv[1]", k_scale, "a float32 [n] tensor")
    _check_tensor(op, "weights", weights, f"a float32 [{M}, {H}] tensor")
    _check_tensor(op, "cu_seq_len_k_start", ks, f"an int32 [{M}] tensor")
    _check_tensor(op, "cu_seq_len_k_end", ke, f"an int32 [{M}] tensor")
    check_kernel_device(op, q=q)
    if k.dtype != _FP8 or k.dim() != 2 or k.shape[1] != _HEAD_DIM or k.stride(1) != 1:
        _bad(op, f"kv[0] must be float8_e4m3fn [n, 128] (unit last stride), got {k.dtype} {list(k.shape)}")
    n = k.shape[0]
    _check_device(op, q.device, **{"kv[0]": k, "kv[1]": k_scale, "weights": weights, "cu_seq_len_k_start": ks,
                                   "cu_seq_len_k_end": ke})
    if k_scale.dim() == 2 and k_scale.shape[1] == 1:
        k_scale = k_scale.squeeze(1)
    if k_scale.dtype != torch.float32 or tuple(k_scale.shape) != (n,):
        _bad(op, f"kv[1] must be fp32 [{n}], got {k_scale.dtype} {list(k_scale.shape)}")
    if weights.dtype not in (torch.float32, torch.bfloat16) or tuple(weights.shape) != (M, H):
        _bad(op, f"weights must be fp32 [{M}, {H}], got {weights.dtype} {list(weights.shape)}")
    if weights.stride(-1) != 1:
        weights = weights.contiguous()
    for name, x in (("cu_seq_len_k_start", ks), ("cu_seq_len_k_end", ke)):
        if x.dim() != 1 or x.shape[0] != M or x.dtype not in (torch.int32, torch.int64):
            _bad(op, f"{name} must be int32 [{M}], got {x.dtype} {list(x.shape)}")
    ks = ks.to(torch.int32).contiguous()
    ke = ke.to(torch.int32).contiguous()
    max_seqlen_k = _int_arg(op, "max_seqlen_k", max_seqlen_k, 0)
    relative = max_seqlen_k > 0
    if relative and clean_logits:
        _bad(op, "clean_logits=True with max_seqlen_k > 0 is not supported (DeepGEMM asserts the same)")
    if q.stride(-1) != 1:
        q = q.contiguous()
    width = max_seqlen_k if relative else n
    out = torch.empty((M, width), dtype=torch.float32, device=q.device)
    if M == 0 or n == 0 or width == 0:
        if clean_logits:
            out.fill_(float("-inf"))
        return out
    BR, block_t, num_warps, num_stages = flat_config(H)
    n_rb = -(-M // BR)
    if "tiles" in _TUNE_FLAT:
        chunk = _TUNE_FLAT["tiles"] * block_t
    else:
        chunk = _chunk(-(-n // block_t), n_rb, block_t, q.device)
    grid = (n_rb, -(-n // chunk))
    _, flat = _kernels()
    count("indexer_logits", "triton_flat")
    flat[grid](
        q, k, k_scale, weights, ks, ke, out,
        M, n, width, chunk,
        q.stride(0), q.stride(1), k.stride(0), k_scale.stride(0), weights.stride(0), out.stride(0),
        BR=BR, H=H, D=D, BLOCK_T=block_t, RELATIVE=relative, CLEAN=bool(clean_logits) and not relative,
        NUM_STAGES=num_stages, INTERPRET=_interpret(), num_warps=num_warps,
    )
    return out


# ----------------------------------------------------------------------------------------------
# DeepGEMM-signature shims (names and keyword names as deep_gemm's pybind registration).
# ----------------------------------------------------------------------------------------------
def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                         max_context_len, clean_logits=False, indices=None):
    """``deep_gemm.fp8_paged_mqa_logits``; ``schedule_meta`` is ignored."""
    if indices is not None:
        _bad("fp8_paged_mqa_logits", f"indices must be None (varlen mode is not supported), got {type(indices).__name__}")
    if isinstance(q, (tuple, list)):
        if len(q) == 2 and q[1] is None:
            q = q[0]
        else:
            _bad("fp8_paged_mqa_logits", f"q must be a float8_e4m3fn tensor (fp4 q with scales is not supported), got "
                                         f"a {type(q).__name__} of {len(q)}")
    return paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, max_context_len,
                            clean_logits=bool(clean_logits))


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True,
                   max_seqlen_k=0):
    """``deep_gemm.fp8_mqa_logits``."""
    return mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                      clean_logits=bool(clean_logits), max_seqlen_k=max_seqlen_k)


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    """``deep_gemm.get_paged_mqa_logits_metadata``: our kernel needs no schedule; returns an
    int32 [num_sms + 1, 2] zero tensor (DeepGEMM's shape, so SGLang's ``copy_`` of it works)."""
    op = "get_paged_mqa_logits_metadata"
    _check_tensor(op, "context_lens", context_lens, "an int32 tensor")
    num_sms = _int_arg(op, "num_sms", num_sms, 1)
    return torch.zeros((num_sms + 1, 2), dtype=torch.int32, device=context_lens.device)
