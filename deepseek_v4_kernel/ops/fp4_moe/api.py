"""Public entry point of the MXFP4 MoE: argument checks, then the kernels.


    fp4_moe(hidden_states, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
            swiglu_limit=None, routed_scaling_factor=None, impl=None, out=None,
            config=None) -> [M, hidden]

hidden_states bf16 [M, hidden]; w13 int8/uint8 [E, 2I, hidden/2] (gate rows 0..I-1, up
rows I..2I-1, e2m1 low nibble first); w13_scale [E, 2I, hidden/32]; w2 int8/uint8
[E, hidden, I/2]; w2_scale [E, hidden, I/32]. Scales: uint8 UE8M0 bits,
torch.float8_e8m0fnu, or float32 holding the power of two (what SGLang's Fp8MoEMethod
keeps in ``w13_weight_scale_inv``; only the exponent field is read, so they must be
exact powers of two, as they are when loaded from e8m0). topk_weights float32/bf16/fp16
[M, k]; topk_ids int32/int64 [M, k]; an id < 0 or >= E drops that slot (EP mapping), for any value of
either dtype (no read outside the tensors; a token with every slot dropped gives 0).
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
  "cuda_stream" the same inner product on a persistent grid (csrc/fp4_moe/kernel_stream.cuh), for M * topk
               <= 2048 slots and E <= 1024: routing once per block, work items (expert pass of <= 8 slots,
               row tile) round robin over groups of 1 / 2 / 4 warps, each warp's weight stream running
               across items without a break; gemm2 combines per (token, 32-column tile) after its last
               item (fixed order). Workspaces persistent per stream (ops/_workspace.scratch).
The interpreter (TRITON_INTERPRET=1; no dot_scaled there) always runs "dequant" with fp32
dots and fp32 intermediates (its bf16 casts truncate); "cuda_decode" needs a CUDA device.
Default (pick_impl): env DSV4_FP4_MOE_IMPL, else "cuda_decode" up to CUDA_DECODE_DEFAULT_SLOTS
slots where it applies, else DEFAULT_IMPL_CC10 on cc >= 10 and DEFAULT_IMPL_SM90 below (chosen
from the H100 runs, see docs/fp4_moe.md), with "dot_scaled" for the decode regime's "dequant" under
a Triton newer than DEQUANT_DECODE_MAX_TRITON.
"""
from __future__ import annotations

import torch
import triton

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops._device import check_kernel_device, on_input_device, sm_count, smem_per_sm_kb
from deepseek_v4_kernel.ops._stats import count
from deepseek_v4_kernel.switches import env_bool

from deepseek_v4_kernel.ops._workspace import scratch

from .dispatch import (_CFG_KEYS, _IMPL_CODE, DECODE_GEMM2_TILE, GROUP, IMPLS, LAST_KERNELS, OP,
                       SMALL_ROUTE_MAX_SLOTS, STREAM_DIAGS, STREAM_VARIANTS, _cuda_decode_unsupported,
                       _cuda_stream_unsupported, _finish_config, _interp, _pick_config, k_per_split, max_row_blocks,
                       pick_impl, split_k, stream_plan)
