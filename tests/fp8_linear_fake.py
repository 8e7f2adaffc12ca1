"""A stand-in for ``deepseek_v4_kernel.ops.fp8_linear`` (written on another branch), for the patch tests only: the
op's fixed API computed in float64, with a switch for what it covers and a record of its calls. Installed by the
tests in ``sys.modules`` (monkeypatch, or the source below in a child interpreter); never part of the package."""

import sys
import types

SOURCE = r'''
import math
import torch
from deepseek_v4_kernel.errors import UnsupportedCase

CALLS = []          # (name, kwargs of interest) per call
REJECT = []         # reasons fp8_linear_supported answers with, while non-empty (the first one)


def dequant(weight, scale, block=(128, 128)):
    """float64 [.., N, K] from e4m3 [.., N, K] and fp32 block scales [.., ceil(N/bn), ceil(K/bk)]."""
    n, k = weight.shape[-2:]
    s = scale.double().repeat_interleave(block[0], -2)[..., :n, :].repeat_interleave(block[1], -1)[..., :k]
    return weight.double() * s


def fp8_linear_supported(M, N, K, block_size, scale_dtype, *rest, **kw):
    if REJECT:
        return False, REJECT[0]
    if tuple(block_size) != (128, 128) or scale_dtype != torch.float32:
        return False, f"fp8_linear: block_size {tuple(block_size)} / scale {scale_dtype} not covered"
    return True, "ok"


def fp8_linear(x, weight, weight_scale, *, block_size=(128, 128), bias=None, out=None):
    if x.dtype != torch.bfloat16 or x.dim() != 2 or weight.dtype != torch.float8_e4m3fn:
        raise UnsupportedCase(f"fp8_linear: x must be bf16 [M, K], got {x.dtype} {list(x.shape)}")
    CALLS.append(("fp8_linear", dict(m=x.shape[0], block_size=tuple(block_size), bias=bias is not None)))
    y = x.double() @ dequant(weight, weight_scale, block_size).t()
    if bias is not None:
        y = y + bias.double()
    y = y.to(torch.bfloat16)
    if out is not None:
        out.copy_(y)
        return out
    return y


def fp8_grouped_linear(x, weight, weight_scale, *, out=None):
    if x.dtype != torch.bfloat16 or x.dim() != 3 or weight.dim() != 3:
        raise UnsupportedCase(f"fp8_grouped_linear: x must be bf16 [M, G, K], got {x.dtype} {list(x.shape)}")
    CALLS.append(("fp8_grouped_linear", dict(m=x.shape[0], out=out is not None)))
    y = torch.einsum("mgk,gnk->mgn", x.double(), dequant(weight, weight_scale)).to(torch.bfloat16)
    if out is not None:
        out.copy_(y)
        return out
    return y
'''

NAME = "deepseek_v4_kernel.ops.fp8_linear"


def make_module():
    mod = types.ModuleType(NAME)
    exec(compile(SOURCE, "<fake fp8_linear>", "exec"), mod.__dict__)
    return mod


# for a child interpreter: install the stand-in before anything imports it
CHILD_PRELUDE = (f"import sys as _s, types as _t\n_m = _t.ModuleType({NAME!r})\nexec({SOURCE!r}, _m.__dict__)\n"
                 f"_s.modules[{NAME!r}] = _m\n")


def install(monkeypatch):
    mod = make_module()
    monkeypatch.setitem(sys.modules, NAME, mod)
    return mod
