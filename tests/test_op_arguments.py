"""Bad arguments to every public op entry point end in our UnsupportedCase naming the argument and the expected value
(inside SGLang: a hand-back to SGLang's own code), never a raw AttributeError / TypeError / ValueError from deep inside
or Triton's "0 active drivers". Table-driven, one table per op; CPU tensors (the Triton interpreter where a kernel
runs). The compiled sparse decode needs CUDA tensors to get past its first check: its table is a GPU test."""
import re

import pytest
import torch

from conftest import HAS_CUDA
from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops import fp4_moe as moe
from deepseek_v4_kernel.ops import hc_prenorm as hp
from deepseek_v4_kernel.ops import indexer_logits as il
from deepseek_v4_kernel.ops import sparse_decode as sd
from deepseek_v4_kernel.reference.fp4_moe import quantize_mxfp4
from deepseek_v4_kernel.reference.indexer_logits import pack_paged_k_cache, quantize_k
from deepseek_v4_kernel.reference.sparse_decode import pack_fp8_ds_mla


def _paged(device="cpu"):
    q = torch.randn(2, 1, 16, 128).to(torch.float8_e4m3fn)
    cache = pack_paged_k_cache(torch.randn(3, 64, 128))
    w = torch.randn(2, 16)
    cl = torch.tensor([10, 70], dtype=torch.int32)
    bt = torch.tensor([[0, 1], [2, 1]], dtype=torch.int32)
    return [t.to(device) for t in (q, cache, w, cl, bt)]


def _flat(device="cpu"):
    q = torch.randn(3, 16, 128).to(torch.float8_e4m3fn)
    k, s = quantize_k(torch.randn(40, 128))
    t = (q, k, s, torch.randn(3, 16), torch.zeros(3, dtype=torch.int32), torch.full((3,), 40, dtype=torch.int32))
    q, k, s, w, ks, ke = (x.to(device) for x in t)
    return q, (k, s), w, ks, ke


def _moe(device="cpu"):
    E, H, inter, M, k = 2, 64, 32, 3, 2
    w13, s13 = quantize_mxfp4(torch.randn(E, 2 * inter, H) * 0.1, scale_dtype=torch.float32)
    w2, s2 = quantize_mxfp4(torch.randn(E, H, inter) * 0.1, scale_dtype=torch.float32)
    x = torch.randn(M, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [1, 0], [0, -1]], dtype=torch.int32)
    return [t.to(device) for t in (x, w13.view(torch.int8), s13, w2.view(torch.int8), s2, torch.rand(M, k), ids)]


def _hc(device="cpu"):
    return tuple(t.to(device) for t in (torch.randn(2, 256).to(torch.bfloat16), torch.randn(24, 256),
                                        torch.empty(2, 24), torch.empty(2)))


def _with(args, i, v):
    args = list(args)
    args[i] = v
    return args


PAGED = [   # (what, call, message): the message must name the argument and say what it expected
    ("q None", lambda a: il.paged_mqa_logits(None, *a[1:], 64), r"q must be a float8_e4m3fn tensor, got NoneType"),
    ("kv_cache list", lambda a: il.paged_mqa_logits(*_with(a, 1, [1, 2]), 64),
     r"kv_cache must be a 1-byte \[num_blocks, 64, 1, 132\] tensor, got list"),
    ("weights None", lambda a: il.paged_mqa_logits(*_with(a, 2, None), 64),
     r"weights must be a float32 or bf16 \[2, 16\] tensor, got NoneType"),
    ("context_lens list", lambda a: il.paged_mqa_logits(*_with(a, 3, [10, 70]), 64),
     r"context_lens must be an int32 \[2\] or \[2, 1\] tensor, got list"),
    ("block_table None", lambda a: il.paged_mqa_logits(*_with(a, 4, None), 64),
     r"block_table must be an int32 \[2, max_blocks\] tensor, got NoneType"),
    ("max_context_len 'abc'", lambda a: il.paged_mqa_logits(*a, "abc"),
     r"max_context_len must be an integer >= 0, got 'abc'"),
    ("max_context_len 1.5", lambda a: il.paged_mqa_logits(*a, 1.5), r"max_context_len must be an integer >= 0, got 1.5"),
    ("max_context_len None", lambda a: il.paged_mqa_logits(*a, None),
     r"max_context_len must be an integer >= 0, got None"),
    ("out list", lambda a: il.paged_mqa_logits(*a, 64, out=[0]),
     r"out must be None or a float32 \[2, 64\] tensor, got list"),
    ("next_n 9", lambda a: il.paged_mqa_logits(a[0].expand(2, 9, 16, 128), *a[1:], 64), r"q next_n must be 1..8, got 9"),
    ("shim: fp4 q", lambda a: il.fp8_paged_mqa_logits((a[0], a[2]), *a[1:], None, 64),
     r"q must be a float8_e4m3fn tensor \(fp4 q with scales is not supported\)"),
    ("metadata num_sms -3", lambda a: il.get_paged_mqa_logits_metadata(a[3], 64, -3),
     r"num_sms must be an integer >= 1, got -3"),
    ("metadata num_sms 'abc'", lambda a: il.get_paged_mqa_logits_metadata(a[3], 64, "abc"),
     r"num_sms must be an integer >= 1, got 'abc'"),
    ("metadata context_lens None", lambda a: il.get_paged_mqa_logits_metadata(None, 64, 4),
     r"context_lens must be an int32 tensor, got NoneType"),
]