from .kernels import (_count_kernel, _gemm1_kernel, _gemm2_kernel, _layout_kernel, _reduce_kernel,
                      _route_small_kernel, _swiglu_kernel)

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
        _err(f"config['gemm2']['BM'] must equal gemm1's BM {c1['BM']} (shared row layout), got {config['gemm2']['BM']}")
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
    check_kernel_device(OP, hidden_states=hidden_states)
    for name, v in (("swiglu_limit", swiglu_limit), ("routed_scaling_factor", routed_scaling_factor)):
        if v is not None and (isinstance(v, (bool, str)) or not hasattr(v, "__float__")):
            _err(f"{name} must be None or a number, got {v!r}")
    S = M * topk
    impl = impl or pick_impl(hidden_states, w13, w2, topk, config)
    if impl not in IMPLS:
        _err(f"impl must be one of {list(IMPLS)}, got {impl!r}")
    interp = _interp()
    if interp and impl not in ("cuda_decode", "cuda_stream"):
        impl = "dequant"
    dev = hidden_states.device
    if out is None:
        out = torch.empty(M, H, dtype=torch.bfloat16, device=dev)
    elif (not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, H)
          or out.dtype != torch.bfloat16 or out.stride(1) != 1 or out.device != dev):
        _err(f"out must be bf16 [M, hidden] = {[M, H]} on {dev} with unit stride, got "
             f"{getattr(out, 'dtype', type(out).__name__)} {_shape(out)}"
             + (f" on {out.device} strides {tuple(out.stride())}" if isinstance(out, torch.Tensor) else ""))
    if M == 0:
        return out
    count(OP, impl)
    if impl == "cuda_stream":
        env_bool("DSV4_FP4_MOE_PDL", True)   # (read by the compiled launcher: refuse a value it would misread)
        why = _cuda_stream_unsupported(hidden_states, w13, w2, S, H, inter)
        over = None
        if config is not None:
            if not isinstance(config, dict) or set(config) - {"stream"}:
                why = why or (f"config must be {{'stream': {{...}}}} (variant, wpi1, wpi2, blocks_per_sm, balance, diag), "
                              f"got {config!r}")
            else:
                over = config.get("stream")
        if why is not None:
            _err(f"impl 'cuda_stream': {why}")
        try:
            plan = stream_plan(M, topk, E, H, inter, sm_count(dev), over, smem_per_sm_kb(dev))
        except ValueError as e:
            _err(f"impl 'cuda_stream': {e}")
        why = _stream_variant_unsupported(plan, w13_scale, w2_scale)
        if why is not None and "variant" not in (over or {}) and plan["variant"] != 1:
            plan["variant"] = 1   # the default's shared-memory variant cannot take these scales: the register ring can
            why = _stream_variant_unsupported(plan, w13_scale, w2_scale)
        if why is not None:
            _err(f"impl 'cuda_stream': {why}")
        _cuda_stream(hidden_states, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, swiglu_limit,
                     routed_scaling_factor, out, M, H, E, inter, topk, plan)
        return out
    if isinstance(config, dict) and "stream" in config:
        _err(f"config 'stream' applies to impl 'cuda_stream' only, got impl {impl!r}")
    if impl == "cuda_decode":
        env_bool("DSV4_FP4_MOE_PDL", True)   # (read by the compiled launcher: refuse a value it would misread)
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
    if ids.dtype == torch.int64:   # the Triton kernels compare ids in 32 bits: 2^32 + 1 would alias expert 1
        ids = ids.clamp(-1, E).to(torch.int32)
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
               and env_bool("DSV4_FP4_MOE_DEQ_PTX", True))
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


def _stream_variant_unsupported(plan, s13, s2):
    """Why this call's scales do not suit the planned streaming variant (None when they do): the diagnostics exist
    for uint8 scales only; the shared-memory rings copy 4-byte scale words (uint8 rows must start 4-byte aligned)."""
    f32 = s13.dtype == torch.float32 or s2.dtype == torch.float32
    if plan.get("diag") is not None and f32:
        return f"stream diag {plan['diag']!r} exists for uint8 / float8_e8m0fnu scales only, got float32"
    if STREAM_VARIANTS[plan["variant"]][2] == "smem":
        for name, s in (("w13_scale", s13), ("w2_scale", s2)):
            if s.dtype != torch.float32 and (s.data_ptr() % 4 or s.stride(0) % 4 or s.stride(1) % 4):
                return (f"stream variant {plan['variant']} (shared-memory ring) needs {name} rows 4-byte aligned "
                        f"(data_ptr % 4 {s.data_ptr() % 4}, strides {tuple(s.stride())})")
    return None


def _decode_params(p, x, w13, s13, w2, s2, tw, ids, swiglu_limit, rsf, out, M, H, E, inter, topk, h, y, counters):
    """Fills the Fp4MoeDecodeParams block `p` (shared by both compiled decode paths); returns the tensors it points
    at that must outlive the launch (contiguous copies of ids / weights, uint8 views of the scales)."""
    ids, tw = ids.contiguous(), tw.contiguous()
    (s13, f13), (s2, f2) = _scale_arg(s13), _scale_arg(s2)
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
    return ids, tw, s13, s2


