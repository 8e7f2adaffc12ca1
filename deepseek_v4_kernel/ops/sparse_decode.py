"""Sparse FP8 MLA decode for DeepSeek-V4 on SM120 (and SM90): FlashMLA ``flash_mla_with_kvcache``
with ``indices`` (fp8_ds_mla "MODEL1" cache, 584 B per token), via the C-ABI CUDA library _C.so.

Semantics (docs/sparse_decode.md): per (batch row i, query position s, head h), over the multiset of
valid main slots (index >= 0, index < num_pages*page_size, position < topk_length[i]) plus valid
extra slots:
    lse = log(sum_j exp(softmax_scale * q.K_j))           # natural log, WITHOUT attn_sink
    out = sum_j exp(score_j) V_j / (exp(lse) + exp(attn_sink[h]))   # sink only in the denominator
A row with no valid slot gives out = 0 and lse = +inf. Both conventions follow FlashMLA's own
reference (deepseek-ai/FlashMLA tests/ref.py, ``ref_sparse_attn_decode``): the sink rescales the
output after lse is computed and lse is returned unchanged; "lonely" rows get lse = +inf.

Graph-safe: no host syncs; the split-KV workspace is a persistent buffer per (device, stream), grown
in powers of two outside graph capture up to WORKSPACE_CAP (ops/_workspace); the SM count is cached
per device. q and indices may have arbitrary strides (passed to the
kernel, no copies); attn_sink ([h_q] floats) is made contiguous if it is not (tiny copy).
"""
import functools
from typing import Dict, Optional, Tuple

import torch

from ..errors import ExtensionUnavailable, UnsupportedCase
from ..switches import env_bool, env_choice
from ._stats import count
from ._device import extension_error as _extension_error
from ._device import sm_count as _sm_count  # noqa: F401  (benches/tests use sd._sm_count)
from ._workspace import scratch as _scratch

_WORKSPACES: dict = {}   # split-KV partials: fp32 [splits, b*s_q, h_q, 512] then [splits, b*s_q, h_q]
# Largest split-KV workspace kept per (device, stream), in floats (64 MiB). The decode shapes stay under it
# (main 128 + extra 512 positions, 132-188 SMs: at most 29 MiB with the current launch rule, e.g. b = 228,
# h_q 32 in two splits on 170 SMs; 40 MiB with the earlier one; tests/test_sparse_decode.py). The launch rule
# also splits some calls of hundreds of rows to fill the last wave (H100: 1.22-1.28x at b 133-160 with
# 2048 extra positions; up to ~650 MiB of partials with 10K positions); those get a per-call allocation, as
# every call did before.
WORKSPACE_CAP = 16 << 20

OP = "sparse_decode"
D = 512
TOKEN_BYTES = 584
TOK_TILE = 32          # kTokTile (kernel.cuh) = kM64Tok (kernel_mma64.cuh)
# heads per block: kHeadTile (kernel.cuh) / kMmaHeads (kernel_mma.cuh) / kM64Heads (kernel_mma64.cuh)
# ("mma64h32" / "mma64h16": the mma64 kernel with 32 / 16 heads per block, see mma64_launch)
HEAD_TILE = {"simt": 16, "mma": 32, "mma64": 64, "mma64h32": 32, "mma64h16": 16, "mma64ws": 64, "mma64wsh32": 32,
             "mma64wsh16": 16, "mma64wsh16deep": 16}
IMPL_CODE = {"simt": 0, "mma": 1, "mma64": 2, "mma64h32": 3, "mma64h16": 4, "mma64ws": 5, "mma64wsh32": 6,
             "mma64wsh16": 7, "mma64wsh16deep": 8}     # SparseDecodeParams.impl