FLAT = [
    ("kv[1] None", lambda a: il.mqa_logits(a[0], (a[1][0], None), *a[2:]), r"kv\[1\] must be a float32 \[n\] tensor"),
    ("kv[0] list", lambda a: il.mqa_logits(a[0], ([0], a[1][1]), *a[2:]), r"kv\[0\] must be a float8_e4m3fn"),
    ("kv tensor", lambda a: il.mqa_logits(a[0], a[1][0], *a[2:]), r"kv must be a tuple"),
    ("weights None", lambda a: il.mqa_logits(*_with(a, 2, None)), r"weights must be a float32 \[3, 16\] tensor"),
    ("ks None", lambda a: il.mqa_logits(*_with(a, 3, None)), r"cu_seq_len_k_start must be an int32 \[3\] tensor"),
    ("ke list", lambda a: il.mqa_logits(*_with(a, 4, [1, 2, 3])), r"cu_seq_len_k_end must be an int32 \[3\] tensor"),
    ("max_seqlen_k 'abc'", lambda a: il.fp8_mqa_logits(*a, clean_logits=False, max_seqlen_k="abc"),
     r"max_seqlen_k must be an integer >= 0, got 'abc'"),
]

MOE = [
    ("hidden_states None", lambda a: moe.fp4_moe(*_with(a, 0, None)), r"hidden_states must be bf16 \[M, hidden\]"),
    ("w13 list", lambda a: moe.fp4_moe(*_with(a, 1, [1])), r"w13 must be int8/uint8 packed e2m1"),
    ("w2_scale None", lambda a: moe.fp4_moe(*_with(a, 4, None)), r"w2_scale must be uint8/float8_e8m0fnu/float32"),
    ("topk_weights None", lambda a: moe.fp4_moe(*_with(a, 5, None)), r"topk_weights must be float32/bf16/fp16"),
    ("topk_ids float", lambda a: moe.fp4_moe(*_with(a, 6, a[6].float())), r"topk_ids must be int32/int64"),
    ("swiglu_limit 'abc'", lambda a: moe.fp4_moe(*a, swiglu_limit="abc"),
     r"swiglu_limit must be None or a number, got 'abc'"),
    ("routed_scaling_factor list", lambda a: moe.fp4_moe(*a, routed_scaling_factor=[1.5]),
     r"routed_scaling_factor must be None or a number, got \[1.5\]"),
    ("impl 'fast'", lambda a: moe.fp4_moe(*a, impl="fast"), r"impl must be one of"),
    ("out list", lambda a: moe.fp4_moe(*a, out=[0]), r"out must be bf16 \[M, hidden\]"),
    ("config list", lambda a: moe.fp4_moe(*a, config=[1]), r"config must be a dict"),
    ("w2 on meta", lambda a: moe.fp4_moe(*_with(a, 3, a[3].to("meta"))), r"all tensors must be on one device"),
]

HC = [
    ("x None", lambda a: hp.hc_prenorm_gemm(None, *a[1:]), r"x must be bf16 \[m, K\], got NoneType"),
    ("fn list", lambda a: hp.hc_prenorm_gemm(a[0], [1], *a[2:]), r"fn must be float32 \[n, 256\]"),
    ("out None", lambda a: hp.hc_prenorm_gemm(*_with(a, 2, None)), r"out must be float32, got None"),
    ("sqrsum list", lambda a: hp.hc_prenorm_gemm(*_with(a, 3, [0])), r"sqrsum must be float32, got list"),
    ("num_splits -3", lambda a: hp.hc_prenorm_gemm(*a, -3), r"num_splits must be None or an int >= 1, got -3"),
    ("num_splits 'abc'", lambda a: hp.tf32_hc_prenorm_gemm(*a, "abc"), r"num_splits must be None or an int >= 1"),
    ("impl 'fast'", lambda a: hp.hc_prenorm_gemm(*a, impl="fast"), r"impl must be one of"),
]


def _run(call, args, message):
    with pytest.raises(UnsupportedCase) as e:
        call(args)
    assert re.search(message, str(e.value)), str(e.value)


@pytest.mark.parametrize("what,call,message", PAGED, ids=[c[0] for c in PAGED])
def test_paged_indexer_arguments(what, call, message, device):
    _run(call, _paged(device), message)


