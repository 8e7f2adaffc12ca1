"""Dispatch rules of the mHC pre-norm GEMM: which kernel takes a call and with which launch shape.

Shape-only functions (no device work, CUDA-graph safe): ``pick_impl`` (compiled or Triton), the compiled kernels'
rules (``fnrow_enabled`` whole-K kernel, ``small_rows`` / ``decode_rows`` few-rows kernel, ``mma_rows_pick`` 16 / 32-row
MMA tiles, ``cuda_sub_splits`` 64-row MMA tiles, ``atomic_enabled`` / ``atomic_applies`` / ``exchange_enabled`` how
sub-slices are summed) and the Triton kernel's tile tables (``choose_config``). Every threshold states the
measurement behind it; docs/hc_prenorm.md has the design and the evidence.
"""
from __future__ import annotations

import functools
from typing import Callable, List, Tuple

import torch
import triton

from deepseek_v4_kernel.errors import ExtensionUnavailable, UnsupportedCase
from deepseek_v4_kernel.ops._device import extension_error, triton_env_flag, triton_interpret, triton_version
from deepseek_v4_kernel.ops._stats import warn_once
from deepseek_v4_kernel.switches import env_bool, env_choice

OP = "hc_prenorm"
_KBLOCK = 64  # DeepGEMM's split granularity (BLOCK_K of its sm90/sm100 kernels)
_NPAD = 32  # n is padded to this many MMA columns
MAX_N = 32
_COUNTER_CAP = 4096
_SPLIT_BLOCK = 1024  # K elements per program of _fn_split_kernel
SMEM_LIMIT = 101376


def _interpret() -> bool:
    return triton_interpret()


def _fail(arg: str, expected: str, got) -> UnsupportedCase:
    return UnsupportedCase(f"{OP}: {arg} must be {expected}, got {got}")


def _desc(t) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{str(t.dtype).replace('torch.', '')} {list(t.shape)} on {t.device}"


XCHG_MAX_M = 64        # DSV4_HC_PRENORM_XCHG_ROWS

XCHG_AUTO_MAX_M = 8    # rows up to which the exchange (with one row per block) beats the reduce grid: its summing
                       # block reads R x 64 x 25 words alone (H100)


def exchange_enabled(m: int, _config=None) -> bool:
    """Whether num_splits None's sub-slices (few-rows kernel) are summed inside the kernel's launch (the exchange;
    then with one row per block unless ``small_rows`` is forced) rather than by a second (reduce) grid:
    ``_config["xchg"]`` if given; else never with env DSV4_HC_PRENORM_XCHG=0; else for m <= XCHG_AUTO_MAX_M."""
    if _config is not None and "xchg" in _config:
        return bool(_config["xchg"])
    return env_bool("DSV4_HC_PRENORM_XCHG", True) and m <= XCHG_AUTO_MAX_M


ATOMIC_ENV = "DSV4_HC_PRENORM_ATOMIC"
# Callables that say whether the serving engine asked for deterministic results (the patch layer registers SGLang's
# --enable-deterministic-inference here; this package knows no engine).
DETERMINISTIC_SOURCES: List[Callable[[], bool]] = []


def deterministic_sums() -> bool:
    """Whether the fixed-order sums are required: env DSV4_HC_PRENORM_ATOMIC off, or a registered engine switch
    (DETERMINISTIC_SOURCES)."""
    if not env_bool(ATOMIC_ENV, True):
        return True
    return any(source() for source in DETERMINISTIC_SOURCES)


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