MAX_SPLITS = 64        # DSV4_SPARSE_DECODE_MAX_SPLITS (params.h), checked at the C ABI
# Which kernel (read once at import from DSV4_SPARSE_DECODE_IMPL):
#   "auto"  (default) mma64 for every h_q; its 16 / 32-head launches and its 64-head launches with >= 4 tiles
#           per block run the warp-specialised kernel of their heads per block, "mma64ws" / "mma64wsh32" /
#           "mma64wsh16" (H100: 64 heads, 0.84-0.90x the 8-warp kernel's time; 32 / 16 heads,
#           0.83-0.97x), unless DSV4_SPARSE_DECODE_WS=0. On the H100 (docs/sparse_decode.md) mma64
#           is ~3x faster than mma at b >= 32, 1.2-2x at b = 1, and faster at h_q 16/32 too (H100,
#           b=128 h_q=16: 58.8 vs 113.5 us; 47 us since 16-head blocks compute one m16 tile). SM120
#           unmeasured: DSV4_SPARSE_DECODE_IMPL=mma is the way back.
#   "mma64" mma.sync, 64 heads/block, Q/O in registers, cp.async staging + double-buffered K/V tile;
#           16 or 32 heads/block (only those m16 tiles computed) where the cost model says so, chosen
#           together with the split count (mma64_launch)
#   "mma64h32" / "mma64h16" the same kernel with 32 / 16 heads/block for every shape (tests, comparisons)
#   "mma64ws" the warp-specialised 64-head kernel (kernel_ws.cuh: 4 S / softmax warps holding Q, 8 PV warps
#           holding O, working on consecutive tiles) for every shape, with the 64-head split count
#           ("mma64" is the launch rule with the 8-warp kernel for every launch)
#   "mma64wsh32" / "mma64wsh16" the warp-specialised kernel with 32 / 16 heads/block for every shape
#   "mma64wsh16deep" the 16-head warp-specialised kernel with the deep gather (one bf16 K/V tile, two staging areas;
#           "auto" takes it for 16-head launches from DEEP_MIN_TILES tiles per block) for every shape
#   "mma"   mma.sync, 32 heads/block
#   "simt"  the first fp32-FMA kernel
# (the switches are read once, at import: a value the parser refuses makes the import fail with a message naming the
# variable, and the patch layer then leaves SGLang's own code in place and reports why)
IMPL = env_choice("DSV4_SPARSE_DECODE_IMPL", tuple(HEAD_TILE) + ("auto",), "auto")
# "auto" runs its launches of >= WS_MIN_TILES[heads per block] tiles per block on the warp-specialised kernel (read
# once at import; off: the 8-warp one)
WS = env_bool("DSV4_SPARSE_DECODE_WS", True)
# 32-token tiles per block from which "auto" takes the warp-specialised kernel (launch_kernel), per heads per block:
# 64 heads from 4 (H100: 1.04x slower with 3), 32 / 16 heads always (H100: faster than the 8-warp kernel at
# every launch shape of the sweep of a TP rank's heads, 1 tile per block included)
WS_MIN_TILES = {64: 4, 32: 1, 16: 1}
M64_KERNEL = {64: "mma64", 32: "mma64h32", 16: "mma64h16"}     # the 8-warp kernel per heads per block
WS_KERNEL = {64: "mma64ws", 32: "mma64wsh32", 16: "mma64wsh16"}  # the warp-specialised one
# 16-head launches of >= DEEP_MIN_TILES tiles per block run "mma64wsh16deep" under "auto" (read once at import;
# DSV4_SPARSE_DECODE_DEEP=0: "mma64wsh16"). H100 (docs/sparse_decode.md): 0.97x with 4 tiles per block,
# 0.92-0.97x with 5-9, 0.88-0.92x with 10-68; with 3 tiles 0.985-1.03x (why was not measured), with 1-2 0.97-0.99x
# (too little to set apart from the 3-tile loss), so those stay on the two-buffer block
DEEP = env_bool("DSV4_SPARSE_DECODE_DEEP", True)
DEEP_MIN_TILES = 4