@pytest.mark.parametrize("what,call,message", FLAT, ids=[c[0] for c in FLAT])
def test_flat_indexer_arguments(what, call, message, device):
    _run(call, _flat(device), message)


@pytest.mark.parametrize("what,call,message", MOE, ids=[c[0] for c in MOE])
def test_fp4_moe_arguments(what, call, message, device):
    _run(call, _moe(device), message)


@pytest.mark.parametrize("what,call,message", HC, ids=[c[0] for c in HC])
def test_hc_prenorm_arguments(what, call, message, device):
    _run(call, _hc(device), message)


CPU_CALLS = [   # what CPU tensors without the interpreter ran into: Triton's "0 active drivers"
    ("paged_mqa_logits", lambda: il.paged_mqa_logits(*_paged(), 64), r"paged_mqa_logits: q must be on a CUDA device"),
    ("mqa_logits", lambda: il.fp8_mqa_logits(*_flat()), r"mqa_logits: q must be on a CUDA device"),
    ("fp4_moe", lambda: moe.fp4_moe(*_moe()), r"fp4_moe: hidden_states must be on a CUDA device"),
    ("hc_prenorm", lambda: hp.hc_prenorm_gemm(*_hc()), r"hc_prenorm: x must be a CUDA tensor"),
    ("sparse_decode", lambda: sd.sparse_decode(torch.zeros(1, 1, 16, 512, dtype=torch.bfloat16),
                                               pack_fp8_ds_mla(torch.randn(64, 512), 64),
                                               torch.zeros(1, 1, 8, dtype=torch.int32)),
     r"sparse_decode: q must be bf16 \[b, s_q, h_q, 512\] on a CUDA device"),
]


@pytest.mark.parametrize("what,call,message", CPU_CALLS, ids=[c[0] for c in CPU_CALLS])
def test_cpu_tensors_without_the_interpreter_name_the_device(what, call, message, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(UnsupportedCase, match=message):
        call()


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_triton_interpret_words_are_read_as_triton_reads_them(value, monkeypatch):
    if HAS_CUDA:
        pytest.skip("Triton chose compiled kernels at import here (TRITON_INTERPRET unset on a GPU machine)")
    """TRITON_INTERPRET=true runs Triton's interpreter (Triton reads 1 / true / yes / on / y); fp4_moe accepted only
    "1" and then launched its GPU code path on CPU tensors."""
    from deepseek_v4_kernel.ops._device import triton_interpret
    from deepseek_v4_kernel.reference.fp4_moe import fp4_moe_reference

    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert triton_interpret() and moe.dispatch._interp() and il._interpret() and hp.dispatch._interpret()
    a = _moe()
    out = moe.fp4_moe(*a)
    ref = fp4_moe_reference(a[0], a[1].view(torch.uint8), a[2], a[3].view(torch.uint8), a[4], a[5], a[6])
    assert (out.double() - ref).norm() / ref.norm() < 2e-2


@pytest.mark.gpu
def test_sparse_decode_arguments_on_gpu():
    """The compiled op's checks past its first one (needs CUDA tensors)."""
    q = torch.randn(2, 1, 16, 512, device="cuda").to(torch.bfloat16)
    cache = pack_fp8_ds_mla(torch.randn(128, 512), 64).cuda()
    idx = torch.zeros(2, 1, 8, dtype=torch.int32, device="cuda")
    cases = [
        (lambda: sd.sparse_decode(q, [cache], idx), r"k_cache must be a uint8/float8_e4m3fn paged"),
        (lambda: sd.sparse_decode(q, cache, None), r"indices must be int32 \[b=2, s_q=1, topk\]"),
        (lambda: sd.sparse_decode(q, cache, idx.long()), r"indices must be int32"),
        (lambda: sd.sparse_decode(q, cache, idx, topk_length=[3, 4]), r"topk_length must be None or int32 \[b=2\]"),
        (lambda: sd.sparse_decode(q, cache, idx, attn_sink=[0.0]), r"attn_sink must be None or float32 \[h_q=16\]"),
        (lambda: sd.sparse_decode(q, cache, idx, softmax_scale="abc"), r"softmax_scale must be None or a float"),
        (lambda: sd.sparse_decode(q, cache, idx, extra_k_cache=cache), r"extra_k_cache/extra_indices_in_kvcache"),
        (lambda: sd.sparse_decode(q, cache, idx, impl="fast"), r"impl must be one of"),
        (lambda: sd.flash_mla_with_kvcache(q, cache, indices=None, is_fp8_kvcache=True), r"indices must be"),
        (lambda: sd.flash_mla_with_kvcache(q, cache, indices=idx), r"is_fp8_kvcache must be True"),
    ]
    for call, message in cases:
        with pytest.raises(UnsupportedCase, match=message):
            call()
