"""Entry points of the block-scaled FP8 linear at decode sizes: argument checks, then the compiled kernel.

    fp8_linear(x, weight, weight_scale, *, block_size=(128, 128), bias=None, out=None) -> bf16 [M, N]
    fp8_grouped_linear(x, weight, weight_scale, *, out=None) -> bf16 [M, G, N]

x bf16 [M, K] ([M, G, K]), unit stride along K, rows 16-byte aligned (any row stride that keeps them so);
weight float8_e4m3fn [N, K] ([G, N, K]), unit stride along K, rows 16-byte aligned; weight_scale float32
[ceil(N/128), K/128] (SGLang's weight_scale_inv: w = w_fp8 * scale), UE8M0 of that shape (uint8 or
float8_e8m0fnu: 2^(byte - 127)), or DeepGEMM's packed UE8M0 int32 [N, ceil(K/512)] (with a leading G for the
grouped form); bias bf16 [N]. y = x W^T (+ bias) in fp32, rounded once to bf16. M <= 64, K a multiple of 128,
block_size (128, 128); everything else raises UnsupportedCase naming the argument (fp8_linear_supported answers
the shape part without raising). x is never quantized: the kernel converts it to f16 with a power-of-two scale per
(token, 128-K group), exactly for every |x| >= 2^-28 of its group's max (docs/fp8_linear.md).

Keyword options (benchmarks, A/B runs): ``splits`` (K splits, default pick_splits: shape and SM count),
``decode`` ("cvt": cvt.rn.f16x2.e4m3x2, the default; "int": the integer e4m3 -> f16 decode; env
DSV4_FP8_LINEAR_DECODE), ``kernel`` ("auto", the default: "regs" below RING_MIN_M rows, "ring" from
there; "ring": weights through a shared-memory ring of cp.async stages, x converted once per call by a prep kernel;
"regs": weights straight to a register ring; env DSV4_FP8_LINEAR_KERNEL). CUDA-graph safe: no host sync, the split-K
workspace and tile counters are persistent per (device, stream) (ops/_workspace.py).
"""
from __future__ import annotations

from typing import Optional

import torch

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops import _workspace
from deepseek_v4_kernel.ops._device import extension_error, on_input_device, sm_count
from deepseek_v4_kernel.ops._stats import count

from .dispatch import (BLOCK_SIZE, DECODES, KERNEL_IDS, KERNELS, MODE_PACKED, OP, STEP_K, TILE_N,
                       decode_choice, expected_scale_shape, fp8_linear_supported, kernel_choice, pick_splits,
                       scale_mode_of, token_tiles)

_WS_POOL: dict = {}        # split-K partials, fp32, per (device, stream)
_XF_POOL: dict = {}        # ring kernel: x as f16 fragments + 2^-s, written by its prep kernel each call
_COUNTER_POOL: dict = {}   # tile counters, int32, zero between calls, per (device, stream)
_MIN_COUNTERS = 4096


def _err(msg):
    raise UnsupportedCase(f"{OP}: {msg}")


def _desc(t):
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"{t.dtype} {list(t.shape)} strides {tuple(t.stride())} on {t.device}"


def _decode_choice(decode: Optional[str]) -> str:
    d = decode_choice(decode)
    if d not in DECODES:
        _err(f"decode must be one of {list(DECODES)} (or DSV4_FP8_LINEAR_DECODE), got {d!r}")
    return d


def _kernel_choice(kernel: Optional[str], M: int) -> str:
    k = kernel_choice(kernel, M)
    if k not in KERNELS or k == "auto":
        _err(f"kernel must be one of {list(KERNELS)} (or DSV4_FP8_LINEAR_KERNEL), got {k!r}")
    return k