# Tile tables for S = 1 on a 132-SM H100, by m bucket: (m_max, config). ``p`` is the
# number of K sub-slices per split (scaled by num_sms / 132 and divided by S, capped so
# there are at most ``ppsm`` (default 16) programs per SM), ``r`` the most reducers per
# (m tile, split) (fewer where each would read < 16 KiB of partials).
# Each entry is the fastest config of an H100 sweep (every config checked against the
# float64 reference first); docs/hc_prenorm.md has the evidence.
# ``p="fill"`` (large m): about one program per SM, S * p = round(num_sms / m tiles) in [2, 16]
# (H100: at m = 4096 a fixed p = 2 left half the H100 idle, 223 vs 86 us with mma.sync; p = 1
# was 2-3x slower than p = 2 at every large m). ``presplit``: fn is split into bf16 hi / lo
# planes by _fn_split_kernel first (H100: 1.15-1.45x with mma.sync at m >= 2048, slower below
# 1024 where the extra launch and L2 traffic are not paid back). ``sq2d``: the square-sum is kept
# element-wise [BLOCK_M, BLOCK_K] in the K loop and reduced across threads once after it, not every
# step (H100 A/B: 3.7-5 % with mma.sync at m >= 2048, 1-2 % natively, nothing at 512; 128 -> 140
# registers for BLOCK_M 128 / 8 warps on sm_120a).
# "wgmma": what Triton builds for sm_90 (H100 sweep); "mma": mma.sync, the instruction
# class SM120 has (sm_90 with DISABLE_MMA_V3=1, H100 sweep), used for every other GPU.
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
    if triton_env_flag("DISABLE_MMA_V3"):
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
    """The first heuristic (MMA kernel, one reducer per group), as ``_config`` overrides:
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
# async wgmma per K step) gives the same bits on every call. H100 (docs/hc_prenorm.md), tools/stress_hc_prenorm.py,
# every call on fresh inputs after poisoning the workspaces, each repeated: triton 3.6.0, no pair of 779 per config
# differed; triton 3.8.0 (SGLang 0.5.23's) the presplit configs differed on 97-100 % of the pairs (m = 512 forced
# presplit, m = 4096 / 8192 the table's) with ~8x the usual error (0.09 of the tests' bound against 0.012), the others on
# none; the mma.sync builds (DISABLE_MMA_V3=1, SM120's instruction class) on none under either. So where Triton builds
# wgmma and is newer than the last version checked, fn is split per tile instead (the same numbers; presplit's gain,
# H100, was measured on mma.sync builds). H100: triton 3.9.0 the same (gate lifted for the run: the three presplit
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
    if not env_bool("DSV4_HC_PRENORM_PDL", True) or dev.type != "cuda" or _interpret():
        return False
    return _capability(dev.index if dev.index is not None else torch.cuda.current_device())[0] >= 9


def _precision() -> bool:
    return env_choice("DSV4_HC_PRENORM_PRECISION", ("bf16x2", "tf32"), "bf16x2") == "bf16x2"


# --------------------------------------------------------------------------- compiled path
# csrc/hc_prenorm: fn as the MMA's A operand ([hi | lo] rows: three m16 tiles at n = 24), x as the B
# operand straight from global memory, 64 x rows x one K sub-slice per block, one block per SM.
IMPLS = ("auto", "triton", "cuda")
# auto, where Triton builds mma.sync (SM120; sm_90 under DISABLE_MMA_V3): the compiled kernel from
# CUDA_MIN_M rows, or from CUDA_MIN_M_SPLIT when the caller splits K itself (num_splits >= 2: no hand-off
# between blocks) or the call has DeepSeek-V4's shape (n = 24, K % 32 == 0: the kFast kernel, whose
# sub-slice partials a separate reduce grid sums; H100: 6.7 / 7.1 / 8.1 us at m = 64 / 128 / 256
# with num_splits None, Triton mma.sync 10.0 / - / 14.6); below that the Triton tables (H100,
# docs/hc_prenorm.md). Where Triton builds wgmma (sm_90, not a target) the compiled kernels take DeepSeek-V4's
# shape from CUDA_MIN_M_SPLIT rows too (auto_prefers_cuda); other shapes keep Triton's wgmma kernel there, which
# beat the compiled one at m <= 256 and m >= 8192 on the H100.
# The few-rows kernel (small_applies: m <= SMALL_MAX_M with the caller's narrow splits) comes first, on every
# kind: it uses no tensor cores, so Triton's instruction class does not matter to it.
CUDA_MIN_M = 256
CUDA_MIN_M_SPLIT = 64
_CUDA_AUTO_SUB = 32   # most sub-slices auto picks (H100 sweep: the last block's sum of P partials
                      # costs more than the extra blocks gain beyond ~32; H100, reduce grid: P = 32 is
                      # the best point at m = 128-256, 4 % off P = 64 at m = 64)
_CUDA_AUTO_SUB_ATOMIC = 48   # the same with the atomic sum (no partials to sum). H100, num_splits None, m = 64 /
                             # 96 / 128: P = 48 5.35 / 5.66 / 5.96 us, P = 32 5.67 / 5.93 / 6.21, P = 64 5.55 / 5.85 /
                             # 6.20; the rule with 48 against 32, m = 64-192: 4-6 % faster
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
# None: SGLang's hc_pre DeepGEMM branch, docs/sglang_surface.md, hc_prenorm) is cut into P sub-slices of <= 256 whose
# partials the exchange (m <= XCHG_AUTO_MAX_M) or a second small grid sums (n = 24 only, the reduce grid's
# layout); other splits of up to SMALL_MAX_SPLIT_K take more rounds.
SMALL_MAX_M = 64
SMALL_SUB_MAX_M = 63   # with sub-slices: at m = 64 the MMA kernel's 64-row tile is faster (H100, num_splits None:
                       # 6.7 vs 7.9-8.3 us in H100; H100: 6.8 at m = 64 against the few-rows kernel's 7.1 at 63)
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
    load but leave SMs idle; a second wave costs about as much as the first (H100, SGLang's 64 splits:
    m = 32 R = 8 4.0 us, R = 4 (two waves) 5.8, R = 16 4.2; m = 8 R = 2 2.8, R = 1 3.2, R = 4 3.1)."""
    if not small_applies(m, K, S, n):
        return 0
    blocks = S * small_sub_splits(K, S, n)
    for r in _SMALL_ROWS:
        if blocks * triton.cdiv(m, r) <= _SMALL_BLOCKS_PER_SM * num_sms:
            return r
    return _SMALL_ROWS[-1]


