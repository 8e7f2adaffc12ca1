"""MXFP4 routed experts of DeepSeek-V4 as Triton grouped GEMMs (no dequantised copy).

    fp4_moe(hidden_states, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
            swiglu_limit=None, routed_scaling_factor=None, impl=None, out=None,
            config=None) -> [M, hidden]

hidden_states bf16 [M, hidden]; w13 int8/uint8 [E, 2I, hidden/2] (gate rows 0..I-1, up
rows I..2I-1, e2m1 low nibble first); w13_scale [E, 2I, hidden/32]; w2 int8/uint8
[E, hidden, I/2]; w2_scale [E, hidden, I/32]. Scales: uint8 UE8M0 bits,
torch.float8_e8m0fnu, or float32 holding the power of two (what SGLang's Fp8MoEMethod
keeps in ``w13_weight_scale_inv``; only the exponent field is read, so they must be
exact powers of two, as they are when loaded from e8m0). topk_weights float32/bf16/fp16
[M, k]; topk_ids int32/int64 [M, k]; an id < 0 or >= E drops that slot (EP mapping).
out[t] = rsf * sum_k w[t,k] * (silu(g) * u) W2^T with g/u = x W13^T (g clamped to
<= limit and u to [-limit, limit] first when swiglu_limit is given, as DSV4 does).
Output bf16 [M, hidden], every element written. See docs/fp4_moe.md for the evidence.

Pipeline (no host sync, shapes depend only on M, k, E -> CUDA-graph safe):
  routing, S = M*k slots:
    S <= 512: _route_small_kernel (1 program): per-expert counts, BM-padded segment
              starts, the expert of every row block (-1 past the end), slot of every row
    else:     counts memset + _count_kernel (atomic ranks) + _layout_kernel (1 program)
  _gemm1_kernel: gate and up tiles from the packed fp4 weights + scales, fused
                 clamp/SiLU*up, h (bf16) per padded row
  _gemm2_kernel: y = h W2^T * routing weight -> one row per slot
  _reduce_kernel: out[t] = rsf * sum of the valid slots of t (fp32, fixed order)
max_blocks = floor(S / BM) + min(E, S) bounds the row blocks for any routing. Both GEMMs
run a 1-D grid over (row block, N tile), row blocks grouped by GROUP_M so that a group's
activations and its experts' weights stay in L2 (prefill); decode uses GROUP_M=1 and small
N tiles so that one expert's weight stream is split over many SMs.

Inner product (``impl``):
  "dequant"    e2m1 + scale -> bf16 in registers (exact), bf16 tl.dot with the weights as
               the MMA M side ("swap AB": tokens are the small N side, so decode wastes no
               MMA rows); the two nibbles of a byte feed two dots over the even and the odd
               K columns (no interleave shuffle). On CUDA the decode is inline PTX on packed
               bf16x2 (_DEQ_PTX, ~3 instructions per weight; DSV4_FP4_MOE_DEQ_PTX=0 for the
               plain Triton form: fp16 bit pattern -> fp32 * 2^(s-113) -> bf16).
  "dot_scaled" tl.dot_scaled(bf16 activations, e2m1 weights + ue8m0 scales): exact; Triton
               3.6 upcasts e2m1 to bf16 for this pair on every architecture.
  "mxfp8"      activations quantised in-kernel to MXFP8 (e4m3, one power-of-two scale per
               32 K values, scale 2^(ceil(log2 amax) - 8)); the e2m1 weights re-encoded
               as e4m3 bytes in registers (exact; scale + 6), then
               tl.dot_scaled(e4m3, e4m3): Triton 3.6 lowers that pair on sm_120 to the
               native mma.sync kind::mxf8f6f4.block_scale (it emulates mixed e4m3 x e2m1
               and bf16 x e2m1). Approximate (activation rounding, as SGLang's SM120
               FlashInfer MXFP8 x MXFP4 path); emulated on the H100.
  "cuda_decode" not Triton: two compiled kernels of the CUDA extension (csrc/fp4_moe), for
               M * topk <= 256 slots: no routing pass (each block de-duplicates the slot table
               itself and streams its expert's weights once for all slots routed to it), e2m1
               decoded to bf16 in registers + mma.sync (exact, like "dequant"), SiLU fused into
               gemm1, the top-k sum fused into gemm2 (the last block of each column tile adds
               the slots in a fixed order). PDL launches; workspace per call.
The interpreter (TRITON_INTERPRET=1; no dot_scaled there) always runs "dequant" with fp32
dots and fp32 intermediates (its bf16 casts truncate); "cuda_decode" needs a CUDA device.
Default (pick_impl): env DSV4_FP4_MOE_IMPL, else "cuda_decode" up to CUDA_DECODE_DEFAULT_SLOTS
slots where it applies, else DEFAULT_IMPL_CC10 on cc >= 10 and DEFAULT_IMPL_SM90 below (chosen
from the H100 runs, see docs/fp4_moe.md), with "dot_scaled" for the decode regime's "dequant" under
a Triton newer than DEQUANT_DECODE_MAX_TRITON.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops._device import extension_error, on_input_device, sm_count, triton_version

OP = "fp4_moe"
SMEM_LIMIT = 101376
GROUP = 32
IMPLS = ("dequant", "dot_scaled", "mxfp8", "cuda_decode")
_IMPL_CODE = {"dequant": 0, "dot_scaled": 1, "mxfp8": 2}   # the Triton impls
# "cuda_decode": the compiled decode kernels (csrc/fp4_moe): at most DECODE_MAX_SLOTS = M * topk slots
# (DSV4_FP4_MOE_MAX_SLOTS in csrc/fp4_moe/params.h, checked at the C ABI); the default wherever it
# applies (_cuda_decode_unsupported) up to CUDA_DECODE_DEFAULT_SLOTS slots: on the H100 (run 7,
# docs/fp4_moe.md) it beats "dequant" by 1.3-1.4x at 1 token, 1.1x at 8, ties at 32 tokens (192 slots)
# and is 1.4 % slower at 42 tokens.
DECODE_MAX_SLOTS = 256
CUDA_DECODE_DEFAULT_SLOTS = 192
DECODE_GEMM2_TILE = 32   # DSV4_FP4_MOE_GEMM2_TILE: output columns per gemm2 block, one counter each
# default impl per regime ("decode" / "mid" / "prefill", see regime()); sm90 from the H100 runs
DEFAULT_IMPL_SM90 = {"decode": "dequant", "mid": "dot_scaled", "prefill": "dot_scaled"}
# cc >= 10: decode is weight-bandwidth bound, so the exact path costs nothing there; mid and
# prefill use the one variant Triton lowers to SM120's native block-scaled MMA (MXFP8 activations,
# the precision class of SGLang's own SM120 FlashInfer path and of DeepGEMM's FP8 x FP4 GEMMs).
DEFAULT_IMPL_CC10 = {"decode": "dequant", "mid": "mxfp8", "prefill": "mxfp8"}
# The decode regime's "dequant" holds up to this Triton version. H100 run 62 (docs/fp4_moe.md), mma.sync builds
# (DISABLE_MMA_V3=1, SM120's instruction class), DeepSeek-V4's experts: triton 3.8.0 (SGLang 0.5.23's) passes the
# dequantised bf16 weight tiles and the activation halves to the MMA through shared memory (sm_120a build: 196
# registers instead of 119, 20480 B of shared memory instead of 13312), and "dequant" took 1.22-1.73x its triton
# 3.6.0 time at 64-256 tokens (64: 1657 -> 2868 us), 1.39-1.42x "dot_scaled"'s, whose build did not change (64: 2035
# us under both). So under a newer Triton the decode regime runs "dot_scaled" (exact as well). Run 63, triton 3.9.0
# (torch 2.15.0's pin): "dequant" is built as under 3.6.0 again (sm_120a: 128 registers, 13312 B), but "dot_scaled"
# got faster (0.71-0.74x its 3.6.0 time at 64-256 tokens) and stays ahead ("dequant" takes 1.29-1.30x its time), so
# the rule holds for 3.9 too.
DEQUANT_DECODE_MAX_TRITON = (3, 6)
SMALL_ROUTE_MAX_SLOTS = 512

# compiled kernels of the last call (for the shared-memory test)
LAST_KERNELS: dict = {}


def _interp() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# --------------------------------------------------------------------------- routing
# IT_* > 0 only under TRITON_INTERPRET=1: triton 3.6's interpreter cannot run range()
# with runtime bounds, so there the loops get host-computed trip counts.
@triton.jit
def _chunk_onehot(ids_ptr, s0, S, E, EP: tl.constexpr, BS: tl.constexpr):
    s = s0 + tl.arange(0, BS)
    m = s < S
    ids = tl.load(ids_ptr + s, mask=m, other=-1).to(tl.int32)
    valid = m & (ids >= 0) & (ids < E)
    e = tl.arange(0, EP)
    oh = ((ids[:, None] == e[None, :]) & valid[:, None]).to(tl.int32)
    return s, valid, oh


@triton.jit
def _chunk_scatter(ids_ptr, sorted_ptr, start, run, s0, S, E, EP: tl.constexpr, BS: tl.constexpr):
    s, valid, oh = _chunk_onehot(ids_ptr, s0, S, E, EP, BS)
    cs = tl.cumsum(oh, 0) + run[None, :]  # 1-based rank of the slot inside its expert
    pos = tl.sum(oh * (cs - 1 + start[None, :]), 1)
    tl.store(sorted_ptr + pos, s, mask=valid)
    return run + tl.sum(oh, 0)


@triton.jit
def _block_experts(block_expert_ptr, end, emask, total, b0, MAX_BLOCKS, BM: tl.constexpr,
                   BB: tl.constexpr):
    b = b0 + tl.arange(0, BB)
    row = b * BM
    below = (end[None, :] <= row[:, None]) & emask[None, :]
    ex = tl.sum(below.to(tl.int32), axis=1)
    ex = tl.where(row < total, ex, -1)
    tl.store(block_expert_ptr + b, ex, mask=b < MAX_BLOCKS)


@triton.jit
def _route_small_kernel(ids_ptr, counts_ptr, start_ptr, block_expert_ptr, sorted_ptr,
                        S, E, MAX_BLOCKS,
                        BM: tl.constexpr, EP: tl.constexpr, BS: tl.constexpr, BB: tl.constexpr,
                        IT_S: tl.constexpr, IT_B: tl.constexpr):
    """Whole routing layout in one program (decode sizes: no memset, no atomics)."""
    e = tl.arange(0, EP)
    emask = e < E
    cnt = tl.zeros([EP], dtype=tl.int32)
    if IT_S > 0:
        for it in range(0, IT_S):
            _s, _v, oh = _chunk_onehot(ids_ptr, it * BS, S, E, EP, BS)
            cnt += tl.sum(oh, 0)
    else:
        for s0 in range(0, S, BS):
            _s, _v, oh = _chunk_onehot(ids_ptr, s0, S, E, EP, BS)
            cnt += tl.sum(oh, 0)
    padded = (cnt + BM - 1) // BM * BM
    end = tl.cumsum(padded, 0)
    start = end - padded
    total = tl.sum(padded, 0)
    tl.store(counts_ptr + e, cnt, mask=emask)
    tl.store(start_ptr + e, start, mask=emask)
    run = tl.zeros([EP], dtype=tl.int32)
    if IT_S > 0:
        for it in range(0, IT_S):
            run = _chunk_scatter(ids_ptr, sorted_ptr, start, run, it * BS, S, E, EP, BS)
    else:
        for s0 in range(0, S, BS):
            run = _chunk_scatter(ids_ptr, sorted_ptr, start, run, s0, S, E, EP, BS)
    if IT_B > 0:
        for it in range(0, IT_B):
            _block_experts(block_expert_ptr, end, emask, total, it * BB, MAX_BLOCKS, BM, BB)
    else:
        for b0 in range(0, MAX_BLOCKS, BB):
            _block_experts(block_expert_ptr, end, emask, total, b0, MAX_BLOCKS, BM, BB)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, rank_ptr, S, E, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < S
    ids = tl.load(ids_ptr + offs, mask=m, other=-1).to(tl.int32)
    valid = m & (ids >= 0) & (ids < E)
    safe = tl.where(valid, ids, 0)
    r = tl.atomic_add(counts_ptr + safe, tl.full([BLOCK], 1, tl.int32), mask=valid, sem="relaxed")
    tl.store(rank_ptr + offs, tl.where(valid, r, -1), mask=m)


@triton.jit
def _layout_kernel(counts_ptr, ids_ptr, rank_ptr, start_ptr, block_expert_ptr, sorted_ptr,
                   S, E, MAX_BLOCKS,
                   BM: tl.constexpr, EP: tl.constexpr, BB: tl.constexpr, BS: tl.constexpr,
                   IT_B: tl.constexpr, IT_S: tl.constexpr):
    e = tl.arange(0, EP)
    emask = e < E
    c = tl.load(counts_ptr + e, mask=emask, other=0)
    padded = (c + BM - 1) // BM * BM
    end = tl.cumsum(padded, 0)
    start = end - padded
    total = tl.sum(padded, 0)
    tl.store(start_ptr + e, start, mask=emask)
    if IT_B > 0:
        for it in range(0, IT_B):
            _block_experts(block_expert_ptr, end, emask, total, it * BB, MAX_BLOCKS, BM, BB)
    else:
        for b0 in range(0, MAX_BLOCKS, BB):
            _block_experts(block_expert_ptr, end, emask, total, b0, MAX_BLOCKS, BM, BB)
    tl.debug_barrier()  # start_ptr written above is read back below by other threads
    if IT_S > 0:
        for it in range(0, IT_S):
            _scatter(ids_ptr, rank_ptr, start_ptr, sorted_ptr, it * BS, S, BS)
    else:
        for s0 in range(0, S, BS):
            _scatter(ids_ptr, rank_ptr, start_ptr, sorted_ptr, s0, S, BS)


@triton.jit
def _scatter(ids_ptr, rank_ptr, start_ptr, sorted_ptr, s0, S, BS: tl.constexpr):
    s = s0 + tl.arange(0, BS)
    m = s < S
    rk = tl.load(rank_ptr + s, mask=m, other=-1)
    valid = m & (rk >= 0)
    ids = tl.load(ids_ptr + s, mask=valid, other=0).to(tl.int32)
    st = tl.load(start_ptr + ids, mask=valid, other=0)
    tl.store(sorted_ptr + st + rk, s, mask=valid)


# --------------------------------------------------------------------------- helpers
@triton.jit
def _tile_ids(NUM_M, N, BN: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, N tile) of this program; GROUP_M row blocks share a run of N tiles."""
    pid = tl.program_id(0)
    num_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    gsz = tl.minimum(NUM_M - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % gsz
    pid_n = (pid % in_group) // gsz
    return pid_m, pid_n


@triton.jit
def _scale_exp(sp, mask, SCALE_F32: tl.constexpr):
    """UE8M0 exponent (int32) from uint8 bits or a float32 power of two."""
    if SCALE_F32:
        bits = tl.load(sp, mask=mask, other=1.0).to(tl.int32, bitcast=True)
        return (bits >> 23) & 0xFF
    else:
        return tl.load(sp, mask=mask, other=127).to(tl.int32)


@triton.jit
def _deq_half(hb, sf, BN: tl.constexpr, BKH: tl.constexpr, OUT_DT: tl.constexpr):
    """fp16 bit patterns of e2m1 * 2^-14 (int32 [BN, BKH]) times sf = 2^(s-113) per 16."""
    v = hb.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    sfb = tl.reshape(tl.broadcast_to(sf[:, :, None], (BN, BKH // 16, 16)), (BN, BKH))
    return (v * sfb).to(OUT_DT)


# Four packed bytes in $4 -> the bf16 pairs of their low nibbles ($0: bytes 0,1; $1: bytes
# 2,3) and of their high nibbles ($2, $3), times the bf16 scale pairs $5 (bytes 0,1) and $6
# (bytes 2,3). prmt spreads two bytes to the two 16-bit halves; the e2m1 magnitude bits go to
# bf16 bits 8..6 and the sign to bit 15, which reads as e2m1 * 2^-126 (code 1 is the bf16
# subnormal 2^-127); * 2^126 (exact, subnormal input) then * scale (exact: powers of two).
_DEQ_PTX = tl.constexpr("""
{
.reg .b32 x, y, t, u, r, m1, m2, zero, c126;
mov.b32 zero, 0;
mov.b32 m1, 0x01C001C0;
mov.b32 m2, 0x81C081C0;
mov.b32 c126, 0x7E807E80;
prmt.b32 x, $4, zero, 0x4140;
prmt.b32 y, $4, zero, 0x4342;
shl.b32 t, x, 6;
shl.b32 u, x, 12;
lop3.b32 r, t, u, m1, 0xE4;
and.b32 r, r, m2;
mul.rn.bf16x2 r, r, c126;
mul.rn.bf16x2 $0, r, $5;
shl.b32 t, y, 6;
shl.b32 u, y, 12;
lop3.b32 r, t, u, m1, 0xE4;
and.b32 r, r, m2;
mul.rn.bf16x2 r, r, c126;
mul.rn.bf16x2 $1, r, $6;
shl.b32 t, x, 2;
shl.b32 u, x, 8;
lop3.b32 r, t, u, m1, 0xE4;
and.b32 r, r, m2;
mul.rn.bf16x2 r, r, c126;
mul.rn.bf16x2 $2, r, $5;
shl.b32 t, y, 2;
shl.b32 u, y, 8;
lop3.b32 r, t, u, m1, 0xE4;
and.b32 r, r, m2;
mul.rn.bf16x2 r, r, c126;
mul.rn.bf16x2 $3, r, $6;
}
""")


@triton.jit
def _deq_ptx(wp, se, BN: tl.constexpr, BK: tl.constexpr):
    """packed bytes [BN, BK/2] + exponents [BN, BK/32] -> (lo, hi) bf16 [BN, BK/2] (exact)."""
    sf = (se << 23).to(tl.float32, bitcast=True).to(tl.bfloat16)  # 2^(s-127)
    sfb = tl.reshape(tl.broadcast_to(sf[:, :, None], (BN, BK // 32, 16)), (BN, BK // 2))
    return tl.inline_asm_elementwise(_DEQ_PTX, "=r,=r,=r,=r,r,r,r", [wp, sfb],
                                     dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)


@triton.jit
def _mma_swapped(acc, a_ev, a_od, wp, se, BN: tl.constexpr, BK: tl.constexpr,
                 INTERP: tl.constexpr, DEQ_PTX: tl.constexpr):
    """acc[BN, BM] += W[BN, BK] @ A[BM, BK]^T from packed bytes wp [BN, BK/2] (uint8),
    exponents se [BN, BK/32] and A split into its even (a_ev) and odd (a_od) K columns.

    An e2m1 code c = s|e1|e0|m placed at fp16 bits 15 and 11..9 is the fp16 number
    e2m1(c) * 2^-14 (code 1 lands on the fp16 subnormal 2^-15 = 0.5 * 2^-14), so after
    an exact fp16 -> fp32 convert one multiply by 2^(s - 127 + 14) gives the weight."""
    if DEQ_PTX:
        lo, hi = _deq_ptx(wp, se, BN, BK)
        acc = tl.dot(lo, tl.trans(a_ev), acc)
        acc = tl.dot(hi, tl.trans(a_od), acc)
    else:
        w = wp.to(tl.int32)
        sf = ((se + 14) << 23).to(tl.float32, bitcast=True)
        hb_lo = ((w & 7) << 9) | ((w & 8) << 12)
        hb_hi = ((w & 0x70) << 5) | ((w & 0x80) << 8)
        if INTERP:  # the interpreter's bf16 casts truncate; same exact values in fp32
            lo = _deq_half(hb_lo, sf, BN, BK // 2, tl.float32)
            hi = _deq_half(hb_hi, sf, BN, BK // 2, tl.float32)
            acc = tl.dot(lo, tl.trans(a_ev.to(tl.float32)), acc, input_precision="ieee")
            acc = tl.dot(hi, tl.trans(a_od.to(tl.float32)), acc, input_precision="ieee")
        else:
            lo = _deq_half(hb_lo, sf, BN, BK // 2, tl.bfloat16)
            hi = _deq_half(hb_hi, sf, BN, BK // 2, tl.bfloat16)
            acc = tl.dot(lo, tl.trans(a_ev), acc)
            acc = tl.dot(hi, tl.trans(a_od), acc)
    return acc


@triton.jit
def _quant_mxfp8(a, BM: tl.constexpr, BK: tl.constexpr):
    """bf16 [BM, BK] -> e4m3 [BM, BK] and uint8 biased exponents [BM, BK/32]; the scale of
    a 32-group is 2^(ceil(log2 amax) - 8), so |a| / scale <= 256 < 448 (no saturation)."""
    g = tl.reshape(a.to(tl.float32), (BM, BK // 32, 32))
    amax = tl.max(tl.abs(g), axis=2)
    bits = amax.to(tl.int32, bitcast=True)
    ex = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    sexp = tl.maximum(ex - 8, 1)
    inv = ((254 - sexp) << 23).to(tl.float32, bitcast=True)
    q = tl.reshape(g * inv[:, :, None], (BM, BK)).to(tl.float8e4nv)
    return q, sexp.to(tl.uint8)


@triton.jit
def _w_e4m3(wp, se, BN: tl.constexpr, BK: tl.constexpr):
    """packed e2m1 [BN, BK/2] -> e4m3 bytes [BN, BK] (K order) and ue8m0 bits [BN, BK/32].

    e2m1 magnitude bits (e1 e0 m) moved to e4m3 bits 4..2 read as e4m3 give the e2m1 value
    times 2^-6 exactly (code 1 becomes the e4m3 subnormal 2^-7), so the scale gains +6."""
    w = wp.to(tl.int32)
    lo = ((w & 7) << 2) | ((w & 8) << 4)
    hi = ((w >> 2) & 0x1C) | (w & 0x80)
    q = tl.reshape(tl.join(lo, hi), (BN, BK)).to(tl.uint8)
    return q, (se + 6).to(tl.uint8)


# --------------------------------------------------------------------------- GEMMs
@triton.jit
def _gemm1_kernel(x_ptr, w_ptr, s_ptr, h_ptr, sorted_ptr, block_expert_ptr, start_ptr, counts_ptr,
                  TOPK, NUM_M, HID: tl.constexpr, INTER: tl.constexpr,
                  stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_hm,
                  limit, stride_ps,
                  SCALE_F32: tl.constexpr, SWIGLU: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                  IMPL: tl.constexpr, INTERP: tl.constexpr, DEQ_PTX: tl.constexpr = False,
                  SPLIT_K: tl.constexpr = 1, K_PER_SPLIT: tl.constexpr = 0):
    """SPLIT_K == 1: h = clamp/SiLU(gate) * up, bf16 in h_ptr. SPLIT_K > 1 (grid axis 1 = K split):
    fp32 partial gate | up sums of K range [pid_k * K_PER_SPLIT, + K_PER_SPLIT) into h_ptr as
    [SPLIT_K, rows, 2 * INTER] (split stride stride_ps); _swiglu_kernel finishes them."""
    pid_m, pid_n = _tile_ids(NUM_M, INTER, BN, GROUP_M)
    tl.static_assert(K_PER_SPLIT > 0 and K_PER_SPLIT % BK == 0)
    k_lo = tl.program_id(1) * K_PER_SPLIT   # steps past HID (last / surplus splits) load nothing: masked
    e = tl.load(block_expert_ptr + pid_m)
    if e < 0:
        return
    st = tl.load(start_ptr + e)
    cnt = tl.load(counts_ptr + e)
    rows = pid_m * BM + tl.arange(0, BM)
    rvalid = (rows - st) < cnt
    # unmasked (rows < max_rows: in bounds) so this load does not wait for start/counts; rows past
    # the expert's count hold stale values, zeroed here and masked in every use
    slot = tl.where(rvalid, tl.load(sorted_ptr + rows), 0)
    tok = (slot // TOPK).to(tl.int64)
    n = pid_n * BN + tl.arange(0, BN)
    nmask = n < INTER
    e64 = e.to(tl.int64)
    wg_base = w_ptr + e64 * stride_we + n[:, None].to(tl.int64) * stride_wn
    wu_base = wg_base + INTER * stride_wn
    sg_base = s_ptr + e64 * stride_se + n[:, None].to(tl.int64) * stride_sn
    su_base = sg_base + INTER * stride_sn
    x_base = x_ptr + tok[:, None] * stride_xm
    kp = tl.arange(0, BK // 2)
    ks = tl.arange(0, BK // 32)
    if IMPL == 0:
        acc_g = tl.zeros([BN, BM], dtype=tl.float32)
        acc_u = tl.zeros([BN, BM], dtype=tl.float32)
        for kstep in range(0, K_PER_SPLIT, BK):  # constexpr trip count (the interpreter needs it)
            k0 = k_lo + kstep
            pin = (k0 // 2 + kp) < HID // 2
            am = rvalid[:, None] & pin[None, :]
            pm = nmask[:, None] & pin[None, :]
            sm = nmask[:, None] & ((k0 // 32 + ks) < HID // 32)[None, :]
            # weights first: their addresses depend on the expert only, not on the routed rows
            wg = tl.load(wg_base + (k0 // 2 + kp)[None, :], mask=pm, other=0).to(tl.uint8, bitcast=True)
            wu = tl.load(wu_base + (k0 // 2 + kp)[None, :], mask=pm, other=0).to(tl.uint8, bitcast=True)
            sg = _scale_exp(sg_base + (k0 // 32 + ks)[None, :], sm, SCALE_F32)
            su = _scale_exp(su_base + (k0 // 32 + ks)[None, :], sm, SCALE_F32)
            ap = x_base + (k0 + 2 * kp)[None, :]
            a_ev = tl.load(ap, mask=am, other=0.0)
            a_od = tl.load(ap + 1, mask=am, other=0.0)
            acc_g = _mma_swapped(acc_g, a_ev, a_od, wg, sg, BN, BK, INTERP, DEQ_PTX)
            acc_u = _mma_swapped(acc_u, a_ev, a_od, wu, su, BN, BK, INTERP, DEQ_PTX)
    else:
        kk = tl.arange(0, BK)
        acc_gt = tl.zeros([BM, BN], dtype=tl.float32)
        acc_ut = tl.zeros([BM, BN], dtype=tl.float32)
        for kstep in range(0, K_PER_SPLIT, BK):  # constexpr trip count (the interpreter needs it)
            k0 = k_lo + kstep
            a = tl.load(x_base + (k0 + kk)[None, :],
                        mask=rvalid[:, None] & ((k0 + kk) < HID)[None, :], other=0.0)
            pm = nmask[:, None] & ((k0 // 2 + kp) < HID // 2)[None, :]
            sm = nmask[:, None] & ((k0 // 32 + ks) < HID // 32)[None, :]
            wg = tl.load(wg_base + (k0 // 2 + kp)[None, :], mask=pm, other=0).to(tl.uint8, bitcast=True)
            wu = tl.load(wu_base + (k0 // 2 + kp)[None, :], mask=pm, other=0).to(tl.uint8, bitcast=True)
            sg = _scale_exp(sg_base + (k0 // 32 + ks)[None, :], sm, SCALE_F32)
            su = _scale_exp(su_base + (k0 // 32 + ks)[None, :], sm, SCALE_F32)
            if IMPL == 1:
                acc_gt = tl.dot_scaled(a, None, "bf16", tl.trans(wg), sg.to(tl.uint8), "e2m1", acc_gt)
                acc_ut = tl.dot_scaled(a, None, "bf16", tl.trans(wu), su.to(tl.uint8), "e2m1", acc_ut)
            else:
                aq, asc = _quant_mxfp8(a, BM, BK)
                qg, qsg = _w_e4m3(wg, sg, BN, BK)
                qu, qsu = _w_e4m3(wu, su, BN, BK)
                acc_gt = tl.dot_scaled(aq, asc, "e4m3", tl.trans(qg), qsg, "e4m3", acc_gt)
                acc_ut = tl.dot_scaled(aq, asc, "e4m3", tl.trans(qu), qsu, "e4m3", acc_ut)
        acc_g = tl.trans(acc_gt)
        acc_u = tl.trans(acc_ut)
    if SPLIT_K == 1:
        if SWIGLU:
            acc_g = tl.minimum(acc_g, limit)
            acc_u = tl.minimum(tl.maximum(acc_u, -limit), limit)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        hp = h_ptr + rows[None, :].to(tl.int64) * stride_hm + n[:, None]
        tl.store(hp, h.to(h_ptr.dtype.element_ty), mask=rvalid[None, :] & nmask[:, None])
    else:
        pp = (h_ptr + tl.program_id(1).to(tl.int64) * stride_ps + rows[None, :].to(tl.int64) * stride_hm
              + n[:, None])
        tl.store(pp, acc_g, mask=rvalid[None, :] & nmask[:, None])
        tl.store(pp + INTER, acc_u, mask=rvalid[None, :] & nmask[:, None])


@triton.jit
def _swiglu_kernel(p_ptr, h_ptr, block_expert_ptr, start_ptr, counts_ptr, INTER, stride_ps, stride_pm,
                   stride_hm, limit, SWIGLU: tl.constexpr, SPLIT_K: tl.constexpr, BM: tl.constexpr,
                   BH: tl.constexpr):
    """h[row] = clamp/SiLU(sum of the gate partials) * (sum of the up partials), valid rows only."""
    r = tl.program_id(0)
    e = tl.load(block_expert_ptr + r // BM)
    if e < 0:
        return
    if r - tl.load(start_ptr + e) >= tl.load(counts_ptr + e):
        return
    n = tl.program_id(1) * BH + tl.arange(0, BH)
    nm = n < INTER
    base = p_ptr + r.to(tl.int64) * stride_pm + n
    g = tl.zeros([BH], dtype=tl.float32)
    u = tl.zeros([BH], dtype=tl.float32)
    for sk in tl.static_range(SPLIT_K):
        g += tl.load(base + sk * stride_ps, mask=nm, other=0.0)
        u += tl.load(base + sk * stride_ps + INTER, mask=nm, other=0.0)
    if SWIGLU:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(h_ptr + r.to(tl.int64) * stride_hm + n, h.to(h_ptr.dtype.element_ty), mask=nm)


@triton.jit
def _gemm2_kernel(h_ptr, w_ptr, s_ptr, y_ptr, tw_ptr, sorted_ptr, block_expert_ptr, start_ptr,
                  counts_ptr, NUM_M, HID: tl.constexpr, INTER: tl.constexpr,
                  stride_hm, stride_we, stride_wn, stride_se, stride_sn, stride_ym, stride_ys,
                  SCALE_F32: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                  IMPL: tl.constexpr, INTERP: tl.constexpr, DEQ_PTX: tl.constexpr = False,
                  K_PER_SPLIT: tl.constexpr = 0):
    """y[slot] = tw * h W2^T over K range [pid_k * K_PER_SPLIT, ...) (grid axis 1 = K split; split
    pid_k writes at y_ptr + pid_k * stride_ys, summed by _reduce_kernel)."""
    pid_m, pid_n = _tile_ids(NUM_M, HID, BN, GROUP_M)
    tl.static_assert(K_PER_SPLIT > 0 and K_PER_SPLIT % BK == 0)
    k_lo = tl.program_id(1) * K_PER_SPLIT   # steps past INTER load nothing: masked
    e = tl.load(block_expert_ptr + pid_m)
    if e < 0:
        return
    st = tl.load(start_ptr + e)
    cnt = tl.load(counts_ptr + e)
    rows = pid_m * BM + tl.arange(0, BM)
    rvalid = (rows - st) < cnt
    # unmasked (rows < max_rows: in bounds) so this load does not wait for start/counts; rows past
    # the expert's count hold stale values, zeroed here and masked in every use
    slot = tl.where(rvalid, tl.load(sorted_ptr + rows), 0)
    n = pid_n * BN + tl.arange(0, BN)
    nmask = n < HID
    e64 = e.to(tl.int64)
    w_base = w_ptr + e64 * stride_we + n[:, None].to(tl.int64) * stride_wn
    s_base = s_ptr + e64 * stride_se + n[:, None].to(tl.int64) * stride_sn
    a_base = h_ptr + rows[:, None].to(tl.int64) * stride_hm
    kp = tl.arange(0, BK // 2)
    ks = tl.arange(0, BK // 32)
    if IMPL == 0:
        acc = tl.zeros([BN, BM], dtype=tl.float32)
        for kstep in range(0, K_PER_SPLIT, BK):  # constexpr trip count (the interpreter needs it)
            k0 = k_lo + kstep
            pin = (k0 // 2 + kp) < INTER // 2
            am = rvalid[:, None] & pin[None, :]
            pm = nmask[:, None] & pin[None, :]
            sm = nmask[:, None] & ((k0 // 32 + ks) < INTER // 32)[None, :]
            wp = tl.load(w_base + (k0 // 2 + kp)[None, :], mask=pm, other=0).to(tl.uint8, bitcast=True)
            se = _scale_exp(s_base + (k0 // 32 + ks)[None, :], sm, SCALE_F32)
            ap = a_base + (k0 + 2 * kp)[None, :]
            a_ev = tl.load(ap, mask=am, other=0.0)
            a_od = tl.load(ap + 1, mask=am, other=0.0)
            acc = _mma_swapped(acc, a_ev, a_od, wp, se, BN, BK, INTERP, DEQ_PTX)
    else:
        kk = tl.arange(0, BK)
        acc_t = tl.zeros([BM, BN], dtype=tl.float32)
        for kstep in range(0, K_PER_SPLIT, BK):  # constexpr trip count (the interpreter needs it)
            k0 = k_lo + kstep
            a = tl.load(a_base + (k0 + kk)[None, :],
                        mask=rvalid[:, None] & ((k0 + kk) < INTER)[None, :], other=0.0)
            pm = nmask[:, None] & ((k0 // 2 + kp) < INTER // 2)[None, :]
            sm = nmask[:, None] & ((k0 // 32 + ks) < INTER // 32)[None, :]
            wp = tl.load(w_base + (k0 // 2 + kp)[None, :], mask=pm, other=0).to(tl.uint8, bitcast=True)
            se = _scale_exp(s_base + (k0 // 32 + ks)[None, :], sm, SCALE_F32)
            if IMPL == 1:
                acc_t = tl.dot_scaled(a, None, "bf16", tl.trans(wp), se.to(tl.uint8), "e2m1", acc_t)
            else:
                aq, asc = _quant_mxfp8(a, BM, BK)
                qw, qs = _w_e4m3(wp, se, BN, BK)
                acc_t = tl.dot_scaled(aq, asc, "e4m3", tl.trans(qw), qs, "e4m3", acc_t)
        acc = tl.trans(acc_t)
    tw = tl.load(tw_ptr + slot, mask=rvalid, other=0.0).to(tl.float32)
    acc = acc * tw[None, :]
    yp = (y_ptr + tl.program_id(1).to(tl.int64) * stride_ys + slot[None, :].to(tl.int64) * stride_ym
          + n[:, None])
    tl.store(yp, acc.to(y_ptr.dtype.element_ty), mask=rvalid[None, :] & nmask[:, None])


@triton.jit
def _reduce_kernel(y_ptr, ids_ptr, out_ptr, HID, E, rsf, stride_ym, stride_om, stride_ys,
                   TOPK: tl.constexpr, BH: tl.constexpr, SPLIT_K: tl.constexpr = 1):
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BH + tl.arange(0, BH)
    nm = n < HID
    acc = tl.zeros([BH], dtype=tl.float32)
    for k in tl.static_range(TOPK):
        idx = tl.load(ids_ptr + t * TOPK + k).to(tl.int32)
        # dropped / out-of-range ids add nothing. A branch, not a scalar term in the load mask: Triton 3.9's
        # interpreter broadcasts a scalar comparison as int32 and then refuses the mask (compiled code is fine)
        if (idx >= 0) & (idx < E):
            for sk in tl.static_range(SPLIT_K):  # fixed order: same result every run
                v = tl.load(y_ptr + sk * stride_ys + (t * TOPK + k) * stride_ym + n, mask=nm, other=0.0)
                acc += v.to(tl.float32)
    tl.store(out_ptr + t * stride_om + n, (acc * rsf).to(out_ptr.dtype.element_ty), mask=nm)


# --------------------------------------------------------------------------- configs
_CFG_KEYS = ("BM", "BN", "BK", "GROUP_M", "num_warps", "num_stages", "SPLIT_K")
# Split-K of gemm1 (grid axis 1) when it has too few programs to hide the weight stream's latency:
# at 1 token only 6 experts are hit, 384 programs of 2 warps, ~6 warps per H100 SM (H100 profile:
# gemm1 50 us = 34 % of its byte floor, vs 51 % at 8 tokens; 41 us with the split). The split
# doubles until the grid reaches SPLIT_PROGRAMS_PER_SM programs per SM, keeping >= 2 K steps per
# split (shapes only). gemm2 splits only when a config asks (see fp4_moe()).
SPLIT_PROGRAMS_PER_SM = 8
MAX_SPLIT_K = 8


# Tiles per impl and regime (H100 runs 1-3 sweeps, docs/fp4_moe.md): BM rows (tokens) per block,
# shared by both GEMMs (it sets the row layout); BN weight rows per program (gemm1: per gate
# and per up half); BK K per step. "decode" = <= 8 expected rows per expert (weight-stream
# bound: many small programs over N), "mid" <= 48, "prefill" above.
_CONFIGS = {
    "dequant": {
        "decode": (dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=2, num_stages=4),
                   dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=2, num_stages=4)),
        "mid": (dict(BM=32, BN=128, BK=64, GROUP_M=4, num_warps=4, num_stages=4),
                dict(BM=32, BN=128, BK=64, GROUP_M=4, num_warps=4, num_stages=4)),
        "prefill": (dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3),
                    dict(BM=128, BN=128, BK=64, GROUP_M=8, num_warps=8, num_stages=3)),
    },
    "dot_scaled": {
        "decode": (dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=2, num_stages=4),
                   dict(BM=16, BN=32, BK=128, GROUP_M=1, num_warps=2, num_stages=4)),
        "mid": (dict(BM=32, BN=64, BK=128, GROUP_M=4, num_warps=4, num_stages=3),
                dict(BM=32, BN=64, BK=128, GROUP_M=4, num_warps=4, num_stages=3)),
        "prefill": (dict(BM=128, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=4),
                    dict(BM=128, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=4)),
    },
    "mxfp8": {
        "decode": (dict(BM=16, BN=32, BK=256, GROUP_M=1, num_warps=4, num_stages=3),
                   dict(BM=16, BN=32, BK=256, GROUP_M=1, num_warps=4, num_stages=3)),
        "mid": (dict(BM=32, BN=64, BK=128, GROUP_M=4, num_warps=4, num_stages=3),
                dict(BM=32, BN=64, BK=128, GROUP_M=4, num_warps=4, num_stages=3)),
        "prefill": (dict(BM=64, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=4),
                    dict(BM=64, BN=64, BK=64, GROUP_M=8, num_warps=4, num_stages=4)),
    },
}


def regime(M: int, topk: int, E: int) -> str:
    S = M * topk
    per_expert = S / max(1, min(E, S))
    return "decode" if per_expert <= 8 else ("mid" if per_expert <= 48 else "prefill")


def split_k(programs: int, K: int, BK: int, num_sms: int) -> int:
    """K splits for a GEMM grid of `programs` programs over K (see SPLIT_PROGRAMS_PER_SM)."""
    sk = 1
    while (sk < MAX_SPLIT_K and programs * sk < SPLIT_PROGRAMS_PER_SM * num_sms
           and triton.cdiv(K, 2 * sk * BK) >= 2):
        sk *= 2
    return sk


def max_row_blocks(S: int, BM: int, E: int) -> int:
    """Upper bound on the BM-row blocks of S slots over E experts, for any routing."""
    return S // BM + min(E, S)


def k_per_split(K: int, BK: int, splits: int) -> int:
    """K range of one split: whole BK steps (a step never straddles two splits; surplus splits
    get none)."""
    return triton.cdiv(triton.cdiv(K, BK), splits) * BK


def _pick_config(M: int, topk: int, E: int, I: int, H: int, impl: str):
    c1, c2 = _CONFIGS[impl][regime(M, topk, E)]
    return dict(c1), dict(c2)


def _finish_config(c1, c2, I, H):
    c2["BM"] = c1["BM"]  # both GEMMs share the row layout
    # tiny problems: keep BK <= K rounded up to a power of two >= 32
    c1["BK"] = min(c1["BK"], max(32, triton.next_power_of_2(H)))
    c2["BK"] = min(c2["BK"], max(32, triton.next_power_of_2(I)))
    return c1, c2


def _cuda_decode_unsupported(x, w13, w2, S, H, inter):
    """Why the compiled decode kernels cannot take this call (None when they can)."""
    if _interp() or x.device.type != "cuda":
        return "needs a CUDA device"
    if S > DECODE_MAX_SLOTS:
        return f"M * topk = {S} slots > {DECODE_MAX_SLOTS}"
    if H % 128 or inter % 128:
        return f"hidden ({H}) and I ({inter}) must be multiples of 128"
    if x.stride(0) % 8 or x.data_ptr() % 16:
        return f"hidden_states rows must be 16-byte aligned (stride(0) {x.stride(0)}, data_ptr % 16 {x.data_ptr() % 16})"
    for name, w in (("w13", w13), ("w2", w2)):
        if w.stride(1) % 16 or w.data_ptr() % 16:
            return f"{name} rows must be 16-byte aligned (strides {w.stride()})"
    from deepseek_v4_kernel._ext import has_fp4_moe_decode
    if not has_fp4_moe_decode():
        return "the CUDA extension (_C.so with the fp4_moe kernels) does not load"
    return extension_error(x.device)


def pick_impl(hidden_states, w13, w2, topk: int, config=None) -> str:
    """The impl fp4_moe(impl=None) runs: env DSV4_FP4_MOE_IMPL; else the compiled decode kernels up to
    CUDA_DECODE_DEFAULT_SLOTS slots where they apply (and no Triton tiles were asked for); else the
    Triton default of the regime (default_impl)."""
    M, H = hidden_states.shape
    E, inter = w13.shape[0], w13.shape[1] // 2
    S = M * topk
    if (os.environ.get("DSV4_FP4_MOE_IMPL") is None and config is None and 0 < S <= CUDA_DECODE_DEFAULT_SLOTS
            and _cuda_decode_unsupported(hidden_states, w13, w2, S, H, inter) is None):
        return "cuda_decode"
    return default_impl(regime(M, topk, E), hidden_states.device)


def default_impl(regime_name: str = "decode", device=None) -> str:
    env = os.environ.get("DSV4_FP4_MOE_IMPL")
    if env:
        return env
    if _interp() or not torch.cuda.is_available():
        return "dequant"
    if device is not None and torch.device(device).type != "cuda":
        return "dequant"
    major = torch.cuda.get_device_capability(device)[0]
    impl = (DEFAULT_IMPL_CC10 if major >= 10 else DEFAULT_IMPL_SM90)[regime_name]
    if impl == "dequant" and not decode_dequant_allowed():
        return "dot_scaled"
    return impl


def decode_dequant_allowed() -> bool:
    """Whether the decode regime's "dequant" default holds under the installed Triton (DEQUANT_DECODE_MAX_TRITON)."""
    return triton_version() <= DEQUANT_DECODE_MAX_TRITON


# --------------------------------------------------------------------------- checks
def _err(msg):
    raise UnsupportedCase(f"{OP}: {msg}")


_SCALE_DTYPES = (torch.uint8, torch.float32) + (
    (torch.float8_e8m0fnu,) if hasattr(torch, "float8_e8m0fnu") else ())


def _shape(t):
    return list(getattr(t, "shape", []))


def _check(x, w13, s13, w2, s2, tw, ids):
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16:
        _err(f"hidden_states must be bf16 [M, hidden], got "
             f"{getattr(x, 'dtype', type(x).__name__)} {_shape(x)}")
    M, H = x.shape
    for name, w in (("w13", w13), ("w2", w2)):
        if not isinstance(w, torch.Tensor) or w.dim() != 3 or w.dtype not in (torch.int8, torch.uint8):
            _err(f"{name} must be int8/uint8 packed e2m1 [E, N, K/2], got "
                 f"{getattr(w, 'dtype', type(w).__name__)} {_shape(w)}")
    E = w13.shape[0]
    I2 = w13.shape[1]
    if I2 % 2 or w13.shape[2] * 2 != H:
        _err(f"w13 must be [E, 2I, hidden/2] = [E, 2I, {H // 2}], got {list(w13.shape)}")
    inter = I2 // 2
    if H % GROUP or inter % GROUP or inter == 0:
        _err(f"hidden ({H}) and I ({inter}) must be positive multiples of {GROUP} "
             f"(w13 {list(w13.shape)})")
    if tuple(w2.shape) != (E, H, inter // 2):
        _err(f"w2 must be [E, hidden, I/2] = {[E, H, inter // 2]}, got {list(w2.shape)}")
    for name, s, wname, w in (("w13_scale", s13, "w13", w13), ("w2_scale", s2, "w2", w2)):
        want = (w.shape[0], w.shape[1], w.shape[2] * 2 // GROUP)
        if (not isinstance(s, torch.Tensor) or s.dtype not in _SCALE_DTYPES
                or tuple(s.shape) != want):
            _err(f"{name} must be uint8/float8_e8m0fnu/float32 {list(want)}, got "
                 f"{getattr(s, 'dtype', type(s).__name__)} {_shape(s)}")
        if s.stride(-1) != 1:
            _err(f"{name} must have unit stride along K/32, got strides {s.stride()}")
        if w.stride(-1) != 1:
            _err(f"{wname} must have unit stride along K, got strides {w.stride()}")
    if (not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != M
            or ids.dtype not in (torch.int32, torch.int64) or ids.shape[1] < 1):
        _err(f"topk_ids must be int32/int64 [M={M}, k>=1], got "
             f"{getattr(ids, 'dtype', type(ids).__name__)} {_shape(ids)}")
    if (not isinstance(tw, torch.Tensor) or tw.shape != ids.shape
            or tw.dtype not in (torch.float32, torch.bfloat16, torch.float16)):
        _err(f"topk_weights must be float32/bf16/fp16 [M={M}, k={ids.shape[1]}], got "
             f"{getattr(tw, 'dtype', type(tw).__name__)} {_shape(tw)}")
    devs = {t.device for t in (x, w13, s13, w2, s2, tw, ids)}
    if len(devs) != 1:
        _err(f"all tensors must be on one device, got {sorted(map(str, devs))}")
    if x.stride(1) != 1:
        _err(f"hidden_states must have unit stride along hidden, got strides {x.stride()}")
    return M, H, E, inter, ids.shape[1]


def _scale_arg(s):
    if s.dtype == torch.float32:
        return s, True
    if s.dtype != torch.uint8:
        s = s.view(torch.uint8)
    return s, False


def _merge_config(c1, c2, config):
    if config is None:
        return c1, c2
    if not isinstance(config, dict) or set(config) - {"gemm1", "gemm2"}:
        _err(f"config must be a dict with keys 'gemm1'/'gemm2', got {config!r}")
    for c, key in ((c1, "gemm1"), (c2, "gemm2")):
        over = config.get(key) or {}
        bad = set(over) - set(_CFG_KEYS)
        if bad:
            _err(f"config[{key!r}] has unknown keys {sorted(bad)} (allowed {list(_CFG_KEYS)})")
        c.update(over)
    if "BM" in (config.get("gemm2") or {}) and config["gemm2"]["BM"] != c1["BM"]:
        _err("config: gemm2 BM must equal gemm1 BM (shared row layout)")
    for c in (c1, c2):
        for k in ("BM", "BN", "BK"):
            v = c[k]
            if v < 16 or v & (v - 1):
                _err(f"config {k} must be a power of two >= 16, got {v}")
        if c["BK"] < 32:
            _err(f"config BK must be >= 32, got {c['BK']}")
        sk = c.get("SPLIT_K")
        if sk is not None and (not isinstance(sk, int) or not 1 <= sk <= 64):
            _err(f"config SPLIT_K must be an int in [1, 64], got {sk!r}")
    return c1, c2


# --------------------------------------------------------------------------- op
@on_input_device
def fp4_moe(hidden_states, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
            swiglu_limit=None, routed_scaling_factor=None, impl=None, out=None, config=None):
    """DeepSeek-V4 MXFP4 routed experts (see module docstring). Returns bf16 [M, hidden].

    ``config`` (tuning/benchmarks): {"gemm1": {...}, "gemm2": {...}} overriding any of
    BM, BN, BK, GROUP_M, num_warps, num_stages of the picked tiles."""
    M, H, E, inter, topk = _check(hidden_states, w13, w13_scale, w2, w2_scale,
                                  topk_weights, topk_ids)
    S = M * topk
    impl = impl or pick_impl(hidden_states, w13, w2, topk, config)
    if impl not in IMPLS:
        _err(f"impl must be one of {list(IMPLS)}, got {impl!r}")
    interp = _interp()
    if interp and impl != "cuda_decode":
        impl = "dequant"
    dev = hidden_states.device
    if out is None:
        out = torch.empty(M, H, dtype=torch.bfloat16, device=dev)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, H)
          or out.dtype != torch.bfloat16 or out.stride(1) != 1 or out.device != dev):
        _err(f"out must be bf16 [M, hidden] = {[M, H]} on {dev} with unit stride, got "
             f"{getattr(out, 'dtype', type(out).__name__)} {_shape(out)}")
    if M == 0:
        return out
    if impl == "cuda_decode":
        why = _cuda_decode_unsupported(hidden_states, w13, w2, S, H, inter)
        if why is None and config is not None:
            why = "config (tiles) applies to the Triton impls only"
        if why is not None:
            _err(f"impl 'cuda_decode': {why}")
        _cuda_decode(hidden_states, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, swiglu_limit,
                     routed_scaling_factor, out, M, H, E, inter, topk)
        return out
    c1, c2 = _pick_config(M, topk, E, inter, H, impl)
    c1, c2 = _merge_config(c1, c2, config)
    c1, c2 = _finish_config(c1, c2, inter, H)
    BM = c1["BM"]
    max_blocks = max_row_blocks(S, BM, E)
    max_rows = max_blocks * BM

    ids = topk_ids.contiguous().view(-1)
    tw = topk_weights.contiguous().view(-1)
    start = torch.empty(E, dtype=torch.int32, device=dev)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    sorted_slot = torch.empty(max_rows, dtype=torch.int32, device=dev)
    mid_dtype = torch.float32 if interp else torch.bfloat16
    hbuf = torch.empty(max_rows, inter, dtype=mid_dtype, device=dev)
    EP = max(16, triton.next_power_of_2(E))
    BB = 32
    if S <= SMALL_ROUTE_MAX_SLOTS:
        counts = torch.empty(E, dtype=torch.int32, device=dev)
        BS = 32 if EP <= 256 else 16
        _route_small_kernel[(1,)](
            ids, counts, start, block_expert, sorted_slot, S, E, max_blocks,
            BM=BM, EP=EP, BS=BS, BB=BB,
            IT_S=triton.cdiv(S, BS) if interp else 0,
            IT_B=triton.cdiv(max_blocks, BB) if interp else 0, num_warps=4)
    else:
        counts = torch.zeros(E, dtype=torch.int32, device=dev)
        rank = torch.empty(S, dtype=torch.int32, device=dev)
        BLK = 1024
        _count_kernel[(triton.cdiv(S, BLK),)](ids, counts, rank, S, E, BLOCK=BLK)
        _layout_kernel[(1,)](counts, ids, rank, start, block_expert, sorted_slot, S, E,
                             max_blocks, BM=BM, EP=EP, BB=BB, BS=1024,
                             IT_B=triton.cdiv(max_blocks, BB) if interp else 0,
                             IT_S=triton.cdiv(S, 1024) if interp else 0, num_warps=4)

    s13, f13 = _scale_arg(w13_scale)
    s2_, f2 = _scale_arg(w2_scale)
    code = _IMPL_CODE[impl]
    deq_ptx = (impl == "dequant" and not interp
               and os.environ.get("DSV4_FP4_MOE_DEQ_PTX", "1") != "0")
    swiglu = swiglu_limit is not None
    limit = float(swiglu_limit) if swiglu else 0.0
    n1 = max_blocks * triton.cdiv(inter, c1["BN"])
    n2 = max_blocks * triton.cdiv(H, c2["BN"])
    nsm = 1 if interp or dev.type != "cuda" else sm_count(dev)
    sk1 = c1.get("SPLIT_K") or split_k(n1, H, c1["BK"], nsm)
    # gemm2 (K = I, half of gemm1's) stays unsplit unless asked: on the H100 at 1 token a 2-way
    # split measured 27.6 vs 26.0 us (its programs are short already; the per-program prologue of
    # dependent routing loads dominates), while gemm1 went 49.8 -> 41.3 us with 4 splits
    sk2 = c2.get("SPLIT_K") or 1
    kps1, kps2 = k_per_split(H, c1["BK"], sk1), k_per_split(inter, c2["BK"], sk2)
    if sk1 > 1:   # fp32 gate | up partials per split, finished by _swiglu_kernel
        g_out = torch.empty(sk1, max_rows, 2 * inter, dtype=torch.float32, device=dev)
        g_stride_m, g_stride_s = g_out.stride(1), g_out.stride(0)
    else:
        g_out, g_stride_m, g_stride_s = hbuf, hbuf.stride(0), 0
    k1 = _gemm1_kernel[(n1, sk1)](
        hidden_states, w13, s13, g_out, sorted_slot, block_expert, start, counts,
        topk, max_blocks, H, inter,
        hidden_states.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1),
        g_stride_m, limit, g_stride_s,
        SCALE_F32=f13, SWIGLU=swiglu, BM=BM, BN=c1["BN"], BK=c1["BK"], GROUP_M=c1["GROUP_M"],
        IMPL=code, INTERP=interp, DEQ_PTX=deq_ptx, SPLIT_K=sk1, K_PER_SPLIT=kps1,
        num_warps=c1["num_warps"], num_stages=c1["num_stages"])
    if sk1 > 1:
        BHS = min(1024, triton.next_power_of_2(inter))
        _swiglu_kernel[(max_rows, triton.cdiv(inter, BHS))](
            g_out, hbuf, block_expert, start, counts, inter, g_out.stride(0), g_out.stride(1),
            hbuf.stride(0), limit, SWIGLU=swiglu, SPLIT_K=sk1, BM=BM, BH=BHS)
    if sk2 > 1:   # fp32 partial y per split, summed by _reduce_kernel
        ybuf = torch.empty(sk2, S, H, dtype=torch.float32, device=dev)
        y_stride_m, y_stride_s = ybuf.stride(1), ybuf.stride(0)
    else:
        ybuf = torch.empty(S, H, dtype=mid_dtype, device=dev)
        y_stride_m, y_stride_s = ybuf.stride(0), 0
    k2 = _gemm2_kernel[(n2, sk2)](
        hbuf, w2, s2_, ybuf, tw, sorted_slot, block_expert, start, counts, max_blocks, H, inter,
        hbuf.stride(0), w2.stride(0), w2.stride(1), s2_.stride(0), s2_.stride(1), y_stride_m, y_stride_s,
        SCALE_F32=f2, BM=BM, BN=c2["BN"], BK=c2["BK"], GROUP_M=c2["GROUP_M"], IMPL=code,
        INTERP=interp, DEQ_PTX=deq_ptx, K_PER_SPLIT=kps2,
        num_warps=c2["num_warps"], num_stages=c2["num_stages"])
    BH = min(1024, triton.next_power_of_2(H))
    _reduce_kernel[(M, triton.cdiv(H, BH))](
        ybuf, ids, out, H, E,
        1.0 if routed_scaling_factor is None else float(routed_scaling_factor),
        y_stride_m, out.stride(0), y_stride_s, TOPK=topk, BH=BH, SPLIT_K=sk2)
    LAST_KERNELS["gemm1"] = k1
    LAST_KERNELS["gemm2"] = k2
    LAST_KERNELS["config"] = (dict(c1), dict(c2), impl)
    LAST_KERNELS["split_k"] = (sk1, sk2)
    return out


_TW_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


def _cuda_decode(x, w13, s13, w2, s2, tw, ids, swiglu_limit, rsf, out, M, H, E, inter, topk):
    """Both decode kernels of csrc/fp4_moe (gemm1 + SiLU, gemm2 + combine) on the current stream.
    Workspace per call (sizes from M, topk, hidden, I only: graph-safe): h bf16 [S, I], y fp32
    [S, hidden] and gemm2's column-tile counters int32 [hidden / 32] (zeroed by gemm1).
    The only host work is filling the parameter block: no sync, no per-device query."""
    from deepseek_v4_kernel._ext import Fp4MoeDecodeParams, load

    dev = x.device
    S = M * topk
    ids, tw = ids.contiguous(), tw.contiguous()
    h = torch.empty(S, inter, dtype=torch.bfloat16, device=dev)
    y = torch.empty(S, H, dtype=torch.float32, device=dev)
    counters = torch.empty(H // DECODE_GEMM2_TILE, dtype=torch.int32, device=dev)
    (s13, f13), (s2, f2) = _scale_arg(s13), _scale_arg(s2)
    p = Fp4MoeDecodeParams()
    p.x, p.x_stride = x.data_ptr(), x.stride(0)
    p.w13, p.w13_stride_e, p.w13_stride_n = w13.data_ptr(), w13.stride(0), w13.stride(1)
    p.s13, p.s13_stride_e, p.s13_stride_n, p.s13_f32 = s13.data_ptr(), s13.stride(0), s13.stride(1), int(f13)
    p.w2, p.w2_stride_e, p.w2_stride_n = w2.data_ptr(), w2.stride(0), w2.stride(1)
    p.s2, p.s2_stride_e, p.s2_stride_n, p.s2_f32 = s2.data_ptr(), s2.stride(0), s2.stride(1), int(f2)
    p.topk_ids, p.ids_int64 = ids.data_ptr(), int(ids.dtype == torch.int64)
    p.topk_weights, p.tw_dtype = tw.data_ptr(), _TW_CODE[tw.dtype]
    p.h, p.y, p.counters = h.data_ptr(), y.data_ptr(), counters.data_ptr()
    p.out, p.out_stride = out.data_ptr(), out.stride(0)
    p.M, p.topk, p.E, p.hidden, p.inter = M, topk, E, H, inter
    p.swiglu = int(swiglu_limit is not None)
    p.swiglu_limit = float(swiglu_limit) if swiglu_limit is not None else 0.0
    p.rsf = 1.0 if rsf is None else float(rsf)
    lib = load()
    with torch.cuda.device(dev):
        rc = lib.dsv4_fp4_moe_decode(p, torch.cuda.current_stream(dev).cuda_stream)
    if rc != 0:
        raise RuntimeError(f"{OP}: CUDA error {rc}: {lib.dsv4_last_error().decode(errors='replace')}")
    LAST_KERNELS.clear()
    LAST_KERNELS["config"] = (None, None, "cuda_decode")
    LAST_KERNELS["split_k"] = (1, 1)


# --------------------------------------------------------------------------- SGLang shim
def fp8_moe_method_apply(self, layer, dispatch_output):
    """Drop-in for ``Fp8MoEMethod.apply(self, layer, dispatch_output) -> CombineInput`` of
    ``sglang.srt.layers.quantization.fp8`` (SGLang 0.5.12+), for DeepSeek-V4's MXFP4 experts on
    the Triton MoE runner. There SGLang hands the packed e2m1 bytes to its fp8 Triton kernel,
    which stops with "Hidden size mismatch" (hidden vs hidden/2): on SM120 that is the default
    path of 0.5.12-0.5.15.post1, and the path of any later version run with
    ``--moe-runner-backend triton`` (docs/sglang_surface.md has the evidence).

    Reads SGLang's own parameters as its loader left them (w13_weight int8 [E, 2I, hidden/2] =
    [gate; up], w13_weight_scale_inv float32 powers of two [E, 2I, hidden/32], w2 likewise), so
    routing, weight loading and expert placement stay SGLang's; applies the runner config the way
    SGLang's Triton runner does (swiglu_limit clamp, routed_scaling_factor on the sum). Any other
    case raises UnsupportedCase and the patch layer calls the original method.
    """
    if not getattr(self, "is_fp4_expert", False):
        _err("Fp8MoEMethod.apply: the layer's experts are not MXFP4 (is_fp4_expert is False)")
    backend = getattr(getattr(self, "runner", None), "runner_backend", None)
    if backend is None or not backend.is_triton():
        _err(f"Fp8MoEMethod.apply: MoE runner backend is {getattr(backend, 'name', backend)}, not triton")
    fmt = getattr(dispatch_output, "format", None)
    if fmt is not None and hasattr(fmt, "is_standard") and not fmt.is_standard():
        _err(f"Fp8MoEMethod.apply: dispatch output format {fmt} is not the standard one")
    if getattr(dispatch_output, "hidden_states_scale", None) is not None:
        _err("Fp8MoEMethod.apply: hidden_states arrive quantised (hidden_states_scale is set); bf16 expected")
    cfg = self.moe_runner_config
    if getattr(cfg, "activation", "silu") != "silu" or not getattr(cfg, "is_gated", True):
        _err(f"Fp8MoEMethod.apply: activation {getattr(cfg, 'activation', None)!r} "
             f"(gated={getattr(cfg, 'is_gated', None)}) unsupported; gated silu expected")
    if getattr(cfg, "apply_router_weight_on_input", False) or getattr(cfg, "no_combine", False):
        _err("Fp8MoEMethod.apply: apply_router_weight_on_input / no_combine unsupported")
    if getattr(cfg, "gemm1_alpha", None) is not None or getattr(cfg, "gemm1_clamp_limit", None) is not None:
        _err("Fp8MoEMethod.apply: gemm1_alpha / gemm1_clamp_limit (GPT-OSS style SwiGLU) unsupported")
    if getattr(layer, "w13_weight_bias", None) is not None or getattr(layer, "w2_weight_bias", None) is not None:
        _err("Fp8MoEMethod.apply: expert biases unsupported")
    topk_output = dispatch_output.topk_output
    topk_weights = getattr(topk_output, "topk_weights", None)
    topk_ids = getattr(topk_output, "topk_ids", None)
    if topk_weights is None or topk_ids is None:
        _err(f"Fp8MoEMethod.apply: top-k output {type(topk_output).__name__} has no topk_weights/topk_ids")
    out = fp4_moe(dispatch_output.hidden_states, layer.w13_weight, layer.w13_weight_scale_inv,
                  layer.w2_weight, layer.w2_weight_scale_inv, topk_weights, topk_ids,
                  swiglu_limit=getattr(cfg, "swiglu_limit", None),
                  routed_scaling_factor=getattr(cfg, "routed_scaling_factor", None))
    from sglang.srt.layers.moe.token_dispatcher import StandardCombineInput

    return StandardCombineInput(hidden_states=out)