def _check_common(x, weight, weight_scale, grouped: bool, block_size):
    nd = 3 if grouped else 2
    xs = "[M, G, K]" if grouped else "[M, K]"
    ws = "[G, N, K]" if grouped else "[N, K]"
    if not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or x.dim() != nd:
        _err(f"x must be bf16 {xs}, got {_desc(x)}")
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float8_e4m3fn or weight.dim() != nd:
        _err(f"weight must be float8_e4m3fn {ws}, got {_desc(weight)}")
    M, K = x.shape[0], x.shape[-1]
    N = weight.shape[-2]
    G = weight.shape[0] if grouped else None
    if weight.shape[-1] != K or (grouped and x.shape[1] != G):
        _err(f"weight must be {ws} with K = x.shape[-1] = {K}" + (f" and G = x.shape[1] = {x.shape[1]}" if grouped else "")
             + f", got {list(weight.shape)}")
    if not isinstance(weight_scale, torch.Tensor):
        _err(f"weight_scale must be a tensor, got {type(weight_scale).__name__}")
    ok, why = fp8_linear_supported(max(M, 1), N, K, block_size, weight_scale.dtype, groups=G)
    if not ok:
        raise UnsupportedCase(why)
    mode = scale_mode_of(weight_scale.dtype)
    want = expected_scale_shape(mode, N, K, G)
    if tuple(weight_scale.shape) != want:
        form = "int32 [N, ceil(K/512)] (DeepGEMM's packed UE8M0)" if mode == MODE_PACKED else \
            "[ceil(N/128), K/128]"
        _err(f"weight_scale ({weight_scale.dtype}) must be {('[G] + ' if grouped else '') + form} = {list(want)}, "
             f"got {list(weight_scale.shape)}")
    for name, t in (("weight", weight), ("weight_scale", weight_scale)):
        if t.device != x.device:
            _err(f"{name} must be on x's device {x.device}, got {t.device}")
    if x.stride(-1) != 1 or any(s % 8 for s in x.stride()[:-1]) or x.data_ptr() % 16:
        _err(f"x must have unit stride along K and 16-byte aligned rows (strides % 8 == 0, data_ptr % 16 == 0), got "
             f"{_desc(x)}, data_ptr % 16 = {x.data_ptr() % 16}")
    if (weight.stride(-1) != 1 or any(s % 16 for s in weight.stride()[:-1]) or weight.stride(-2) < K
            or weight.data_ptr() % 16):
        _err(f"weight must have unit stride along K and 16-byte aligned rows (row stride >= K, % 16 == 0), got "
             f"{_desc(weight)}, data_ptr % 16 = {weight.data_ptr() % 16}")
    return M, N, K, G, mode


def _check_out(out, shape, dev, name="out"):
    if out is None:
        return torch.empty(*shape, dtype=torch.bfloat16, device=dev)
    if (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or tuple(out.shape) != tuple(shape)
            or out.stride(-1) != 1 or out.device != dev):
        _err(f"{name} must be bf16 {list(shape)} on {dev} with unit stride along N, got {_desc(out)}")
    return out


def _counters(dev, n):
    key = _workspace.stream_key(dev)
    buf = _COUNTER_POOL.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    if dev.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(n, dtype=torch.int32, device=dev)   # (a memset node in the graph; zero at every replay)
    # outgrown buffers stay alive in the pool's list: graphs captured earlier point at them (and they stay zero)
    if buf is not None:
        _COUNTER_POOL.setdefault(("old",) + key, []).append(buf)
    buf = _COUNTER_POOL[key] = torch.zeros(max(n, _MIN_COUNTERS), dtype=torch.int32, device=dev)
    return buf