# The whole-K kernel (kernel_small.cuh hc_prenorm_fnrow_kernel): one 1024-thread block per fn row streams the row
# and the m <= FNROW_MAX_M x rows over all of K, so one split needs no cross-block sum .
FNROW_MAX_M = 2        # DSV4_HC_PRENORM_FNROW_MAX_M
FNROW_AUTO_MAX_M = 2   # rows up to which "auto" takes it (H100: m = 1 / 2 2.55 / 2.97 us against the
                       # exchange's 3.27 / 3.45; m = 3 / 4 instances, since removed, 4.2 / 4.7 against 3.7)


def fnrow_applies(m: int, K: int, S: int, n: int) -> bool:
    """Whether the whole-K kernel can take the call (shape only): 1 <= m <= FNROW_MAX_M, one split, n <= 24."""
    return 1 <= m <= FNROW_MAX_M and S == 1 and 1 <= n <= _CUDA_MAX_N and K < _SMALL_MAX_K


def fnrow_enabled(m: int, K: int, S: int, n: int, _config=None) -> bool:
    """Whether a call goes to the whole-K kernel: ``_config["fnrow"]`` if given; else not when the config picks
    another path (``small_rows``, ``p``, ``xchg``, ``atomic`` true, ``mma_rows`` 16 / 32 / 64) or env
    DSV4_HC_PRENORM_FNROW=0; else where the few-rows kernel would take the call with one split at m <=
    FNROW_AUTO_MAX_M (H100: at m = 1 it beats the atomic sum too, 2.55 against 2.82 us)."""
    cfg = _config or {}
    if "fnrow" in cfg:
        return bool(cfg["fnrow"])
    if ({"small_rows", "p", "xchg"} & set(cfg) or cfg.get("atomic") or cfg.get("mma_rows")
            or not env_bool("DSV4_HC_PRENORM_FNROW", True)):
        return False
    return m <= FNROW_AUTO_MAX_M and fnrow_applies(m, K, S, n) and small_applies(m, K, S, n)


