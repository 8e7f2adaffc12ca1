"""mHC pre-norm GEMM: DeepGEMM's ``tf32_hc_prenorm_gemm`` as one Triton kernel.

    out[s, i, j] = sum_{k in slice s} x[i, k] * fn[j, k]      (fp32 accumulate)
    sqrsum[s, i] = sum_{k in slice s} x[i, k] ** 2

x bf16 [m, K], fn fp32 [n, K] (n <= 32), out fp32 [S, m, n] (or [m, n]), sqrsum fp32
[S, m] (or [m]). Slice s follows DeepGEMM's own partition (sm90/sm100 kernels): K is
cut into 64-wide blocks, each split gets ``nb // S`` blocks and the first ``nb % S``
splits one more (a split may be empty: its partials are written as 0). Writes in
place, returns None; m == 0 returns at once (after the argument checks).

Kernel: grid (m tiles, S * P). Each program streams its K range once (x read once,
fn from L2), accumulates x @ fn^T on tensor cores and sum(x^2) on the side. When
the caller's grid is too small to fill the GPU (decode), every split is cut into P
sub-slices whose programs leave fp32 partials in a persistent workspace; the partials
of one (m tile, split) group are summed in a fixed order (deterministic) by
* R == 1: the last program to arrive (an acq_rel counter), or
* R > 1: the R programs of the group with the highest ids, RB = rows / R rows each;
  they wait (acquire loads) for the counter to reach P -- every program they wait for
  has a lower id, so was dispatched before them -- and the last of them resets it.
Counters are reset by the kernel itself, so CUDA-graph replays need no memset; still
one launch. Tile tables per m bucket come from H100 sweeps (wgmma as Triton builds for
sm_90, and mma.sync -- SM120's instruction class -- with DISABLE_MMA_V3=1);
``legacy_config`` keeps the previous heuristic selectable through ``_config``. A
CUDA-core (FMA) variant for a few rows is selectable too (``_config={"fma": True}``);
it lost to the MMA kernel at every m in the sweeps, so no table uses it.

Precision (DSV4_HC_PRENORM_PRECISION): ``bf16x2`` (default) splits each fn tile into
bf16 hi + lo and runs two bf16 MMAs: fn keeps 16 mantissa bits, x (bf16) is exact,
so it is at least as accurate as DeepGEMM's tf32 (10 bits) and uses the fast bf16
MMA on SM120. ``tf32`` gives DeepGEMM's own rounding class.
At large m (table field ``presplit``) the split is done once per call by a small kernel
(``_fn_split_kernel``: fn -> bf16 hi / lo planes in a persistent per-stream buffer) instead of
in every m tile, and the GEMM loads both planes as MMA operands: same numbers, 1.15-1.45x
with mma.sync at m >= 2048 (docs/hc_prenorm.md, run 7).

Compiled kernel (csrc/hc_prenorm, run 9): where Triton builds mma.sync (SM120), ``impl="auto"`` runs a
CUDA kernel from m >= 256 (>= 64 with the caller's splits, or with n = 24 and K % 32 == 0, DeepSeek-V4's
shape, run 14): fn as the MMA's A operand ([hi | lo] bf16 rows, the same bf16x2 numbers), x loaded
straight from global memory as the B operand, 1.4-1.9x the mma.sync Triton kernel at m >= 256 on the
H100 (1.5x at m = 64 with DeepSeek-V4's shape, run 14). ``impl`` / env DSV4_HC_PRENORM_IMPL picks a
kernel (pick_impl); cases it does not take go to the Triton kernel under "auto".

Few-rows kernel (csrc/hc_prenorm/kernel_small.cuh, runs 16-17): decode calls (m <= 64) on every GPU kind: fp32
FMA, one block per (256-wide split or sub-slice, 1-16 rows) (``small_rows``, ``small_sub_splits``), two blocks
per SM, the loads of a round issued at once; with SGLang's own 64 splits no workspace and no second grid. H100
with SGLang's splits (run 17): m = 1 / 8 / 16 / 32 / 64 in 2.2 / 2.7 / 3.4 / 4.0 / 5.1 us (Triton 4.6 / 5.1 / 5.4 /
7.1 / 8.4; the Triton FMA variant above had one program per 16-row tile and split and lost to its MMA kernel).
With num_splits None (one wide split) it runs 64 sub-slices whose partials are summed by the exchange inside its
own launch at m = 3-8 (run 18: tagged partials, the row block's last block to start sums them; 3.7 / 4.5 us at
m = 4 / 8), by a second (reduce) grid from m = 9 (``decode_rows``, ``exchange_enabled``). At m <= 2 with one split
the whole-K kernel (run 19: one 1024-thread block per fn row over all of K, no partials; 2.55 / 2.97 us at m = 1 /
2) takes the call instead (``fnrow_enabled``).

Atomic sum (run 21, ``atomic_enabled`` / ``atomic_applies``): by default the sub-slices of num_splits None (the
few-rows kernel from m = 3, the MMA kernel's kFast instance with 16-row tiles from m = 16 for DeepSeek-V4's shape
since run 22, with 64-row tiles from m = 129) are not summed by the exchange or a reduce grid: a zero kernel
clears the caller's out / sqrsum, then every block adds its sums with float4 atomics (H100, run 21, num_splits None:
m = 4 / 8 / 16 / 32 / 63 in 3.2 / 3.6 / 4.2 / 4.7 / 6.1 us against 3.7 / 4.4 / 5.1 / 5.7 / 7.2 before; m = 512 10.0
against 11.3; run 22's tiles: m = 16 / 48 / 64 3.8 / 4.4 / 4.5 us, ``mma_rows_pick``). The order of those
additions depends on timing, so the last bits of out / sqrsum may differ between two identical calls (the float64
error bound is the same). Env DSV4_HC_PRENORM_ATOMIC=0,
or SGLang's deterministic inference (``--enable-deterministic-inference``, which sets
SGLANG_ENABLE_DETERMINISTIC_INFERENCE in its workers), keeps the fixed-order sums.
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from deepseek_v4_kernel.errors import ExtensionUnavailable, UnsupportedCase
from deepseek_v4_kernel.ops._device import extension_error, on_input_device, sm_count, triton_version
from deepseek_v4_kernel.ops._workspace import scratch as _scratch
from deepseek_v4_kernel.ops._workspace import zeroed as _zeroed

OP = "hc_prenorm"
_KBLOCK = 64  # DeepGEMM's split granularity (BLOCK_K of its sm90/sm100 kernels)
_NPAD = 32  # n is padded to this many MMA columns
MAX_N = 32
_COUNTER_CAP = 4096
_SPLIT_BLOCK = 1024  # K elements per program of _fn_split_kernel
SMEM_LIMIT = 101376


# --------------------------------------------------------------------------- kernel
@triton.jit
def _dot_hi_lo(acc, xt, xf, hi, lo, INTERP: tl.constexpr):
    # acc += x @ (hi + lo) as two bf16 MMAs
    if INTERP:  # the interpreter's bf16 dot is broken; same products in fp32
        acc = tl.dot(xf, hi.to(tl.float32), acc, input_precision="ieee")
        acc = tl.dot(xf, lo.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(xt, hi, acc)
        acc = tl.dot(xt, lo, acc)
    return acc


@triton.jit
def _step(acc, sq, x_base, f_base, k0, k_hi, kk, row_ok, col_ok, stride_xk, stride_fk, f_plane,
          BF16X2: tl.constexpr, FMA: tl.constexpr, PRESPLIT: tl.constexpr, INTERP: tl.constexpr,
          SQ2D: tl.constexpr = False):
    ks = k0 + kk
    k_ok = ks < k_hi
    xt = tl.load(x_base + ks[None, :] * stride_xk,
                 mask=row_ok[:, None] & k_ok[None, :], other=0.0)
    xf = xt.to(tl.float32)
    if SQ2D:  # element-wise partial sums, reduced across threads once after the K loop
        sq += xf * xf
    else:
        sq += tl.sum(xf * xf, axis=1)
    if PRESPLIT:
        # fn already split into bf16 hi / lo planes (_fn_split_kernel, f_plane elements apart): both
        # tiles go global -> shared -> MMA operand as loaded, with no per-tile conversion
        f_mask = k_ok[:, None] & col_ok[None, :]
        hi = tl.load(f_base + ks[:, None] * stride_fk, mask=f_mask, other=0.0)
        lo = tl.load(f_base + f_plane + ks[:, None] * stride_fk, mask=f_mask, other=0.0)
        acc = _dot_hi_lo(acc, xt, xf, hi, lo, INTERP)
    elif FMA:
        # CUDA-core path for a few rows: fn tile [NP, BLOCK_K] (K contiguous, as x),
        # exact fp32 products, no shared memory, no MMA padding of the rows.
        ft = tl.load(f_base + ks[None, :] * stride_fk,
                     mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.sum(xf[:, None, :] * ft[None, :, :], axis=2)
    else:
        ft = tl.load(f_base + ks[:, None] * stride_fk,
                     mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if BF16X2:
            hi = ft.to(tl.bfloat16)
            lo = (ft - hi.to(tl.float32)).to(tl.bfloat16)
            acc = _dot_hi_lo(acc, xt, xf, hi, lo, INTERP)
        else:
            acc = tl.dot(xf, ft, acc, input_precision="tf32")
    return acc, sq


@triton.jit
def _fn_split_kernel(fn_ptr, dst_ptr, n, K, stride_fn, stride_fk,
                     BLOCK: tl.constexpr, PDL: tl.constexpr):
    # fn fp32 [n, K] -> dst bf16 [2, n, K]: hi = bf16(fn), lo = bf16(fn - hi), the same roundings as
    # the per-tile split of _step (BF16X2), done once per call instead of once per m tile
    if PDL:
        tl.extra.cuda.gdc_wait()  # fn may come from an earlier kernel
        tl.extra.cuda.gdc_launch_dependents()  # the GEMM grid may be scheduled now; it waits for us
    row = tl.program_id(1)
    ks = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = ks < K
    f = tl.load(fn_ptr + row * stride_fn + ks * stride_fk, mask=ok, other=0.0)
    hi = f.to(tl.bfloat16)
    lo = (f - hi.to(tl.float32)).to(tl.bfloat16)
    d = dst_ptr + row.to(tl.int64) * K + ks
    tl.store(d, hi, mask=ok)
    tl.store(d + n * K, lo, mask=ok)


@triton.jit
def _gather(tot, tsq, ws_ptr, wss_ptr, z0, q0, P, m, r64, r_ok, cols, col_ok,
            NP: tl.constexpr, PB: tl.constexpr):
    # PB partials x RB rows x NP columns in one load, summed over the partials
    qs = q0 + tl.arange(0, PB)
    q_ok = qs < P
    base = (z0 + qs).to(tl.int64)[:, None] * m + r64[None, :]  # [PB, RB]
    qr_ok = q_ok[:, None] & r_ok[None, :]
    t = tl.load(ws_ptr + base[:, :, None] * NP + cols[None, None, :],
                mask=qr_ok[:, :, None] & col_ok[None, None, :], other=0.0,
                cache_modifier=".cg")
    tot += tl.sum(t, axis=0)
    tsq += tl.sum(tl.load(wss_ptr + base, mask=qr_ok, other=0.0, cache_modifier=".cg"), axis=0)
    return tot, tsq


@triton.jit
def _hc_prenorm_kernel(
    x_ptr, fn_ptr, out_ptr, sq_ptr, ws_ptr, wss_ptr, cnt_ptr,
    m, n, K, S, P,
    stride_xm, stride_xk, stride_fn, stride_fk,
    stride_os, stride_om, stride_on, stride_ss, stride_sm, f_plane,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NP: tl.constexpr,
    KB: tl.constexpr, USE_WS: tl.constexpr, BF16X2: tl.constexpr, FMA: tl.constexpr,
    PRESPLIT: tl.constexpr, SQ2D: tl.constexpr,
    R: tl.constexpr, RB: tl.constexpr, PB: tl.constexpr,
    INTERP_IT: tl.constexpr, INTERP_PQ: tl.constexpr, PDL: tl.constexpr,
):
    # With the workspace (P > 1) the last R arrivals of each (m tile, split) group reduce
    # its P partials, RB = BLOCK_M // R rows each, PB partials x RB rows per load.
    # INTERP_IT / INTERP_PQ > 0 only under TRITON_INTERPRET=1: triton 3.6's interpreter
    # (numpy >= 2.3) cannot run range() with runtime bounds, so there the loops run a
    # host-computed constant trip count over the same masked body.
    if PDL:  # launched with programmatic dependent launch: x (and our counters) come from earlier kernels
        tl.extra.cuda.gdc_wait()
    pid_m = tl.program_id(0)
    pid_z = tl.program_id(1)
    s = pid_z // P
    p = pid_z % P

    # DeepGEMM's partition of the 64-wide K blocks over S splits ...
    nb = (K + KB - 1) // KB
    per = nb // S
    rem = nb % S
    b0 = s * per + tl.minimum(s, rem)
    nbs = per + (s < rem).to(tl.int32)
    # ... and our own partition of split s over its P sub-slices.
    per2 = nbs // P
    rem2 = nbs % P
    c0 = b0 + p * per2 + tl.minimum(p, rem2)
    ncs = per2 + (p < rem2).to(tl.int32)
    k_lo = c0 * KB
    k_hi = tl.minimum((c0 + ncs) * KB, K)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < m
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, NP)
    col_ok = cols < n
    kk = tl.arange(0, BLOCK_K)

    acc = tl.zeros((BLOCK_M, NP), dtype=tl.float32)
    if SQ2D:
        sq = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    else:
        sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    x_base = x_ptr + rows64[:, None] * stride_xm
    if FMA:
        f_base = fn_ptr + cols[:, None] * stride_fn
    else:
        f_base = fn_ptr + cols[None, :] * stride_fn
    if INTERP_IT > 0:
        for it in range(0, INTERP_IT):
            acc, sq = _step(acc, sq, x_base, f_base, k_lo + it * BLOCK_K, k_hi, kk, row_ok,
                            col_ok, stride_xk, stride_fk, f_plane, BF16X2, FMA, PRESPLIT, True, SQ2D)
    else:
        for k0 in range(k_lo, k_hi, BLOCK_K):
            acc, sq = _step(acc, sq, x_base, f_base, k0, k_hi, kk, row_ok, col_ok,
                            stride_xk, stride_fk, f_plane, BF16X2, FMA, PRESPLIT, False, SQ2D)

    if SQ2D:
        sq = tl.sum(sq, axis=1)
    o_mask = row_ok[:, None] & col_ok[None, :]
    if USE_WS:
        # partial of (split s, sub-slice p): ws [S*P, m, NP], wss [S*P, m]
        w_ptrs = ws_ptr + (pid_z.to(tl.int64) * m + rows64[:, None]) * NP + cols[None, :]
        tl.store(w_ptrs, acc, mask=o_mask)
        tl.store(wss_ptr + pid_z.to(tl.int64) * m + rows64, sq, mask=row_ok)
        tl.debug_barrier()
        # two int32 per group: arrivals, finished reducers
        c_ptr = cnt_ptr + 2 * (pid_m * S + s)
        old = tl.atomic_add(c_ptr, 1, sem="acq_rel", scope="gpu")
        if R == 1:
            is_red = old == P - 1  # the last arrival reduces (j = 0)
        else:
            # the R sub-slices with the highest program ids reduce, row chunk j each:
            # they wait for the rest of the group, whose ids are all lower, so those
            # were dispatched before them (the CUTLASS stream-K fix-up argument).
            is_red = p >= P - R
        if is_red:
            j = 0
            if R > 1:
                j = p - (P - R)
                cur = old + 1
                while cur < P:
                    cur = tl.atomic_add(c_ptr, 0, sem="acquire", scope="gpu")
            z0 = s * P
            r0 = pid_m * BLOCK_M + j * RB
            if r0 < m:
                r = r0 + tl.arange(0, RB)
                r_ok = r < m
                r64 = r.to(tl.int64)
                tot = tl.zeros((RB, NP), dtype=tl.float32)
                tsq = tl.zeros((RB,), dtype=tl.float32)
                if INTERP_PQ > 0:
                    for qi in range(0, INTERP_PQ):
                        tot, tsq = _gather(tot, tsq, ws_ptr, wss_ptr, z0, qi * PB, P, m, r64,
                                           r_ok, cols, col_ok, NP, PB)
                else:
                    for q0 in range(0, P, PB):  # fixed order: deterministic
                        tot, tsq = _gather(tot, tsq, ws_ptr, wss_ptr, z0, q0, P, m, r64,
                                           r_ok, cols, col_ok, NP, PB)
                tl.store(out_ptr + s * stride_os + r64[:, None] * stride_om
                         + cols[None, :] * stride_on, tot,
                         mask=r_ok[:, None] & col_ok[None, :])
                tl.store(sq_ptr + s * stride_ss + r64 * stride_sm, tsq, mask=r_ok)
            # reset the counters for the next launch / graph replay (no memset needed)
            if R > 1:
                done = tl.atomic_add(c_ptr + 1, 1, sem="acq_rel", scope="gpu")
                if done == R - 1:  # every reducer has stopped reading the arrivals
                    tl.atomic_xchg(c_ptr + 1, 0, sem="relaxed", scope="gpu")
                    tl.atomic_xchg(c_ptr, 0, sem="relaxed", scope="gpu")
            else:
                tl.atomic_xchg(c_ptr, 0, sem="relaxed", scope="gpu")
    else:
        o_ptrs = out_ptr + s * stride_os + rows64[:, None] * stride_om + cols[None, :] * stride_on
        tl.store(o_ptrs, acc, mask=o_mask)
        tl.store(sq_ptr + s * stride_ss + rows64 * stride_sm, sq, mask=row_ok)


# --------------------------------------------------------------------------- host side
def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _fail(arg: str, expected: str, got) -> UnsupportedCase:
    return UnsupportedCase(f"{OP}: {arg} must be {expected}, got {got}")


def _desc(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{str(t.dtype).replace('torch.', '')} {list(t.shape)} on {t.device}"


_COUNTERS: dict = {}
_WORKSPACES: dict = {}
last_compiled = None  # CompiledKernel of the latest launch (tests read its metadata)


def _counters(device: torch.device):
    """Zeroed int32 counters, one set per (device, stream). The kernel resets every
    counter it uses, so the set stays zero between launches and graph replays.
    Returns None while a graph is being captured and no set exists yet (it cannot
    be zeroed eagerly then); the caller then uses the workspace-free kernel."""
    return _zeroed(_COUNTERS, device, _COUNTER_CAP, torch.int32)


# The few-rows kernel's exchange buffer (csrc/hc_prenorm/params.h DSV4_HC_PRENORM_XCHG_*): uint32 epochs [64],
# uint32 tickets [64], then uint64 tagged partials [64 rows][64 sub-slices][25]; one per (device, stream), zeroed
# once and then kept consistent by the kernel (kernel_small.cuh xchg_consume), so graph replays need no memset.
_XCHG: dict = {}
_XCHG_BYTES = 512 + 64 * 64 * 25 * 8
XCHG_MAX_M = 64        # DSV4_HC_PRENORM_XCHG_ROWS


def _exchange(device: torch.device):
    """The zeroed exchange buffer of (device, current stream), or None while a graph is being captured and
    none exists yet (it cannot be zeroed eagerly then): the call then takes the reduce grid instead (the same
    sum order, so the same bits)."""
    return _zeroed(_XCHG, device, _XCHG_BYTES // 8, torch.int64)


XCHG_AUTO_MAX_M = 8    # rows up to which the exchange (with one row per block) beats the reduce grid: its summing
                       # block reads R x 64 x 25 words alone (H100 run 18)


def exchange_enabled(m: int, _config=None) -> bool:
    """Whether num_splits None's sub-slices (few-rows kernel) are summed inside the kernel's launch (the exchange;
    then with one row per block unless ``small_rows`` is forced) rather than by a second (reduce) grid:
    ``_config["xchg"]`` if given; else never with env DSV4_HC_PRENORM_XCHG=0; else for m <= XCHG_AUTO_MAX_M."""
    if _config is not None and "xchg" in _config:
        return bool(_config["xchg"])
    return os.environ.get("DSV4_HC_PRENORM_XCHG", "1") != "0" and m <= XCHG_AUTO_MAX_M


ATOMIC_ENV = "DSV4_HC_PRENORM_ATOMIC"
# set by SGLang from its --enable-deterministic-inference
SGLANG_DETERMINISTIC_ENV = "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"


def deterministic_sums() -> bool:
    """Whether the fixed-order sums are required: env DSV4_HC_PRENORM_ATOMIC=0, or SGLang's deterministic inference
    (its env flag, truthy as SGLang's EnvBool reads it)."""
    if os.environ.get(ATOMIC_ENV, "1") == "0":
        return True
    return os.environ.get(SGLANG_DETERMINISTIC_ENV, "").strip().lower() in ("1", "true", "yes", "y", "on")


def atomic_enabled(_config=None) -> bool:
    """Whether num_splits None's sub-slices may be summed with float atomics (``atomic_applies`` says where they can):
    ``_config["atomic"]`` if given; else not when the config forces the exchange (``xchg`` true); else unless
    ``deterministic_sums``."""
    cfg = _config or {}
    if "atomic" in cfg:
        return bool(cfg["atomic"])
    return not cfg.get("xchg") and not deterministic_sums()


def atomic_applies(out2, m: int, K: int, n: int, S: int, P: int, R: int, rows: int = 0) -> bool:
    """Whether the atomic sum can take a call (csrc/api.cu atomic_sum): sub-slices (P > 1) of one split, n = 24, out
    [m, 24] with unit n stride, an m stride that keeps float4 rows aligned and a 16-byte aligned base; the MMA kernel
    (R = 0) only as its kFast instance (m >= its ``rows`` per block, 64 when 0; K % 32 == 0, out rows contiguous)."""
    if not (P > 1 and S == 1 and n == _CUDA_MAX_N and out2.stride(-1) == 1 and out2.stride(-2) % 4 == 0
            and out2.data_ptr() % 16 == 0):
        return False
    return R > 0 or (m >= (rows or _CUDA_ROWS) and K % _CUDA_CHUNK == 0 and out2.stride(-2) == _CUDA_MAX_N)


def _workspace(device: torch.device, numel: int, dtype=torch.float32) -> torch.Tensor:
    """Scratch (fp32 partials; bf16 for the pre-split fn planes), persistent per (device, stream, dtype)
    and grown in powers of two outside graph capture (ops/_workspace.scratch)."""
    return _scratch(_WORKSPACES, device, numel, dtype)


# Tile tables for S = 1 on a 132-SM H100, by m bucket: (m_max, config). ``p`` is the
# number of K sub-slices per split (scaled by num_sms / 132 and divided by S, capped so
# there are at most ``ppsm`` (default 16) programs per SM), ``r`` the most reducers per
# (m tile, split) (fewer where each would read < 16 KiB of partials).
# Each entry is the fastest config of an H100 sweep (every config checked against the
# float64 reference first); docs/hc_prenorm.md and docs/hc_prenorm_runs/ have the numbers.
# ``p="fill"`` (large m): about one program per SM, S * p = round(num_sms / m tiles) in [2, 16]
# (run 7: at m = 4096 a fixed p = 2 left half the H100 idle, 223 vs 86 us with mma.sync; p = 1
# was 2-3x slower than p = 2 at every large m). ``presplit``: fn is split into bf16 hi / lo
# planes by _fn_split_kernel first (run 7: 1.15-1.45x with mma.sync at m >= 2048, slower below
# 1024 where the extra launch and L2 traffic are not paid back). ``sq2d``: the square-sum is kept
# element-wise [BLOCK_M, BLOCK_K] in the K loop and reduced across threads once after it, not every
# step (run 7 A/B: 3.7-5 % with mma.sync at m >= 2048, 1-2 % natively, nothing at 512; 128 -> 140
# registers for BLOCK_M 128 / 8 warps on sm_120a).
# "wgmma": what Triton builds for sm_90 (run 3 sweep); "mma": mma.sync, the instruction
# class SM120 has (sm_90 with DISABLE_MMA_V3=1, run 4 sweep), used for every other GPU.
_MMA_CFG = dict(fma=False, block_k=64, num_warps=4)
_TABLES = {
    "wgmma": [
        (1, dict(_MMA_CFG, block_m=16, p=128, r=1, num_stages=3)),
        (4, dict(_MMA_CFG, block_m=16, p=256, r=4, num_stages=2)),
        (8, dict(_MMA_CFG, block_m=16, p=256, r=8, num_stages=2)),
        (16, dict(_MMA_CFG, block_m=16, p=128, r=8, num_stages=2)),
        (32, dict(_MMA_CFG, block_m=32, p=128, r=16, num_stages=2)),
        (64, dict(_MMA_CFG, block_m=64, p=128, r=32, num_stages=2)),
        (128, dict(_MMA_CFG, block_m=64, p=64, r=16, num_stages=3)),
        (512, dict(_MMA_CFG, block_m=64, p=32, r=16, num_stages=3)),
        (1024, dict(_MMA_CFG, block_m=64, p=16, r=8, num_stages=3)),
        (2048, dict(_MMA_CFG, block_m=128, p=16, r=16, num_warps=8, num_stages=3)),
        (None, dict(_MMA_CFG, block_m=128, p="fill", r=1, num_warps=8, num_stages=4, presplit=True, sq2d=True)),
    ],
}
_TABLES["mma"] = [
    (1, dict(_MMA_CFG, block_m=16, p=128, r=1, num_stages=3)),
    (4, dict(_MMA_CFG, block_m=16, p=256, r=4, num_stages=3)),
    (8, dict(_MMA_CFG, block_m=16, p=128, r=8, num_stages=2)),
    (16, dict(_MMA_CFG, block_m=16, p=128, r=8, num_stages=2)),
    (32, dict(_MMA_CFG, block_m=32, p=128, r=16, num_stages=2)),
    (64, dict(_MMA_CFG, block_m=64, p=128, r=32, num_stages=2)),
    (128, dict(_MMA_CFG, block_m=64, p=64, r=16, num_stages=3)),
    (512, dict(_MMA_CFG, block_m=64, p=32, r=16, num_stages=4)),
    (1024, dict(_MMA_CFG, block_m=64, p=16, r=8, num_stages=3)),
    (2048, dict(_MMA_CFG, block_m=128, p=16, r=16, num_warps=8, num_stages=3, presplit=True, sq2d=True)),
    (None, dict(_MMA_CFG, block_m=128, p="fill", r=1, num_warps=8, num_stages=3, presplit=True, sq2d=True)),
]
_REF_SMS = 132
_REDUCER_BYTES = 16384  # partials one reducer should read at least
table_override = None  # bench only: a list like _TABLES[...], tried first


def mma_kind(device=None) -> str:
    """Which table applies: "wgmma" on sm_90 (Triton uses wgmma there unless
    DISABLE_MMA_V3 is set), "mma" (mma.sync) elsewhere, SM120 included."""
    if os.environ.get("DISABLE_MMA_V3", "0") not in ("", "0", "false", "False"):
        return "mma"
    if device is None or getattr(device, "type", "cpu") != "cuda":
        return "mma"
    return "wgmma" if _capability(device.index if device.index is not None
                                  else torch.cuda.current_device())[0] == 9 else "mma"


@functools.lru_cache(maxsize=None)
def _capability(dev_index: int):
    return torch.cuda.get_device_capability(dev_index)


def _table_entry(m: int, kind: str) -> dict:
    table = table_override or _TABLES[kind]
    for m_max, cfg in table:
        if m_max is None or m <= m_max:
            return dict(cfg)
    return dict(table[-1][1])


def legacy_config(m: int, K: int, S: int, num_sms: int) -> dict:
    """The run-2 heuristic (MMA kernel, one reducer per group), as ``_config`` overrides:
    BLOCK_M 16 for m <= 64 with P capped at 128 / 64 / 32 (m <= 4 / 16 / 64), else
    BLOCK_M 64 with P capped at 16 (<= 16 m tiles) or 2; ~2 programs per SM."""
    bm = 16 if m <= 64 else 64
    m_tiles = triton.cdiv(m, bm)
    groups = m_tiles * S
    nb_min = triton.cdiv(K, _KBLOCK) // S
    p = 1
    if groups < 2 * num_sms and nb_min >= 2 and 2 * groups <= _COUNTER_CAP:
        if bm <= 16:
            cap = 128 if m <= 4 else (64 if m <= 16 else 32)
        else:
            cap = 16 if m_tiles <= 16 else 2
        p = min(triton.cdiv(2 * num_sms, groups), cap, nb_min)
    return dict(fma=False, block_m=bm, block_k=64, p=max(1, p), r=1, num_warps=4,
                num_stages=3)


# Triton versions whose wgmma build of the presplit kernel (sm_90 natively: both fn planes loaded as MMA operands, two
# async wgmma per K step) gives the same bits on every call. H100 run 62 (docs/hc_prenorm.md), scripts/stress_hc_prenorm.py,
# every call on fresh inputs after poisoning the workspaces, each repeated: triton 3.6.0, no pair of 779 per config
# differed; triton 3.8.0 (SGLang 0.5.23's) the presplit configs differed on 97-100 % of the pairs (m = 512 forced
# presplit, m = 4096 / 8192 the table's) with ~8x the usual error (0.09 of the tests' bound against 0.012), the others on
# none; the mma.sync builds (DISABLE_MMA_V3=1, SM120's instruction class) on none under either. So where Triton builds
# wgmma and is newer than the last version checked, fn is split per tile instead (the same numbers; presplit's gain,
# run 7, was measured on mma.sync builds). Run 63: triton 3.9.0 the same (gate lifted for the run: the three presplit
# cases differed on every one of 516 pairs each, up to 0.12 of the bound).
PRESPLIT_WGMMA_MAX_TRITON = (3, 6)


def presplit_allowed(kind: str) -> bool:
    """Whether the ``presplit`` table field may apply: always for mma.sync builds (SM120), for wgmma builds only up
    to PRESPLIT_WGMMA_MAX_TRITON (see there)."""
    return kind != "wgmma" or triton_version() <= PRESPLIT_WGMMA_MAX_TRITON


def choose_config(m: int, K: int, S: int, num_sms: int, overrides: dict | None = None,
                  kind: str = "mma") -> dict:
    """Kernel variant, tile shape, sub-split count P and reducer count R for one call
    (host-side, shape-only). ``kind`` picks the table (``mma_kind``). ``overrides``
    (bench sweeps, tests) replaces table fields; an explicit ``p`` or ``r`` there is
    used as is (clamped to the split's block count / P / the tile's rows). ``presplit``, from the
    table or the overrides, holds only where ``presplit_allowed(kind)``."""
    o = overrides or {}
    cfg = _table_entry(m, kind)
    ppsm = cfg.pop("ppsm", 16)
    cfg.update({k: v for k, v in o.items() if k in ("fma", "block_m", "block_k", "r", "pb", "gel",
                                                    "num_warps", "num_stages", "presplit", "sq2d")})
    bm = cfg["block_m"]
    m_tiles = triton.cdiv(m, bm)
    groups = m_tiles * S
    nb_min = triton.cdiv(K, _KBLOCK) // S  # blocks in the smallest split
    if "p" in o and o["p"] != "fill":
        p = o["p"]
    elif cfg["p"] == "fill" or o.get("p") == "fill":
        total = min(16, max(2, round(num_sms / m_tiles)))  # K pieces per m tile, caller's splits included
        p = max(1, min(round(total / S), triton.cdiv(ppsm * num_sms, groups)))
    else:
        p_cap = max(1, cfg["p"] * num_sms // _REF_SMS)
        p = min(triton.cdiv(p_cap, S), triton.cdiv(ppsm * num_sms, groups))
    if 2 * groups > _COUNTER_CAP:
        p = 1
    p = max(1, min(p, max(nb_min, 1)))
    rows_t = min(bm, triton.next_power_of_2(m))  # rows of a tile that can exist
    r = cfg.get("r", 1)
    if "r" not in o:  # no more reducers than needed for ~16 KiB of partials each
        r = min(r, triton.next_power_of_2(triton.cdiv(p * rows_t * _NPAD * 4, _REDUCER_BYTES)))
    r = max(1, min(r, p, rows_t))
    r = 1 << (r.bit_length() - 1)  # power of two: RB = rows_t // r
    while r > 1 and r * groups > num_sms:  # waiting reducers: at most one per SM
        r //= 2
    cfg.update(p=p, r=r, rb=rows_t // r, pb=cfg.get("pb"))
    cfg.setdefault("num_stages", 3)
    cfg["presplit"] = bool(cfg.get("presplit", False)) and not cfg["fma"] and presplit_allowed(kind)
    cfg["sq2d"] = bool(cfg.get("sq2d", False))
    return cfg


def _use_pdl(dev) -> bool:
    """Programmatic dependent launch (cc >= 9; DSV4_HC_PRENORM_PDL=0: off): the grid may be scheduled
    while the previous kernel of the stream finishes and waits in griddepcontrol.wait before any load,
    which hides part of the launch latency that dominates at decode sizes."""
    if os.environ.get("DSV4_HC_PRENORM_PDL", "1") == "0" or dev.type != "cuda" or _interpret():
        return False
    return _capability(dev.index if dev.index is not None else torch.cuda.current_device())[0] >= 9


def _precision() -> bool:
    v = os.environ.get("DSV4_HC_PRENORM_PRECISION", "bf16x2").lower()
    if v not in ("bf16x2", "tf32"):
        raise UnsupportedCase(f"{OP}: DSV4_HC_PRENORM_PRECISION must be bf16x2 or tf32, got {v!r}")
    return v == "bf16x2"


def _check(x, fn, out, sqrsum, num_splits):
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != 2:
        raise _fail("x", "bf16 [m, K]", _desc(x))
    m, K = x.shape
    if K == 0:
        raise _fail("x", "bf16 [m, K] with K > 0", _desc(x))
    if not isinstance(fn, torch.Tensor) or fn.dtype != torch.float32 or fn.dim() != 2 \
            or fn.shape[1] != K or not (1 <= fn.shape[0] <= MAX_N):
        raise _fail("fn", f"float32 [n, {K}] with 1 <= n <= {MAX_N}", _desc(fn))
    n = fn.shape[0]
    if num_splits is not None and (isinstance(num_splits, bool) or not isinstance(num_splits, int)
                                   or num_splits < 1):
        raise _fail("num_splits", "None or an int >= 1", repr(num_splits))
    S = 1 if num_splits is None else num_splits
    if not isinstance(out, torch.Tensor) or out.dtype != torch.float32:
        raise _fail("out", "float32", _desc(out))
    if S == 1 and out.dim() == 2:
        ok = tuple(out.shape) == (m, n)
    else:
        ok = out.dim() == 3 and tuple(out.shape) == (S, m, n)
    if not ok:
        exp = f"float32 [{S}, {m}, {n}]" + (f" or [{m}, {n}]" if S == 1 else "")
        raise _fail("out", exp, _desc(out))
    if not isinstance(sqrsum, torch.Tensor) or sqrsum.dtype != torch.float32:
        raise _fail("sqrsum", "float32", _desc(sqrsum))
    if S == 1 and sqrsum.dim() == 1:
        ok = tuple(sqrsum.shape) == (m,)
    else:
        ok = sqrsum.dim() == 2 and tuple(sqrsum.shape) == (S, m)
    if not ok:
        exp = f"float32 [{S}, {m}]" + (f" or [{m}]" if S == 1 else "")
        raise _fail("sqrsum", exp, _desc(sqrsum))
    dev = x.device
    for name, t in (("fn", fn), ("out", out), ("sqrsum", sqrsum)):
        if t.device != dev:
            raise _fail(name, f"on {dev} (same device as x)", _desc(t))
    if dev.type != "cuda" and not _interpret():
        raise _fail("x", "a CUDA tensor (CPU only under TRITON_INTERPRET=1)", _desc(x))
    return m, K, n, S


# --------------------------------------------------------------------------- compiled path
# csrc/hc_prenorm: fn as the MMA's A operand ([hi | lo] rows: three m16 tiles at n = 24), x as the B
# operand straight from global memory, 64 x rows x one K sub-slice per block, one block per SM.
IMPLS = ("auto", "triton", "cuda")
# auto, where Triton builds mma.sync (SM120; sm_90 under DISABLE_MMA_V3): the compiled kernel from
# CUDA_MIN_M rows, or from CUDA_MIN_M_SPLIT when the caller splits K itself (num_splits >= 2: no hand-off
# between blocks) or the call has DeepSeek-V4's shape (n = 24, K % 32 == 0: the kFast kernel, whose
# sub-slice partials a separate reduce grid sums; H100 run 14: 6.7 / 7.1 / 8.1 us at m = 64 / 128 / 256
# with num_splits None, Triton mma.sync 10.0 / - / 14.6); below that the Triton tables (H100 run 9,
# docs/hc_prenorm.md). Where Triton builds wgmma (sm_90, not a target) its kernel stays the default (run 9:
# faster than the compiled one at m >= 8192 and m <= 256 there; since run 14 the compiled kernel is the
# faster one there too from m = 64 to 8192 with DeepSeek-V4's shape, equal at 16384).
# The few-rows kernel (small_applies: m <= SMALL_MAX_M with the caller's narrow splits) comes first, on every
# kind: it uses no tensor cores, so Triton's instruction class does not matter to it.
CUDA_MIN_M = 256
CUDA_MIN_M_SPLIT = 64
_CUDA_AUTO_SUB = 32   # most sub-slices auto picks (H100 run 9 sweep: the last block's sum of P partials
                      # costs more than the extra blocks gain beyond ~32; run 14, reduce grid: P = 32 is
                      # the best point at m = 128-256, 4 % off P = 64 at m = 64)
_CUDA_AUTO_SUB_ATOMIC = 48   # the same with the atomic sum (no partials to sum). H100 run 21, num_splits None, m = 64 /
                             # 96 / 128: P = 48 5.35 / 5.66 / 5.96 us, P = 32 5.67 / 5.93 / 6.21, P = 64 5.55 / 5.85 /
                             # 6.20 (call 7); the rule with 48 against 32, m = 64-192: 4-6 % faster (call 8)
_CUDA_ROWS = 64       # x rows per block (hcp::kRows)
_CUDA_CHUNK = 32      # K per warp step (hcp::kChunk); the kFast kernel needs whole chunks
_CUDA_MAX_N = 24      # DSV4_HC_PRENORM_MAX_N
_CUDA_MAX_SUB = 64    # DSV4_HC_PRENORM_MAX_SUB
_CUDA_OUT = _CUDA_ROWS * _CUDA_MAX_N + _CUDA_ROWS   # floats of one block partial (hcp::kOut)


def cuda_unsupported(x, fn, S: int):
    """Why the compiled kernel cannot take this call (None when it can); the Triton kernel takes every
    case this names."""
    if _interpret() or x.device.type != "cuda":
        return "needs a CUDA device"
    if not _precision():
        return "DSV4_HC_PRENORM_PRECISION=tf32 (the compiled kernel computes bf16x2)"
    K = x.shape[1]
    if fn.shape[0] > _CUDA_MAX_N:
        return f"fn has {fn.shape[0]} rows (at most {_CUDA_MAX_N})"
    if K % 8:
        return f"K = {K} is not a multiple of 8"
    if x.stride(1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        return f"x rows must be 16-byte aligned with unit stride along K (strides {tuple(x.stride())})"
    if fn.stride(1) != 1 or fn.stride(0) % 4 or fn.data_ptr() % 16:
        return f"fn rows must be 16-byte aligned with unit stride along K (strides {tuple(fn.stride())})"
    if S > 65535:
        return f"num_splits = {S} > 65535"
    from deepseek_v4_kernel._ext import has_hc_prenorm
    if not has_hc_prenorm():
        return "the CUDA extension (_C.so with the hc_prenorm kernel) does not load"
    return extension_error(x.device)


# The few-rows kernel (csrc/hc_prenorm/kernel_small.cuh: fp32 FMA, one block per (split or sub-slice, R rows),
# no shared memory, one or two rounds of loads per 256 K values, two blocks per SM): decode calls,
# m <= SMALL_MAX_M. SGLang's own splits (64 at m <= 64) are 256 wide: one block each. One wide split (num_splits
# None: SGLang's hc_pre DeepGEMM branch, docs/hc_prenorm.md section 5) is cut into P sub-slices of <= 256 whose
# partials the exchange (m <= XCHG_AUTO_MAX_M) or a second small grid sums (n = 24 only, the reduce grid's
# layout); other splits of up to SMALL_MAX_SPLIT_K take more rounds.
SMALL_MAX_M = 64
SMALL_SUB_MAX_M = 63   # with sub-slices: at m = 64 the MMA kernel's 64-row tile is faster (H100, num_splits None:
                       # 6.7 vs 7.9-8.3 us in run 16; run 17: 6.8 at m = 64 against the few-rows kernel's 7.1 at 63)
SMALL_MAX_SPLIT_K = 1024
_SMALL_SUB_K = 256
_SMALL_ROWS = (1, 2, 4, 8, 16)   # kernel_small.cuh instances (DSV4_HC_PRENORM_SMALL_MAX_ROWS = 16)
_SMALL_BLOCKS_PER_SM = 2         # kernel_small.cuh kMinBlocksPerSm: every instance's launch bounds
_SMALL_MAX_K = 1 << 30           # api.cu: the kernel's K arithmetic is 32-bit


def small_sub_splits(K: int, S: int, n: int) -> int:
    """P, the sub-slices per caller split of the few-rows kernel (1: none), or 0 where it does not apply."""
    longest = triton.cdiv(triton.cdiv(K, _KBLOCK), S) * _KBLOCK   # K of the widest split
    if longest <= _SMALL_SUB_K:
        return 1
    if n == _CUDA_MAX_N and S == 1:   # (the launcher runs the P sub-slices as P splits: one caller split only)
        P = min(_CUDA_MAX_SUB, triton.cdiv(longest, _SMALL_SUB_K))
        if triton.cdiv(longest // _KBLOCK, P) * _KBLOCK <= SMALL_MAX_SPLIT_K:
            return P
    return 1 if longest <= SMALL_MAX_SPLIT_K else 0


def small_applies(m: int, K: int, S: int, n: int) -> bool:
    """Whether the few-rows kernel takes m rows of K, n fn rows and the caller's S splits (shape only)."""
    P = small_sub_splits(K, S, n)
    return 1 <= m <= (SMALL_MAX_M if P == 1 else SMALL_SUB_MAX_M) and P > 0 and K < _SMALL_MAX_K


def small_rows(m: int, K: int, S: int, num_sms: int, n: int = _CUDA_MAX_N) -> int:
    """R, x rows per block of the few-rows kernel (0: it does not apply): the fewest rows per block whose grid
    (S P x ceil(m / R)) still fits one wave of two blocks per SM, else 16. More rows per block do more work per
    load but leave SMs idle; a second wave costs about as much as the first (H100 run 17, SGLang's 64 splits:
    m = 32 R = 8 4.0 us, R = 4 (two waves) 5.8, R = 16 4.2; m = 8 R = 2 2.8, R = 1 3.2, R = 4 3.1)."""
    if not small_applies(m, K, S, n):
        return 0
    blocks = S * small_sub_splits(K, S, n)
    for r in _SMALL_ROWS:
        if blocks * triton.cdiv(m, r) <= _SMALL_BLOCKS_PER_SM * num_sms:
            return r
    return _SMALL_ROWS[-1]


# The whole-K kernel (kernel_small.cuh hc_prenorm_fnrow_kernel): one 1024-thread block per fn row streams the row
# and the m <= FNROW_MAX_M x rows over all of K, so one split needs no cross-block sum (run 19).
FNROW_MAX_M = 2        # DSV4_HC_PRENORM_FNROW_MAX_M
FNROW_AUTO_MAX_M = 2   # rows up to which "auto" takes it (H100 run 19: m = 1 / 2 2.55 / 2.97 us against the
                       # exchange's 3.27 / 3.45; m = 3 / 4 instances, since removed, 4.2 / 4.7 against 3.7)


def fnrow_applies(m: int, K: int, S: int, n: int) -> bool:
    """Whether the whole-K kernel can take the call (shape only): 1 <= m <= FNROW_MAX_M, one split, n <= 24."""
    return 1 <= m <= FNROW_MAX_M and S == 1 and 1 <= n <= _CUDA_MAX_N and K < _SMALL_MAX_K


def fnrow_enabled(m: int, K: int, S: int, n: int, _config=None) -> bool:
    """Whether a call goes to the whole-K kernel: ``_config["fnrow"]`` if given; else not when the config picks
    another path (``small_rows``, ``p``, ``xchg``, ``atomic`` true, ``mma_rows`` 16 / 32 / 64) or env
    DSV4_HC_PRENORM_FNROW=0; else where the few-rows kernel would take the call with one split at m <=
    FNROW_AUTO_MAX_M (H100 run 21: at m = 1 it beats the atomic sum too, 2.55 against 2.82 us)."""
    cfg = _config or {}
    if "fnrow" in cfg:
        return bool(cfg["fnrow"])
    if ({"small_rows", "p", "xchg"} & set(cfg) or cfg.get("atomic") or cfg.get("mma_rows")
            or os.environ.get("DSV4_HC_PRENORM_FNROW", "1") == "0"):
        return False
    return m <= FNROW_AUTO_MAX_M and fnrow_applies(m, K, S, n) and small_applies(m, K, S, n)


def decode_rows(m: int, K: int, S: int, num_sms: int, n: int = _CUDA_MAX_N, xchg: bool = True) -> int:
    """R of a call the few-rows kernel takes (0: it does not): small_rows, except one row per block where the
    sub-slices are summed by the exchange at m <= XCHG_AUTO_MAX_M (its summing block reads R x 64 x 25 words;
    H100 run 18: m = 8 in 4.5 us with R = 1, 4.75 with the rule's R = 2)."""
    R = small_rows(m, K, S, num_sms, n)
    if R and xchg and m <= XCHG_AUTO_MAX_M and small_sub_splits(K, S, n) > 1:
        return 1
    return R


def cuda_sub_splits(m: int, K: int, S: int, num_sms: int, atomic: bool = False) -> int:
    """P, the K sub-slices per caller split of the compiled kernel: as many blocks as fit one wave (it
    holds one block per SM; H100 sweep, run 9: a second partial wave costs as much as the first), at most
    _CUDA_AUTO_SUB, or _CUDA_AUTO_SUB_ATOMIC where the sub-slices are added by atomics (``atomic``).
    P = 1 once the caller's grid (m tiles x S) fills three quarters of the SMs."""
    groups = triton.cdiv(m, _CUDA_ROWS) * S
    nb_min = triton.cdiv(K, _KBLOCK) // S  # 64-blocks of the smallest split
    if 4 * groups >= 3 * num_sms or nb_min < 2 or groups > _COUNTER_CAP:
        return 1
    return max(1, min(_CUDA_AUTO_SUB_ATOMIC if atomic else _CUDA_AUTO_SUB, num_sms // groups, nb_min))


# The MMA kernel with 16 or 32 x rows per block (kernel.cuh kR < 64, two blocks per SM; params mma_rows): at decode
# sizes the 64-row tile leaves most SMs idle or makes each block stream long K ranges, and the few-rows kernel spends
# ~600 FMA-class instructions per thread where the MMA does the same work in a few dozen (H100 run 22,
# docs/hc_prenorm.md). kFast shapes only: n = 24, K % 32 == 0.
MMA_ROWS = (16, 32)          # kernel.cuh instances below kRows = 64 (hc_prenorm.cu launch_fast)
MMA_ROWS_NONE_MAX_M = 128    # one split (num_splits None): 16-row tiles for m = 16 .. this (run 22: m = 160-512 within
                             # +-3 % of the 64-row tile)
MMA_ROWS_SPLIT_MAX_M = 384   # the caller's splits: 16 / 32-row tiles up to this m (run 22: m = 512 2 % slower)
_MMA_ROWS_MIN_BLOCKS = 64    # the smallest grid measured to win (m = 16 with 64 splits: 3.1 against 3.4 us)


def mma_rows_sub_splits(m: int, K: int, S: int, num_sms: int, rows: int, fixed_order: bool) -> int:
    """P of the MMA kernel with ``rows`` x rows per block: 1 with the caller's splits (S >= 2); with one split the
    sub-slices that fill the GPU: 64 (one 32-wide chunk per warp) where the grid fits one block per SM, else 32 (two
    chunks per warp, loads double-buffered) within two blocks per SM, else 16; sub-slices >= 256 wide; at most
    _CUDA_AUTO_SUB where the reduce grid sums them in fixed order (``fixed_order``). H100 run 22, num_splits None,
    16 rows: m = 16 / 32 P = 64 3.76 / 4.04 us (P = 32 4.08 / 4.20); m = 48 / 64 / 96 / 128 P = 32 4.36 / 4.51 / 5.19
    / 5.34 (P = 64 4.46 / 4.56 / 6.69 / 7.05; P = 48 and 24, uneven sub-slices, slower)."""
    if S > 1:
        return 1
    tiles = triton.cdiv(m, rows)
    P = 64 if tiles * 64 <= num_sms else 32 if tiles * 32 <= 2 * num_sms else 16
    P = min(P, triton.cdiv(K, _KBLOCK) // 4, _CUDA_MAX_SUB)
    return max(1, min(P, _CUDA_AUTO_SUB) if fixed_order else P)


def _out_rows(out3) -> bool:
    """out [S, m, 24] with contiguous float4-aligned rows (the kFast kernel's stores without sub-slices)."""
    return (out3.stride(-1) == 1 and out3.stride(-2) == _CUDA_MAX_N and out3.data_ptr() % 16 == 0
            and (out3.shape[0] == 1 or out3.stride(0) % 4 == 0))


def mma_rows_pick(m: int, K: int, S: int, n: int, num_sms: int, out3, atomic: bool):
    """(rows, P) where "auto" takes the MMA kernel with 16 / 32 x rows per block, else None. One split: 16 rows at
    m = 16 .. MMA_ROWS_NONE_MAX_M, sub-slices by mma_rows_sub_splits, added by atomics where ``atomic`` and
    atomic_applies allow (contiguous out rows; float4-aligned strided rows go to the few-rows kernel's atomic sum),
    else by the reduce grid (fixed order). The caller's splits (S >= 2, each >= 256 wide): the fewest rows of
    MMA_ROWS whose grid (ceil(m / rows) x S) has at least _MMA_ROWS_MIN_BLOCKS and at most two blocks per SM, at
    m <= MMA_ROWS_SPLIT_MAX_M, out rows contiguous. H100 run 22 (SGLang's 64 splits): m = 16 / 32 / 48 / 64 3.13 /
    3.43 / 3.96 / 4.05 us against the few-rows kernel's 3.41 / 3.93 / 4.87 / 4.98; m = 128 / 256 / 384 (32 rows)
    5.28 / 6.82 / 8.37 against 5.58 / 7.06 / 8.99 (64 rows)."""
    if n != _CUDA_MAX_N or K % _CUDA_CHUNK or m < MMA_ROWS[0]:
        return None
    nb = triton.cdiv(K, _KBLOCK)
    if S == 1:
        if m > MMA_ROWS_NONE_MAX_M:
            return None
        use_atomic = atomic and atomic_applies(out3, m, K, n, 1, 2, 0, MMA_ROWS[0])
        if atomic and not use_atomic and atomic_applies(out3, m, K, n, 1, 2, 1):
            return None   # out rows float4-aligned but not contiguous: the few-rows kernel's atomic sum takes them
        P = mma_rows_sub_splits(m, K, 1, num_sms, MMA_ROWS[0], not use_atomic)
        ok = P > 1 and triton.cdiv(m, MMA_ROWS[0]) * P >= _MMA_ROWS_MIN_BLOCKS
        return (MMA_ROWS[0], P) if ok else None
    if m > MMA_ROWS_SPLIT_MAX_M or nb // S < 4 or not _out_rows(out3):
        return None
    for rows in MMA_ROWS:
        if m >= rows and _MMA_ROWS_MIN_BLOCKS <= triton.cdiv(m, rows) * S <= 2 * num_sms:
            return rows, 1
    return None


def auto_prefers_cuda(m: int, S: int, kind: str, n: int, K: int) -> bool:
    """Whether "auto" takes the compiled kernel for m rows of K, n fn rows and the caller's S splits, with
    Triton's instruction class ``kind`` (mma_kind)."""
    fast_shape = n == _CUDA_MAX_N and K % _CUDA_CHUNK == 0   # the kFast kernel's (csrc/hc_prenorm/hc_prenorm.cu)
    if small_applies(m, K, S, n):   # no tensor cores: the same on every kind
        return True
    return kind == "mma" and (m >= CUDA_MIN_M or (m >= CUDA_MIN_M_SPLIT and (S >= 2 or fast_shape)))


def pick_impl(x, fn, S: int, impl=None, _config=None) -> str:
    """"cuda" or "triton" for this call. ``impl`` (or env DSV4_HC_PRENORM_IMPL): "auto" (default) takes
    the compiled kernel where auto_prefers_cuda says so and it applies; "cuda" requires it
    (UnsupportedCase naming why not); "triton" never uses it. ``_config`` (Triton tile overrides) implies
    "triton" under "auto"."""
    impl = impl or os.environ.get("DSV4_HC_PRENORM_IMPL") or "auto"
    if impl not in IMPLS:
        raise _fail("impl", f"one of {IMPLS}", repr(impl))
    if impl == "triton" or (impl == "auto" and (_config is not None or not auto_prefers_cuda(
            x.shape[0], S, mma_kind(x.device), fn.shape[0], x.shape[1]))):
        return "triton"
    try:
        why = cuda_unsupported(x, fn, S)
    except ExtensionUnavailable as e:
        why = str(e)
    if why is None:
        return "cuda"
    if impl == "cuda":
        raise UnsupportedCase(f"{OP}: impl 'cuda' cannot take this call: {why}")
    return "triton"


def _cuda_gemm(x, fn, out3, sq2, m, K, n, S, P, R=0, xchg=False, fnrow=False, atomic=False, mma_rows=0):
    """One launch of csrc/hc_prenorm on the current stream (no host sync; the workspace and counters are
    the persistent per-stream buffers of the Triton path, sized by shapes only). ``xchg``: the few-rows
    kernel's sub-slices (R > 0, P > 1) are summed in its launch through the exchange buffer where one exists.
    ``atomic`` (P > 1, the caller checked atomic_applies): they are added into out / sqrsum after a zero kernel."""
    from deepseek_v4_kernel._ext import HcPrenormParams, load

    dev = x.device
    cnt = xbuf = None
    atomic = atomic and P > 1
    if P > 1 and not R and not atomic and mma_rows in (0, _CUDA_ROWS):   # the general 64-row MMA instance hands off
        # through counters (16 / 32-row tiles are kFast only: their partials go to the reduce grid)
        cnt = _counters(dev)
        if cnt is None:  # capturing a graph before any eager call on this stream
            P = 1
    if P > 1 and R and xchg and not atomic and m <= XCHG_MAX_M:
        xbuf = _exchange(dev)   # None: capturing before any eager call on this stream -> the reduce grid
    p = HcPrenormParams()
    p.fn_row_kernel = int(fnrow)   # the whole-K kernel (P = 1, R = 0)
    p.atomic_sum = int(atomic)     # no workspace, no counters, no exchange buffer
    if xbuf is not None:
        p.xchg = xbuf.data_ptr()
    elif P > 1 and not atomic:
        p.ws = _workspace(dev, S * triton.cdiv(m, _CUDA_ROWS) * P * _CUDA_OUT).data_ptr()
        if cnt is not None:
            p.counters = cnt.data_ptr()
    p.x, p.x_stride = x.data_ptr(), x.stride(0)
    p.fn, p.fn_stride = fn.data_ptr(), fn.stride(0)
    p.out, (p.out_stride_s, p.out_stride_m, p.out_stride_n) = out3.data_ptr(), out3.stride()
    p.sqrsum, (p.sq_stride_s, p.sq_stride_m) = sq2.data_ptr(), sq2.stride()
    p.m, p.n, p.K, p.num_splits, p.sub_splits, p.small_rows = m, n, K, S, P, R
    p.mma_rows = mma_rows
    lib = load()
    with torch.cuda.device(dev):
        rc = lib.dsv4_hc_prenorm(p, torch.cuda.current_stream(dev).cuda_stream)
    if rc != 0:
        raise RuntimeError(f"{OP}: CUDA error {rc}: {lib.dsv4_last_error().decode(errors='replace')}")
    global last_launch
    last_launch = ("cuda", P, "fnrow" if fnrow else R,
                   None if P == 1 else "atomic" if atomic else "xchg" if xbuf is not None else "reduce",
                   None if (R or fnrow) else (mma_rows or _CUDA_ROWS))


last_launch = None  # ("cuda", P, R, sum, rows) (R > 0: the few-rows kernel, "fnrow": the whole-K kernel; sum: how the
                    # P > 1 sub-slices were added: "atomic", "xchg" (the exchange) or "reduce" (the reduce grid, or the
                    # MMA kernel's last block), None for P = 1; rows: the MMA kernel's x rows per block, 16 / 32 / 64,
                    # None for the other kernels) or ("triton", cfg) of the latest call (tests, bench)


@on_input_device
def hc_prenorm_gemm(x, fn, out, sqrsum, num_splits=None, *, impl=None, _config=None):
    """In-place split-K pre-norm GEMM + square-sum (see module docstring). Returns None.

    ``impl``: "auto" / "triton" / "cuda" (pick_impl). ``_config`` (dict, optional) overrides the Triton
    tile choice (bench sweeps only); with impl "cuda" only its ``p`` (the sub-split count) and ``small_rows``
    (the few-rows kernel's rows per block; 0: the MMA kernel), ``mma_rows`` (the MMA kernel's x rows per block: 16 /
    32 / 64, or 0 for the rules without mma_rows_pick), ``xchg`` (exchange_enabled), ``atomic``
    (atomic_enabled; true is refused by name where atomic_applies does not hold) and ``fnrow`` (fnrow_enabled)
    are read."""
    m, K, n, S = _check(x, fn, out, sqrsum, num_splits)
    if m == 0:
        return None
    dev = x.device
    out3 = out if out.dim() == 3 else out.unsqueeze(0)   # both kernels take [S, m, n] / [S, m] views
    sq2 = sqrsum if sqrsum.dim() == 2 else sqrsum.unsqueeze(0)
    if pick_impl(x, fn, S, impl, _config) == "cuda":
        num_sms = sm_count(dev)
        if fnrow_enabled(m, K, S, n, _config):   # one block per fn row over the whole K: no cross-block sum
            if (not fnrow_applies(m, K, S, n) or {"small_rows", "p"} & set(_config or {})
                    or (_config or {}).get("mma_rows")):
                raise _fail("_config fnrow", f"only with m <= {FNROW_MAX_M}, one split, n <= {_CUDA_MAX_N}, K < 2^30 "
                            "and without small_rows / p / mma_rows", f"m={m} splits={S} n={n} K={K} config={_config}")
            _cuda_gemm(x, fn, out3, sq2, m, K, n, S, 1, 0, False, True)
            return None
        cfg = _config or {}
        R = cfg.get("small_rows")
        atomic = atomic_enabled(_config)
        if atomic and cfg.get("xchg"):
            raise _fail("_config atomic", "not together with xchg (one way of summing the sub-slices)", cfg)
        rows = cfg.get("mma_rows")
        if rows is not None and (rows not in (0, _CUDA_ROWS) + MMA_ROWS or (rows and (R or cfg.get("xchg")))):
            raise _fail("_config mma_rows", f"0 (the rules), {_CUDA_ROWS} or one of {MMA_ROWS} (the MMA kernel: not "
                        "with small_rows or xchg)", rows)
        pick = None
        if R is None and rows is None and not cfg.get("p") and not cfg.get("xchg"):
            pick = mma_rows_pick(m, K, S, n, num_sms, out3, atomic)
        elif rows in MMA_ROWS:   # forced: the rule's sub-slices unless p is given
            if m < rows or n != _CUDA_MAX_N or K % _CUDA_CHUNK:
                raise _fail("_config mma_rows", f"m >= {rows}, n = {_CUDA_MAX_N} and K % {_CUDA_CHUNK} == 0",
                            f"m={m} n={n} K={K}")
            fixed = not (atomic and atomic_applies(out3, m, K, n, S, 2, 0, rows))
            pick = (rows, cfg.get("p") or mma_rows_sub_splits(m, K, S, num_sms, rows, fixed))
            if not 1 <= pick[1] <= _CUDA_MAX_SUB:
                raise _fail("_config p", f"1..{_CUDA_MAX_SUB} for impl 'cuda'", pick[1])
            if pick[1] == 1 and not _out_rows(out3):
                raise _fail("_config mma_rows", "sub-slices (p > 1) or out [S, m, 24] with contiguous 16-byte aligned "
                            "rows", f"p={pick[1]} out strides {tuple(out3.stride())}")
        if pick:   # the MMA kernel with 16 / 32 rows per block, and its P
            R, (rows, P) = 0, pick
        elif R is None:   # a forced sub-split count p (or mma_rows 64) means the MMA kernel
            R = 0 if cfg.get("p") or rows == _CUDA_ROWS else small_rows(m, K, S, num_sms, n)
            P = (small_sub_splits(K, S, n) or 1) if R else 0
            if R and not (atomic and atomic_applies(out3, m, K, n, S, P, R)):   # no atomic sum: as before run 21
                R = decode_rows(m, K, S, num_sms, n, exchange_enabled(m, _config))
        elif R and (R not in _SMALL_ROWS or triton.cdiv(m, R) > 65535 or cfg.get("p") is not None):
            raise _fail("_config small_rows", f"0 or one of {_SMALL_ROWS} (without p, and ceil(m / R) <= 65535)", R)
        if R and not pick:   # forced onto a shape the rule does not take: whole splits, however wide (correct, slow)
            P = small_sub_splits(K, S, n) or 1
        elif not pick:   # the 64-row MMA kernel (P = 2 asks atomic_applies about the shape only)
            P = cfg.get("p") or cuda_sub_splits(m, K, S, num_sms, atomic and atomic_applies(out3, m, K, n, S, 2, 0))
            groups = triton.cdiv(m, _CUDA_ROWS) * S
            if not (1 <= P <= _CUDA_MAX_SUB and (P == 1 or groups <= _COUNTER_CAP)):
                raise _fail("_config p", f"1..{_CUDA_MAX_SUB} for impl 'cuda' (1 when m tiles x splits = {groups} "
                            f"> {_COUNTER_CAP} counters)", P)
        rows = 0 if R else (rows or _CUDA_ROWS)
        use_atomic = atomic and atomic_applies(out3, m, K, n, S, P, R, rows)
        if cfg.get("atomic") and not use_atomic:
            raise _fail("_config atomic", "sub-slices (P > 1) of one split, n = 24, out [m, 24] with unit n stride, "
                        "m stride % 4 == 0 and a 16-byte aligned base (the MMA kernel: m >= its rows per block, K % "
                        "32 == 0, out rows contiguous)", f"m={m} K={K} n={n} splits={S} P={P} rows={R} mma_rows={rows} "
                        f"out strides {tuple(out3.stride())}")
        _cuda_gemm(x, fn, out3, sq2, m, K, n, S, P, R, (not use_atomic) and exchange_enabled(m, _config),
                   atomic=use_atomic, mma_rows=rows)
        return None
    bf16x2 = _precision()
    num_sms = sm_count(dev) if dev.type == "cuda" else 8
    cfg = choose_config(m, K, S, num_sms, _config, mma_kind(dev))
    if not cfg["fma"] and cfg["block_m"] < 16:
        raise UnsupportedCase(f"{OP}: _config block_m must be >= 16 for the MMA kernel, got {cfg}")
    P, R, rb = cfg["p"], cfg["r"], cfg["rb"]
    if _interpret() and R > 1:  # the interpreter runs programs one by one: no waiting
        R, rb = 1, rb * R
    cnt = None
    if P > 1:
        cnt = _counters(dev)
        if cnt is None:  # capturing a graph before any eager call on this stream
            P = 1
    if P > 1:
        nws = S * P * m * _NPAD
        buf = _workspace(dev, nws + S * P * m)
        ws, wss = buf[:nws], buf[nws:]
    else:
        ws, wss, cnt = out3, sq2, sq2  # unused (USE_WS=False)
    grid = (triton.cdiv(m, cfg["block_m"]), S * P)
    pb = cfg.get("pb") or min(triton.next_power_of_2(P),
                              max(1, cfg.get("gel", 8192) // (rb * _NPAD)))
    interp_it = 0
    if _interpret():  # constant trip count: longest sub-slice / BLOCK_K
        nb = triton.cdiv(K, _KBLOCK)
        longest = triton.cdiv(triton.cdiv(nb, S), P) * _KBLOCK
        interp_it = max(1, triton.cdiv(longest, cfg["block_k"]))
    pdl = _use_pdl(dev)
    presplit = cfg["presplit"] and bf16x2  # tf32 mode multiplies fn as given
    fb, f_strides, f_plane = fn, (fn.stride(0), fn.stride(1)), 0
    if presplit:
        # one small kernel splits fn into bf16 hi / lo planes [2, n, K] (a persistent per-stream buffer,
        # so graph replays see the same address); the GEMM then loads both as MMA operands directly
        fb = _workspace(dev, 2 * n * K, torch.bfloat16)
        f_strides, f_plane = (K, 1), n * K
        _fn_split_kernel[(triton.cdiv(K, _SPLIT_BLOCK), n)](
            fn, fb, n, K, fn.stride(0), fn.stride(1), BLOCK=_SPLIT_BLOCK, PDL=pdl,
            num_warps=4, launch_pdl=pdl)
    global last_compiled, last_launch
    last_launch = ("triton", cfg)
    last_compiled = _hc_prenorm_kernel[grid](
        x, fb, out3, sq2, ws, wss, cnt,
        m, n, K, S, P,
        x.stride(0), x.stride(1), f_strides[0], f_strides[1],
        out3.stride(0), out3.stride(1), out3.stride(2), sq2.stride(0), sq2.stride(1), f_plane,
        BLOCK_M=cfg["block_m"], BLOCK_K=cfg["block_k"], NP=_NPAD, KB=_KBLOCK,
        USE_WS=P > 1, BF16X2=bf16x2, FMA=bool(cfg["fma"]), PRESPLIT=presplit, SQ2D=cfg["sq2d"],
        R=R, RB=rb, PB=pb,
        INTERP_IT=interp_it, INTERP_PQ=triton.cdiv(P, pb) if interp_it else 0, PDL=pdl,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], launch_pdl=pdl,
    )
    return None


# --------------------------------------------------------------------------- shims
def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None):
    """``deep_gemm.tf32_hc_prenorm_gemm`` (pybind: a, b, d, sqr_sum, num_splits=None).
    In place, returns None."""
    return hc_prenorm_gemm(a, b, d, sqr_sum, num_splits)


def sglang_tf32_hc_prenorm_gemm(x, fn, out, sqrsum, num_splits):
    """``sglang.srt.layers.deep_gemm_wrapper.entrypoint.tf32_hc_prenorm_gemm``
    (0.5.17 .. 0.5.23: positional ``(x, fn, out, sqrsum, num_splits)``, no default;
    returns None, m == 0 returns before any check)."""
    if x.shape[0] == 0:
        return None
    return hc_prenorm_gemm(x, fn, out, sqrsum, num_splits)


def compiled_smem(m: int = 1, K: int = 16384, num_splits=None, device="cuda", _config=None) -> int:
    """Shared memory (bytes) of the Triton kernel variant a call at this shape compiles to (the compiled
    kernel's is checked from nvcc --resource-usage, tests/test_extension_build.py)."""
    x = torch.randn(m, K, device=device).bfloat16()
    fn = torch.randn(24, K, device=device)
    S = num_splits or 1
    out = torch.empty(S, m, 24, device=device)
    sq = torch.empty(S, m, device=device)
    hc_prenorm_gemm(x, fn, out, sq, S, impl="triton", _config=_config)
    return int(last_compiled.metadata.shared)


def use_deep_gemm_hc_prenorm() -> bool:
    """Replacement for SGLang 0.5.21-0.5.23's ``sglang.kernels.ops.layernorm.mhc._use_deep_gemm_hc_prenorm``.

    SGLang's version also requires ``ENABLE_JIT_DEEPGEMM``, which is False on SM120, so the
    DeepGEMM pre-norm GEMM (ours, once patched) is never chosen there. This keeps SGLang's own
    flag and ROCm check, and asks only that ``deep_gemm`` be importable: one caller (the fused
    post/pre step, 0.5.23 mhc.py:1746, 0.5.21 / 0.5.22 mhc.py:1769) does ``import deep_gemm``
    itself, and the patch layer replaces ``deep_gemm.tf32_hc_prenorm_gemm`` when it is imported.
    Without ``deep_gemm`` the answer is False and SGLang keeps its own path: slower, never a crash.
    """
    import importlib.util

    from sglang.srt.environ import envs
    from sglang.srt.utils import is_hip

    if is_hip() or not envs.SGLANG_OPT_DEEPGEMM_HC_PRENORM.get():
        return False
    return importlib.util.find_spec("deep_gemm") is not None