def resolve_impl(h_q: int, impl: Optional[str] = None) -> str:
    """The kernel that runs for h_q heads ("auto" -> mma64; h_q is kept so the rule can depend on it)."""
    impl = (impl or IMPL).lower()
    if impl == "auto":
        return "mma64"
    if impl not in HEAD_TILE:
        _fail("impl", f"one of {sorted(HEAD_TILE) + ['auto']}", impl)
    return impl


def launch_kernel(hpb: int, requested: str, split_tokens: int) -> str:
    """The kernel of an mma64 launch of hpb heads per block: the warp-specialised one for "auto" when each block has
    at least WS_MIN_TILES[hpb] tiles (unless DSV4_SPARSE_DECODE_WS=0), else the 8-warp one, which "mma64" by name
    always takes. H100, 64 heads: 0.84-0.90x the 8-warp kernel's time at the same launch shape on all 48 such
    shapes of b 2-256 (4-5 tiles per block and more), 1.04x with 3 tiles (an earlier variant): the block fills its
    two-tile pipeline before its S and PV warps overlap; 32 / 16 heads: 0.83-0.92x from 9 tiles per block,
    and faster at every shape of the TP-rank sweep down to 1 tile per block (docs/sparse_decode.md). 16 heads from
    DEEP_MIN_TILES tiles per block: the deep-gather variant "mma64wsh16deep" (unless DSV4_SPARSE_DECODE_DEEP=0)."""
    ws = requested == "auto" and WS and split_tokens >= WS_MIN_TILES[hpb] * TOK_TILE
    if ws and hpb == 16 and DEEP and split_tokens >= DEEP_MIN_TILES * TOK_TILE:
        return "mma64wsh16deep"
    return (WS_KERNEL if ws else M64_KERNEL)[hpb]