def _launch(x, weight, weight_scale, mode, bias, out, M, N, K, G, splits, decode, kernel):
    dev = x.device
    if dev.type != "cuda":
        _err(f"needs a CUDA device, got x on {dev}")
    from deepseek_v4_kernel._ext import Fp8LinearParams, has_fp8_linear, load
    if not has_fp8_linear():
        _err("the CUDA extension (_C.so with the fp8_linear kernel) does not load")
    why = extension_error(dev)
    if why is not None:
        _err(why)
    steps = K // STEP_K
    if splits is None:
        splits = pick_splits(M, N, K, G, sm_count(dev), mode, kernel)
    elif not isinstance(splits, int) or not 1 <= splits <= min(steps, 64):
        _err(f"splits must be an int in [1, min(K / 128, 64)] = [1, {min(steps, 64)}], got {splits!r}")
    tiles = -(-N // TILE_N)
    counters = _counters(dev, G * tiles)
    ws = None
    if splits > 1:
        ws = _workspace.scratch(_WS_POOL, dev, G * splits * tiles * M * TILE_N, torch.float32)
    xf = None
    if kernel == "ring":   # [G, K/128, MT, 4, 32] x 16 B of f16 fragments, then [G, K/128, 8 MT] fp32 (params.h)
        mt = token_tiles(M)
        xf = _workspace.scratch(_XF_POOL, dev, G * steps * mt * (2048 + 32) // 4, torch.float32)
    grouped = weight.dim() == 3
    sc = weight_scale.view(torch.uint8) if weight_scale.dtype not in (torch.float32, torch.int32, torch.uint8) \
        else weight_scale
    p = Fp8LinearParams()
    p.x, p.x_stride_m, p.x_stride_g = x.data_ptr(), x.stride(0), (x.stride(1) if grouped else 0)
    p.w, p.w_stride_n, p.w_stride_g = weight.data_ptr(), weight.stride(-2), (weight.stride(0) if grouped else 0)
    p.scale, p.s_stride_n, p.s_stride_k = sc.data_ptr(), sc.stride(-2), sc.stride(-1)
    p.s_stride_g, p.scale_mode = (sc.stride(0) if grouped else 0), mode
    p.bias, p.bias_stride_g = (bias.data_ptr() if bias is not None else None), 0
    p.out, p.out_stride_m, p.out_stride_g = out.data_ptr(), out.stride(0), (out.stride(1) if grouped else 0)
    p.ws, p.counters = (ws.data_ptr() if ws is not None else None), counters.data_ptr()
    p.M, p.N, p.K, p.G, p.splits, p.cvt_int = M, N, K, G, splits, int(decode == "int")
    p.kernel, p.xf = KERNEL_IDS[kernel], (xf.data_ptr() if xf is not None else None)
    lib = load()
    with torch.cuda.device(dev):
        rc = lib.dsv4_fp8_linear(p, torch.cuda.current_stream(dev).cuda_stream)
    if rc != 0:
        raise RuntimeError(f"{OP}: CUDA error {rc}: {lib.dsv4_last_error().decode(errors='replace')}")
    count(OP, ("cuda" if decode == "cvt" else "cuda_int") + ("" if kernel == "ring" else "_regs"))
    return out


@on_input_device
def fp8_linear(x, weight, weight_scale, *, block_size=BLOCK_SIZE, bias=None, out=None, splits=None, decode=None,
               kernel=None):
    """y = x weight^T (+ bias), weight block-scaled e4m3 (see the module docstring). Returns bf16 [M, N]."""
    M, N, K, _, mode = _check_common(x, weight, weight_scale, False, block_size)
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype != torch.bfloat16
                             or tuple(bias.shape) != (N,) or bias.stride(0) != 1 or bias.device != x.device):
        _err(f"bias must be None or bf16 [N] = [{N}] contiguous on {x.device}, got {_desc(bias)}")
    out = _check_out(out, (M, N), x.device)
    decode, kernel = _decode_choice(decode), _kernel_choice(kernel, M)
    if M == 0:
        return out
    return _launch(x, weight, weight_scale, mode, bias, out, M, N, K, 1, splits, decode, kernel)


@on_input_device
def fp8_grouped_linear(x, weight, weight_scale, *, out=None, splits=None, decode=None, kernel=None):
    """out[m, g, n] = sum_k x[m, g, k] weight[g, n, k] (block-scaled e4m3): DeepSeek-V4's wo_a
    (deep_gemm.fp8_einsum("bhr,hdr->bhd") with G = o_groups / attention TP, N = o_lora_rank, K = 4096). bf16
    [M, G, N]."""
    M, N, K, G, mode = _check_common(x, weight, weight_scale, True, BLOCK_SIZE)
    out = _check_out(out, (M, G, N), x.device)
    decode, kernel = _decode_choice(decode), _kernel_choice(kernel, M)
    if M == 0:
        return out
    return _launch(x, weight, weight_scale, mode, None, out, M, N, K, G, splits, decode, kernel)