# Persistent workspaces of "cuda_stream" per (device, stream): h bf16 [S, I], y fp32 [S, hidden], the (token, column
# tile) counters int32 [M, hidden / 32] (zeroed by its gemm1). Consecutive calls on one stream share them: each
# kernel waits (griddepcontrol.wait) for the previous kernel of the stream before its first write.
_STREAM_H, _STREAM_Y, _STREAM_CTR = {}, {}, {}


def _cuda_stream(x, w13, s13, w2, s2, tw, ids, swiglu_limit, rsf, out, M, H, E, inter, topk, plan):
    """Both streaming kernels of csrc/fp4_moe (kernel_stream.cuh) on the current stream; no host sync, no
    allocation after the first call of a size per stream (ops/_workspace.scratch)."""
    from deepseek_v4_kernel._ext import Fp4MoeStreamParams, load

    dev = x.device
    S = M * topk
    h = scratch(_STREAM_H, dev, S * inter, torch.bfloat16)
    y = scratch(_STREAM_Y, dev, S * H, torch.float32)
    counters = scratch(_STREAM_CTR, dev, M * (H // DECODE_GEMM2_TILE), torch.int32, min_numel=1 << 12)
    sp = Fp4MoeStreamParams()
    keep = _decode_params(sp.d, x, w13, s13, w2, s2, tw, ids, swiglu_limit, rsf, out, M, H, E, inter, topk,
                          h, y, counters)
    sp.wpi1, sp.wpi2 = plan["wpi1"], plan["wpi2"]
    sp.variant, sp.blocks_per_sm = plan["variant"], plan["blocks_per_sm"]
    if plan.get("diag") is not None:
        sp.variant |= STREAM_DIAGS[plan["diag"]][0]
    _run_compiled(load(), "dsv4_fp4_moe_stream", sp, dev, keep, "cuda_stream")
    LAST_KERNELS["stream"] = dict(plan)


def _run_compiled(lib, entry: str, params, dev, keep, impl: str) -> None:
    """One C-ABI launch of the compiled MoE kernels on the current stream of ``dev`` (``keep``: the tensors the
    parameter block points at, alive until the call returns), its error raised with the library's message."""
    with torch.cuda.device(dev):
        rc = getattr(lib, entry)(params, torch.cuda.current_stream(dev).cuda_stream)
    del keep
    if rc != 0:
        raise RuntimeError(f"{OP}: CUDA error {rc}: {lib.dsv4_last_error().decode(errors='replace')}")
    LAST_KERNELS.clear()
    LAST_KERNELS["config"] = (None, None, impl)
    LAST_KERNELS["split_k"] = (1, 1)


def _cuda_decode(x, w13, s13, w2, s2, tw, ids, swiglu_limit, rsf, out, M, H, E, inter, topk):
    """Both decode kernels of csrc/fp4_moe (gemm1 + SiLU, gemm2 + combine) on the current stream.
    Workspace per call (sizes from M, topk, hidden, I only: graph-safe): h bf16 [S, I], y fp32
    [S, hidden] and gemm2's column-tile counters int32 [hidden / 32] (zeroed by gemm1).
    The only host work is filling the parameter block: no sync, no per-device query."""
    from deepseek_v4_kernel._ext import Fp4MoeDecodeParams, load

    dev = x.device
    S = M * topk
    h = torch.empty(S, inter, dtype=torch.bfloat16, device=dev)
    y = torch.empty(S, H, dtype=torch.float32, device=dev)
    counters = torch.empty(H // DECODE_GEMM2_TILE, dtype=torch.int32, device=dev)
    p = Fp4MoeDecodeParams()
    keep = _decode_params(p, x, w13, s13, w2, s2, tw, ids, swiglu_limit, rsf, out, M, H, E, inter, topk,
                          h, y, counters)
    _run_compiled(load(), "dsv4_fp4_moe_decode", p, dev, keep, "cuda_decode")