# fn groups (params fn_groups, kernel_small.cuh kFG): the few-rows kernel's 24 fn rows over 3 blocks of 8 or 6 of 4,
# so that a split's fn (24 KB at SGLang's 256-wide splits) leaves L2 once instead of once per row block, with all the
# split's rows in one block (R = 2 / 4 / 8). Whole splits only (P = 1: the caller's splits, SGLang's mhc_pre), plain
# stores. FN_GROUPS_RULE: (largest m, R, fn groups) in order, the first row whose m holds and whose grid (S x
# ceil(m / R) x groups) fits FN_GROUPS_MAX_BLOCKS_PER_SM blocks per SM; empty: never (the few-rows rule alone).
FN_GROUPS = (3, 6)           # kernel_small.cuh instances with kFG = 3 / 6 (hc_prenorm.cu launch_small)
FN_GROUPS_ROWS = (2, 4, 8)
# H200, SGLang's 64 splits (the few-rows kernel is FMA-only: the same in both instruction classes), us at m = 1 / 2 /
# 4 / 6 / 8: R 2 x 3 groups 2.01 / 2.39 / 2.60 / - / -, R 8 x 6 groups - / - / 2.83 / 2.84 / 2.86, against the rule
# without groups (R 1 / 1 / 1 / 2 / 2) 2.06 / 2.56 / 2.75 / 3.00 / 3.04 and SGLang 0.5.23's TileLang split-K kernel
# 3.44 / 3.46 / 3.47 / 3.50 / 3.50 (tools/sweep_hc_prenorm_small.py --mma-sync)
FN_GROUPS_RULE: Tuple[Tuple[int, int, int], ...] = ((4, 2, 3), (8, 8, 6))
FN_GROUPS_MAX_BLOCKS_PER_SM = 3


def fn_groups_pick(m: int, K: int, S: int, num_sms: int, n: int = _CUDA_MAX_N) -> Tuple[int, int]:
    """(R, fn groups) of a call the few-rows kernel runs with its fn rows over several blocks, or (0, 1): a row of
    FN_GROUPS_RULE, whole splits (P = 1) only; env DSV4_HC_PRENORM_FN_GROUPS=0 turns it off."""
    if not FN_GROUPS_RULE or not env_bool("DSV4_HC_PRENORM_FN_GROUPS", True):
        return 0, 1
    if not small_applies(m, K, S, n) or small_sub_splits(K, S, n) != 1:
        return 0, 1
    for max_m, r, groups in FN_GROUPS_RULE:
        if m <= max_m and S * triton.cdiv(m, r) * groups <= FN_GROUPS_MAX_BLOCKS_PER_SM * num_sms:
            return r, groups
    return 0, 1


def decode_rows(m: int, K: int, S: int, num_sms: int, n: int = _CUDA_MAX_N, xchg: bool = True) -> int:
    """R of a call the few-rows kernel takes (0: it does not): small_rows, except one row per block where the
    sub-slices are summed by the exchange at m <= XCHG_AUTO_MAX_M (its summing block reads R x 64 x 25 words;
    H100: m = 8 in 4.5 us with R = 1, 4.75 with the rule's R = 2)."""
    R = small_rows(m, K, S, num_sms, n)
    if R and xchg and m <= XCHG_AUTO_MAX_M and small_sub_splits(K, S, n) > 1:
        return 1
    return R