def _tiles(total_positions: int) -> int:
    """32-token tiles of a call's position list (main + extra), at least one."""
    return max(1, -(-total_positions // TOK_TILE))


def choose_splits(b: int, s_q: int, h_q: int, total_positions: int, num_sms: int,
                  impl: Optional[str] = None) -> Tuple[int, int]:
    """(num_splits, split_tokens) from shapes only; each split gets whole 32-token tiles.
    simt / mma: split the position list only when the grid does not fill ~2 blocks per SM.
    mma64 family: the split count of ``mma64_launch`` (cost model; for "mma64" chosen jointly with
    the heads per block, for "mma64h16" / "mma64h32" with those heads)."""
    impl = resolve_impl(h_q, impl)
    if impl.startswith("mma64"):
        _, splits, split_tokens = mma64_launch(b, s_q, h_q, total_positions, num_sms,
                                               None if impl == "mma64" else HEAD_TILE[impl])
        return splits, split_tokens
    tiles = _tiles(total_positions)
    blocks = b * s_q * (-(-h_q // HEAD_TILE[impl]))
    splits = 1
    if blocks < 2 * num_sms:
        splits = min(MAX_SPLITS, tiles, max(1, -(-2 * num_sms // blocks)))
    per = -(-tiles // splits)
    splits = -(-tiles // per)
    return splits, per * TOK_TILE


# Cost model of one mma64 call (split grid + combine), in H100 microseconds: a non-negative least-squares fit
# (relative error; tools/fit_launch_model.py reproduces these weights) to the H100 sweep of every heads-per-block
# x split count at b 1..16, h_q 16..128, s_q 1..2, extra 512 / 2048 (80 shapes, 1780 points; docs/sparse_decode.md
# "Launch shape", tools/sweep_sparse_decode.py), with KV rows from HBM and q / indices hot, as in a decode step:
#   base + waves * (tiles per split * tile[hpb] + wave)
#        + [splits > 1] * (partial MB * part_mb + waves * hpb / 16 * store16)
# (tile[hpb]: the weights tile16 / tile32 / tile64; the terms: mma64_cost_terms.)
# waves = ceil(blocks / num_sms) (one 101 KB, 255-register block per SM); partial MB = the fp32 partial
# outputs written by the split grid and read back by the combine; store16 = the split blocks' own partial
# stores at the end of each wave (hpb x 2 KB per block, ~30 B/clk per SM: the H100 traces). Its argmin is
# the fastest measured point on all 80 shapes, on 32 shapes measured on another H100 before the fit, and
# on 80 H100 shapes (L2-warm inputs, an earlier library); the earlier model, without the store term,
# picked 32-head blocks x 10 splits on six shapes with 256 head rows (b s_q h_q) and 512 extra positions,
# where 16 x 7 is 8-11 % faster. A later H100 sweep of the same 80 shapes ran with each point on the kernel "auto" launches
# for it (the warp-specialised blocks): its picks within 2.3 % of the fastest point on all of them.
# tests/test_sparse_decode.py checks the picks against all four sets. Only the argmin is used; the SM count comes
# from the device, the weights are the H100's (SM120: slower DRAM, so the partial terms would weigh somewhat more;
# a sweep there with --auto-kernels and the fit script say whether its own weights pick faster).
M64_COST = dict(base=4.00, tile16=1.815, tile32=2.01, tile64=2.564, wave=0.393, part_mb=0.532, store16=0.631)


def mma64_cost_terms(b: int, s_q: int, h_q: int, tiles: int, hpb: int, splits: int, num_sms: int) -> Dict[str, float]:
    """The cost model's terms of one launch: M64_COST's keys -> what each weight multiplies (the model is
    their dot product; the fit script solves for the weights from the same terms)."""
    per = -(-tiles // splits)
    splits = -(-tiles // per)
    blocks = b * s_q * (-(-h_q // hpb)) * splits
    waves = -(-blocks // num_sms)
    t = {k: 0.0 for k in M64_COST}
    t["base"] = 1.0
    t[f"tile{hpb}"] = float(waves * per)
    t["wave"] = float(waves)
    if splits > 1:
        t["part_mb"] = splits * b * s_q * h_q * D * 4 / 1e6
        t["store16"] = waves * hpb / 16
    return t


def mma64_cost(b: int, s_q: int, h_q: int, tiles: int, hpb: int, splits: int, num_sms: int) -> float:
    """Modelled time (H100 us) of an mma64 launch with ``hpb`` heads per block and ``splits`` splits."""
    return sum(M64_COST[k] * v for k, v in mma64_cost_terms(b, s_q, h_q, tiles, hpb, splits, num_sms).items())


@functools.lru_cache(maxsize=4096)
def mma64_launch(b: int, s_q: int, h_q: int, total_positions: int, num_sms: int,
                 heads_per_block: Optional[int] = None) -> Tuple[int, int, int]:
    """(heads per block, num_splits, split_tokens) of the mma64 kernel: the argmin of ``mma64_cost``
    over 16 / 32 / 64 heads per block (or the given one) and every split count with its own number of
    tiles per split (ties: fewer heads, then fewer splits). A 32- or 64-head block is only a candidate
    when it holds more than half its heads' worth of real heads (no block of only zero m16 tiles).
    Shapes only (cached): no device query, CUDA-graph safe."""
    tiles = _tiles(total_positions)
    best = None
    for hpb, s, per in mma64_candidates(h_q, tiles, heads_per_block):
        c = mma64_cost(b, s_q, h_q, tiles, hpb, s, num_sms)
        if best is None or c < best[0] - 1e-9:
            best = (c, hpb, s, per)
    return best[1], best[2], best[3] * TOK_TILE


def launch_plan(b: int, s_q: int, h_q: int, total_positions: int, num_sms: int,
                impl: Optional[str] = None) -> Tuple[str, int, int, int]:
    """(kernel, heads per block, num_splits, split_tokens) of a call: the launch sparse_decode makes (and
    tools/trace_sparse_decode.py reports). Shapes only: CUDA-graph safe."""
    requested = (impl or IMPL).lower()
    impl = resolve_impl(h_q, impl)
    if impl == "mma64":   # heads per block and split count chosen together
        hpb, splits, split_tokens = mma64_launch(b, s_q, h_q, total_positions, num_sms)
        return launch_kernel(hpb, requested, split_tokens), hpb, splits, split_tokens
    splits, split_tokens = choose_splits(b, s_q, h_q, total_positions, num_sms, impl)
    return impl, HEAD_TILE[impl], splits, split_tokens


# Batches of more head rows than one wave of blocks (b s_q ceil(h_q / 64) > SMs: b > 132 at h_q 64 on an H100, b > 66 at
# h_q 128; b > 188 / 94 on an RTX PRO 6000): one launch runs its last, partly filled wave of blocks as long as a full
# one (one block per SM), and splitting every row to fill it costs every row fp32 partials (H100: b = 140, h_q
# 64, extra 512 took 121 us, 2.3x b = 128's 53). Cut instead: the first rows in whole waves of unsplit blocks, the
# rest as a call of its own, which the launch rule splits like any small batch. Launch order and kind, from H100
# (docs/sparse_decode.md; the op between other kernels, b = 133 / 140, h_q 64, extra 512: 54.7 us for 132 rows alone,
# 8.0 / 13.3 for the 1 / 8 rows left): the rest first (its split grid and combine), then the whole waves as a plain
# launch (params.h plain_launch), 72.1 / 80.4 us; whole waves first, 79.0 / 86.8; whole waves first through PDL, 89.7
# at b = 140, and with PDL off everywhere 75.8 (why PDL costs here was not traced). Each grid still waits for the
# previous one's completion (griddepcontrol.wait, or the plain launch), as every call's do. batch_parts takes the cut
# where mma64_cost, summed over the parts, says it is faster by WAVE_CUT_GAIN (H100, the op between other
# kernels: every cut modelled at <= 0.95 measured 0.71-0.94x one launch, back to back 0.73-0.99x; those modelled above
# 0.95 measured 0.93-1.04x); read once at import, DSV4_SPARSE_DECODE_WAVES=0: never (one launch, as before).
WAVES = env_bool("DSV4_SPARSE_DECODE_WAVES", True)
WAVE_CUT_GAIN = 0.95


def model_cost(b: int, s_q: int, h_q: int, total_positions: int, num_sms: int) -> float:
    """mma64_cost of the launch mma64_launch picks for b rows."""
    hpb, splits, _ = mma64_launch(b, s_q, h_q, total_positions, num_sms)
    return mma64_cost(b, s_q, h_q, _tiles(total_positions), hpb, splits, num_sms)


def wave_cut_candidates(b: int, s_q: int, h_q: int, num_sms: int) -> Tuple[int, ...]:
    """The cuts batch_parts weighs: whole waves of unsplit 64-head blocks (num_sms // (s_q ceil(h_q / 64)) rows each)
    that leave the rest under one wave, or (one wave less) between one and two; () within one wave."""
    per_wave = num_sms // (s_q * (-(-h_q // 64)))
    if per_wave < 1 or b <= per_wave:
        return ()
    last = (b - 1) // per_wave * per_wave
    return (last - per_wave, last) if last > per_wave else (last,)


@functools.lru_cache(maxsize=4096)
def batch_parts(b: int, s_q: int, h_q: int, total_positions: int, num_sms: int,
                impl: Optional[str] = None, waves: Optional[bool] = None) -> Tuple[int, ...]:
    """Where sparse_decode cuts a batch into consecutive calls: () for one call, (b1,) for rows [0, b1) and [b1, b)
    (the op launches [b1, b) first). b1 is a whole number of waves of unsplit 64-head blocks (num_sms // (s_q
    ceil(h_q / 64)) rows each) that leaves less than two waves' rows to the other part (of the two such b1, the one
    with the least modelled time of the two parts, each with its own launch), taken when that is <= WAVE_CUT_GAIN x
    the modelled time of one call. Only for the launch rule ("auto" / "mma64"; a named kernel runs one call) and
    unless waves is False (None: DSV4_SPARSE_DECODE_WAVES). Shapes only (cached): CUDA-graph safe."""
    if not (WAVES if waves is None else waves) or resolve_impl(h_q, impl) != "mma64":
        return ()
    best = None
    for b1 in wave_cut_candidates(b, s_q, h_q, num_sms):
        c = model_cost(b1, s_q, h_q, total_positions, num_sms) + model_cost(b - b1, s_q, h_q, total_positions, num_sms)
        if best is None or c < best[0] - 1e-9:
            best = (c, b1)
    if best is None or best[0] > WAVE_CUT_GAIN * model_cost(b, s_q, h_q, total_positions, num_sms):
        return ()
    return (best[1],)


def mma64_candidates(h_q: int, tiles: int, heads_per_block: Optional[int] = None):
    """The launch shapes mma64_launch chooses among, in its tie order: (heads per block, splits, tiles per split)."""
    cands = (heads_per_block,) if heads_per_block else tuple(x for x in (16, 32, 64) if x == 16 or x // 2 < h_q)
    for hpb in cands:
        for s in range(1, min(MAX_SPLITS, tiles) + 1):
            per = -(-tiles // s)
            if -(-tiles // per) == s:        # else the same tiles per split as a smaller count
                yield hpb, s, per


def _fail(arg, expected, got):
    raise UnsupportedCase(f"{OP}: {arg} must be {expected}, got {got}")


def _desc(t):
    if t is None:
        return "None"
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{str(t.dtype).replace('torch.', '')} {list(t.shape)} on {t.device}"


def _check_cache(name, cache, dev):
    if not isinstance(cache, torch.Tensor) or cache.dtype not in (torch.uint8, torch.float8_e4m3fn) \
            or cache.dim() < 2 or cache.device != dev:
        _fail(name, f"a uint8/float8_e4m3fn paged fp8_ds_mla cache [num_pages, page_size, 1, 584] on {dev}",
              _desc(cache))
    if cache.dim() == 4 and (cache.shape[2] != 1 or cache.shape[3] != TOKEN_BYTES):
        _fail(name, "[num_pages, page_size, 1, 584]", _desc(cache))
    page_size = cache.shape[1]
    if page_size < 1:
        _fail(name, "page_size >= 1", _desc(cache))
    stride = cache.stride(0) if cache.shape[0] > 1 else max(cache.stride(0), page_size * TOKEN_BYTES)
    if stride < page_size * TOKEN_BYTES or stride % 16 or cache.data_ptr() % 16:
        _fail(name, f"pages of >= page_size*584 = {page_size * TOKEN_BYTES} bytes with a 16-byte aligned "
                    f"base and stride(0)", f"stride(0)={cache.stride(0)}, data_ptr % 16 = {cache.data_ptr() % 16}")
    return page_size, stride, cache.shape[0]


def _check_indices(name, idx, b, s_q, dev):
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int32 or idx.dim() != 3 \
            or idx.shape[0] != b or idx.shape[1] != s_q or idx.device != dev:
        _fail(name, f"int32 [b={b}, s_q={s_q}, topk] on {dev}", _desc(idx))


def _check_len(name, t, b, dev):
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != b \
            or t.device != dev:
        _fail(name, f"None or int32 [b={b}] on {dev}", _desc(t))


def sparse_decode(q, k_cache, indices, topk_length=None, extra_k_cache=None, extra_indices=None,
                  extra_topk_length=None, attn_sink=None, softmax_scale=None, head_dim_v=512, impl=None, waves=None):
    """Returns (out [b, s_q, h_q, 512] bf16, lse [b, h_q, s_q] fp32; lse excludes attn_sink, +inf for
    rows with no valid slot). See the module docstring for the exact semantics. ``impl`` overrides
    DSV4_SPARSE_DECODE_IMPL and ``waves`` DSV4_SPARSE_DECODE_WAVES (batch_parts) for this call (benches/tests)."""
    if not isinstance(q, torch.Tensor) or q.dtype != torch.bfloat16 or q.dim() != 4 or q.shape[3] != D \
            or not q.is_cuda:
        _fail("q", "bf16 [b, s_q, h_q, 512] on a CUDA device", _desc(q))
    if q.stride(3) != 1:
        _fail("q", "a tensor whose last dim is contiguous (stride 1)", f"strides {list(q.stride())}")
    if head_dim_v != D:
        _fail("head_dim_v", "512", head_dim_v)
    dev = q.device
    b, s_q, h_q, _ = q.shape
    page_size, page_stride, num_pages = _check_cache("k_cache", k_cache, dev)
    _check_indices("indices", indices, b, s_q, dev)
    _check_len("topk_length", topk_length, b, dev)
    has_extra = extra_k_cache is not None or extra_indices is not None
    if has_extra:
        if extra_k_cache is None or extra_indices is None:
            _fail("extra_k_cache/extra_indices_in_kvcache", "both given or both None",
                  f"{_desc(extra_k_cache)} / {_desc(extra_indices)}")
        e_page_size, e_stride, e_pages = _check_cache("extra_k_cache", extra_k_cache, dev)
        _check_indices("extra_indices_in_kvcache", extra_indices, b, s_q, dev)
        _check_len("extra_topk_length", extra_topk_length, b, dev)
    elif extra_topk_length is not None:
        _fail("extra_topk_length", "None when there is no extra cache", _desc(extra_topk_length))
    if attn_sink is not None:
        if not isinstance(attn_sink, torch.Tensor) or attn_sink.dtype != torch.float32 \
                or attn_sink.dim() != 1 or attn_sink.shape[0] != h_q or attn_sink.device != dev:
            _fail("attn_sink", f"None or float32 [h_q={h_q}] on {dev}", _desc(attn_sink))
        attn_sink = attn_sink.contiguous()
    if softmax_scale is not None and (isinstance(softmax_scale, (bool, str)) or not hasattr(softmax_scale, "__float__")):
        _fail("softmax_scale", "None or a float", repr(softmax_scale))
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)

    out = torch.empty((b, s_q, h_q, D), dtype=torch.bfloat16, device=dev)
    lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=dev)
    if b == 0 or s_q == 0 or h_q == 0:
        return out, lse
    topk = indices.shape[2]
    extra_topk = extra_indices.shape[2] if has_extra else 0
    total, sms = topk + extra_topk, _sm_count(dev)
    bounds = (0,) + batch_parts(b, s_q, h_q, total, sms, impl, waves) + (b,)
    plans = [launch_plan(b1 - b0, s_q, h_q, total, sms, impl) for b0, b1 in zip(bounds, bounds[1:])]
    env_bool("DSV4_SPARSE_DECODE_PDL", True)   # (read by the compiled launcher: refuse a value it would misread)
    count(OP, plans[0][0])
    # split partials: fp32 [splits, rows, h_q, 512] then [splits, rows, h_q] of the largest split part
    n_o = max([splits * (b1 - b0) for (_, _, splits, _), b0, b1 in zip(plans, bounds, bounds[1:]) if splits > 1],
              default=0) * s_q * h_q * D
    if n_o:
        # the persistent per-stream buffer (ops/_workspace): consecutive calls on a stream (and the parts of one call)
        # share it, which is safe because every kernel of this op waits for the previous kernel of its stream before
        # it writes
        ws = _scratch(_WORKSPACES, dev, n_o + n_o // D, max_numel=WORKSPACE_CAP)
    else:
        ws = None

    from .._ext import SparseDecodeParams, load
    lib = load()
    why = _extension_error(dev)
    if why is not None:
        raise ExtensionUnavailable(f"{OP}: {why}")

    def row(t, b0):   # address of row b0 of t (q, the indices, the lengths, out, lse: all have b as dim 0)
        return t.data_ptr() + b0 * t.stride(0) * t.element_size()

    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        # a cut batch: the rest first, then the whole waves (see batch_parts)
        for (kernel, _, splits, split_tokens), b0, b1 in reversed(list(zip(plans, bounds, bounds[1:]))):
            p = SparseDecodeParams()
            p.q = row(q, b0)
            p.q_stride_b, p.q_stride_s, p.q_stride_h = q.stride(0), q.stride(1), q.stride(2)
            p.k_cache, p.k_page_stride = k_cache.data_ptr(), page_stride
            p.k_page_size, p.k_num_pages = page_size, num_pages
            p.indices = row(indices, b0)
            p.idx_stride_b, p.idx_stride_s, p.idx_stride_k = indices.stride()
            p.topk = topk
            if topk_length is not None:
                p.topk_length = row(topk_length, b0)
                p.topk_length_stride = topk_length.stride(0)
            if has_extra:
                p.extra_k_cache, p.extra_page_stride = extra_k_cache.data_ptr(), e_stride
                p.extra_page_size, p.extra_num_pages = e_page_size, e_pages
                p.extra_indices = row(extra_indices, b0)
                p.extra_idx_stride_b, p.extra_idx_stride_s, p.extra_idx_stride_k = extra_indices.stride()
                p.extra_topk = extra_topk
                if extra_topk_length is not None:
                    p.extra_topk_length = row(extra_topk_length, b0)
                    p.extra_topk_length_stride = extra_topk_length.stride(0)
            if attn_sink is not None:
                p.attn_sink = attn_sink.data_ptr()
            p.out, p.lse = row(out, b0), row(lse, b0)
            if splits > 1:
                n_part = splits * (b1 - b0) * s_q * h_q
                p.o_part, p.lse_part = ws.data_ptr(), ws.data_ptr() + n_part * D * ws.element_size()
            p.b, p.s_q, p.h_q, p.num_splits, p.split_tokens = b1 - b0, s_q, h_q, splits, split_tokens
            p.softmax_scale = scale
            p.impl = IMPL_CODE[kernel]
            # a cut batch's whole waves: a plain launch, after the rest's combine has completed (see batch_parts)
            p.plain_launch = int(b0 == 0 and b1 < b)
            rc = lib.dsv4_sparse_decode(p, stream)
            if rc != 0:
                raise RuntimeError(f"{OP}: CUDA error {rc}: {lib.dsv4_last_error().decode(errors='replace')}")
    return out, lse


def flash_mla_with_kvcache(q, k_cache, block_table=None, cache_seqlens=None, head_dim_v=512,
                           tile_scheduler_metadata=None, num_splits=None, softmax_scale=None, causal=False,
                           is_fp8_kvcache=False, indices=None, attn_sink=None, extra_k_cache=None,
                           extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None):
    """Drop-in for FlashMLA's ``flash_mla.flash_mla_interface.flash_mla_with_kvcache`` (same positional
    order and keyword names) covering only the sparse FP8 decode mode (``indices`` given,
    ``is_fp8_kvcache=True``, not causal). ``tile_scheduler_metadata`` / ``num_splits`` /
    ``cache_seqlens`` are accepted and ignored. Anything else raises UnsupportedCase.
    Returns (out [b, s_q, h_q, 512] bf16, lse [b, h_q, s_q] fp32 without the sink)."""
    if indices is None:
        _fail("indices", "an int32 [b, s_q, topk] tensor (only the sparse mode is covered)", "None")
    if not is_fp8_kvcache:
        _fail("is_fp8_kvcache", "True (only the fp8_ds_mla cache is covered)", is_fp8_kvcache)
    if causal:
        _fail("causal", "False in sparse mode", causal)
    if block_table is not None:
        _fail("block_table", "None in sparse mode (indices hold the slots)", _desc(block_table))
    return sparse_decode(q, k_cache, indices, topk_length=topk_length, extra_k_cache=extra_k_cache,
                         extra_indices=extra_indices_in_kvcache, extra_topk_length=extra_topk_length,
                         attn_sink=attn_sink, softmax_scale=softmax_scale, head_dim_v=head_dim_v)