def cuda_sub_splits(m: int, K: int, S: int, num_sms: int, atomic: bool = False) -> int:
    """P, the K sub-slices per caller split of the compiled kernel: as many blocks as fit one wave (it
    holds one block per SM; H100 sweep, H100: a second partial wave costs as much as the first), at most
    _CUDA_AUTO_SUB, or _CUDA_AUTO_SUB_ATOMIC where the sub-slices are added by atomics (``atomic``).
    P = 1 once the caller's grid (m tiles x S) fills three quarters of the SMs."""
    groups = triton.cdiv(m, _CUDA_ROWS) * S
    nb_min = triton.cdiv(K, _KBLOCK) // S  # 64-blocks of the smallest split
    if 4 * groups >= 3 * num_sms or nb_min < 2 or groups > _COUNTER_CAP:
        return 1
    return max(1, min(_CUDA_AUTO_SUB_ATOMIC if atomic else _CUDA_AUTO_SUB, num_sms // groups, nb_min))


# The MMA kernel with 16 or 32 x rows per block (kernel.cuh kR < 64, two blocks per SM; params mma_rows): at decode
# sizes the 64-row tile leaves most SMs idle or makes each block stream long K ranges, and the few-rows kernel spends
# ~600 FMA-class instructions per thread where the MMA does the same work in a few dozen (H100,
# docs/hc_prenorm.md). kFast shapes only: n = 24, K % 32 == 0.
MMA_ROWS = (16, 32)          # kernel.cuh instances below kRows = 64 (hc_prenorm.cu launch_fast)
MMA_ROWS_NONE_MAX_M = 128    # one split (num_splits None): 16-row tiles for m = 16 .. this (H100: m = 160-512 within
                             # +-3 % of the 64-row tile)
MMA_ROWS_SPLIT_MAX_M = 384   # the caller's splits: 16 / 32-row tiles up to this m (H100: m = 512 2 % slower)
_MMA_ROWS_MIN_BLOCKS = 64    # the smallest grid measured to win (m = 16 with 64 splits: 3.1 against 3.4 us)


def mma_rows_sub_splits(m: int, K: int, S: int, num_sms: int, rows: int, fixed_order: bool) -> int:
    """P of the MMA kernel with ``rows`` x rows per block: 1 with the caller's splits (S >= 2); with one split the
    sub-slices that fill the GPU: 64 (one 32-wide chunk per warp) where the grid fits one block per SM, else 32 (two
    chunks per warp, loads double-buffered) within two blocks per SM, else 16; sub-slices >= 256 wide; at most
    _CUDA_AUTO_SUB where the reduce grid sums them in fixed order (``fixed_order``). H100, num_splits None,
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
    m <= MMA_ROWS_SPLIT_MAX_M, out rows contiguous. H100 (SGLang's 64 splits): m = 16 / 32 / 48 / 64 3.13 /
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
    if kind == "mma":
        return m >= CUDA_MIN_M or (m >= CUDA_MIN_M_SPLIT and (S >= 2 or fast_shape))
    # Triton's wgmma build (sm_90): DeepSeek-V4's shape runs compiled from CUDA_MIN_M_SPLIT rows as well (H200,
    # num_splits None, CUDA-graph replay: the compiled kernel 5.4-27 us against Triton's 157-208 us at m = 64-2048);
    # other shapes keep Triton's wgmma kernel, which beat the compiled one at m <= 256 and m >= 8192 on the H100.
    return fast_shape and m >= CUDA_MIN_M_SPLIT


def pick_impl(x, fn, S: int, impl=None, _config=None) -> str:
    """"cuda" or "triton" for this call. ``impl`` (or env DSV4_HC_PRENORM_IMPL): "auto" (default) takes
    the compiled kernel where auto_prefers_cuda says so and it applies; "cuda" requires it
    (UnsupportedCase naming why not); "triton" never uses it. ``_config`` (Triton tile overrides) implies
    "triton" under "auto"."""
    impl = impl or env_choice("DSV4_HC_PRENORM_IMPL", IMPLS, "auto")
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
    if not _interpret():   # (under the interpreter, on the CPU, Triton is the only choice: nothing to say)
        warn_once(OP, f"the compiled kernel cannot take a call of m = {x.shape[0]} rows ({why}): it runs the Triton "
                      f"kernel, slower at this size")
    return "triton"

