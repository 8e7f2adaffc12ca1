"""indexer_logits (paged + flat fp8 MQA logits) vs the float64 reference.

Tolerance: inputs are exact fp8 values and fp32 scales; the kernel accumulates q.k (128 products)
on tensor cores in fp32 (Hopper fp8 MMA keeps ~14 mantissa bits in its accumulator) and sums the
64 weighted heads in fp32. So each element is compared with
    |out - ref| <= 1e-2 * mag + 1e-6 * max|ref|,   mag = scale * sum_h |w_h| * sum_d |q_hd k_d|
(the worst-case rounding bound scale), plus a global relative L2 error < 1e-3 (DeepGEMM's check).
Positions past a row's length must be exactly -inf when clean_logits.
"""
import pytest
import torch

from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.ops import indexer_logits as op
from deepseek_v4_kernel.patch import adapters as ad
from deepseek_v4_kernel.reference import indexer_logits as ref
from aot_errors import skip_or_fail
from fuzz import SEEDS, SM_COUNTS, named, patch_sm_count, replay_on_poisoned


def _make_paged(B, N, H, lens, maxc, device, lens_2d=None, seed=0, extra_blocks=3):
    g = torch.Generator().manual_seed(seed)
    need = [(int(l) + 63) // 64 for l in lens]
    max_blocks = max(1, (maxc + 63) // 64)
    nb = sum(need) + extra_blocks
    k = torch.randn(nb, 64, 128, generator=g) * (0.5 + torch.rand(nb, 64, 1, generator=g) * 4)
    cache = ref.pack_paged_k_cache(k)
    perm = torch.randperm(nb, generator=g).int()
    bt = torch.full((B, max_blocks), -1, dtype=torch.int32)
    c = 0
    for i in range(B):
        bt[i, : need[i]] = perm[c: c + need[i]]
        c += need[i]
    q = (torch.randn(B, N, H, 128, generator=g) * 1.5).to(torch.float8_e4m3fn)
    w = torch.randn(B * N, H, generator=g) * 0.2
    cl = torch.tensor(lens, dtype=torch.int32) if lens_2d is None else lens_2d
    return (q.to(device), cache.to(device), w.to(device), cl.to(device), bt.to(device))


# Error model: the fp8 x fp8 products are exact and summed in fp32 (tensor cores; Hopper's fp8 MMA keeps ~14 bits of
# its accumulator within a K chunk), the head sum and the scale in fp32: each logit is off by at most ~2^-14 of its
# magnitude sum_h |w| sum_d |q k| per 32-wide K chunk, 4 chunks of D = 128: ELEMENT_TOL = 2^-12 of the magnitude.
ELEMENT_TOL = 2.0 ** -12


def _check(out, r, mag, clean):
    out = out.double().cpu()
    fin = torch.isfinite(r)
    if clean:
        assert torch.equal(torch.isneginf(out), ~fin), "-inf mask mismatch"
        assert not torch.isnan(out).any()
    assert not torch.isnan(out[fin]).any(), "unwritten (NaN) valid element"
    if fin.any():
        err = (out[fin] - r[fin]).abs()
        tol = ELEMENT_TOL * mag[fin] + 1e-6 * r[fin].abs().max()
        assert (err <= tol).all(), f"max err {err.max().item()} (tol {tol[err.argmax()].item()})"
        rel = (err.norm() / r[fin].norm().clamp(min=1e-30)).item()
        assert rel < 1e-3, rel


def test_check_fails_wrong_outputs():
    """The check itself: an all-zero output, a one-element error of 1 % and a sign flip of one logit must fail it (the
    per-element tolerance is far below the logits' size), the reference itself passes."""
    q, cache, w, cl, bt = _make_paged(2, 1, 16, [70, 131], 160, "cpu", seed=7)
    r = ref.paged_mqa_logits_ref(q, cache, w, cl, bt, 160)
    mag = ref.paged_mqa_logits_magnitude(q, cache, w, cl, bt, 160)
    _check(r.clone(), r, mag, clean=True)
    fin = torch.isfinite(r)
    big = r.abs().masked_fill(~fin, 0).argmax()
    zero = torch.where(fin, torch.zeros_like(r), r)
    one = r.clone().view(-1)
    one[big] *= 1.01
    flip = r.clone().view(-1)
    flip[big] *= -1
    for broken in (zero, one.view_as(r), flip.view_as(r)):
        with pytest.raises(AssertionError):
            _check(broken, r, mag, clean=True)


def _run_paged(B, N, H, lens, maxc, device, clean, lens_2d=None, seed=0):
    q, cache, w, cl, bt = _make_paged(B, N, H, lens, maxc, device, lens_2d=lens_2d, seed=seed)
    if lens_2d is not None:
        cl = lens_2d.to(device)
    poisoned = torch.full((B * N, maxc), float("nan"), device=device)  # every element must be written
    out = op.paged_mqa_logits(q, cache, w, cl, bt, maxc, clean_logits=clean, out=poisoned)
    assert out.shape == (B * N, maxc) and out.dtype == torch.float32
    r = ref.paged_mqa_logits_ref(q, cache, w, cl, bt, maxc)
    mag = ref.paged_mqa_logits_magnitude(q, cache, w, cl, bt, maxc)
    _check(out, r, mag, clean)
    return out


# ------------------------------- CPU-sized (also run on GPU) --------------------------------
@pytest.mark.parametrize("clean", [True, False])
@pytest.mark.parametrize("N", [1, 2, 3, 4])
def test_paged_small(device, N, clean):
    # ragged lengths, an empty row, a length not multiple of 64; page table padded with -1
    lens = [70, 0, 131, 5]
    maxc = 200
    _run_paged(4, N, 16 if N > 2 else 32, lens, maxc, device, clean, seed=N)


def test_paged_2d_lens(device):
    B, N = 3, 2
    lens_2d = torch.tensor([[40, 41], [0, 3], [120, 90]], dtype=torch.int32)
    lens = lens_2d.max(1).values.tolist()
    _run_paged(B, N, 32, lens, 130, device, True, lens_2d=lens_2d, seed=7)


def test_paged_lens_b1_and_fallback_shim(device):
    # SGLang passes seq_lens as [b, 1] with next_n == 1, and clean_logits=False positionally.
    q, cache, w, cl, bt = _make_paged(3, 1, 64, [65, 1, 0], 128, device, seed=3)
    r = ref.paged_mqa_logits_ref(q, cache, w, cl, bt, 128)
    mag = ref.paged_mqa_logits_magnitude(q, cache, w, cl, bt, 128)
    out = ad.fp8_paged_mqa_logits_torch_sm120(q, cache, w, cl[:, None], bt, None, 128, False)
    _check(out, r, mag, clean=True)  # the fallback shim always writes -inf past the length
    meta = op.get_paged_mqa_logits_metadata(cl[:, None], 64, 5)
    assert meta.shape == (6, 2) and meta.dtype == torch.int32
    out2 = op.fp8_paged_mqa_logits(q, cache, w, cl[:, None], bt, meta, 128, clean_logits=True)
    _check(out2, r, mag, clean=True)
    # max_context_len shorter than the page table (SGLang's max_c4_seq_len can be either)
    out3 = op.fp8_paged_mqa_logits(q, cache, w, cl, bt, None, 100, False)
    _check(out3, r[:, :100], mag[:, :100], clean=False)


def test_paged_empty_cache(device):
    # every row empty and a cache of zero blocks (found by the GPU fuzz: the reference could not unpack it)
    q, cache, w, cl, bt = _make_paged(2, 1, 16, [0, 0], 64, device, seed=5, extra_blocks=0)
    assert cache.shape[0] == 0
    out = op.paged_mqa_logits(q, cache, w, cl, bt, 64, clean_logits=True)
    r = ref.paged_mqa_logits_ref(q, cache, w, cl, bt, 64)
    assert torch.isneginf(r).all() and torch.isneginf(out.cpu()).all()


def _invalid_index_case(B, N, H, device, seed):
    """A cache of 6 pages, a block table of 2 columns (128 tokens) and, for any value the indices can take: a length
    past the table and past max_context_len, a negative one, page ids past the cache (up to INT32_MAX: a read there
    faults) and below -1."""
    g = torch.Generator().manual_seed(seed)
    nb, max_blocks, maxc = 6, 2, 320
    cache = ref.pack_paged_k_cache(torch.randn(nb, 64, 128, generator=g) * 2)
    bt = torch.randint(0, nb, (B, max_blocks), generator=g, dtype=torch.int32)
    bt[1, 1] = nb                     # one past the cache
    bt[2, 0] = -7                     # below -1
    bt[3, 1] = 2 ** 31 - 1            # far past the cache
    bt[4, 0] = -(2 ** 31)
    lens = torch.tensor([300, 128, 100, -5, 10 ** 9, 64][:B], dtype=torch.int32)
    q = (torch.randn(B, N, H, 128, generator=g) * 1.5).to(torch.float8_e4m3fn)
    w = torch.randn(B * N, H, generator=g) * 0.2
    return [t.to(device) for t in (q, cache, w, lens, bt)] + [maxc]


@pytest.mark.parametrize("N", [1, 2])
def test_paged_invalid_indices_are_skipped_not_read(device, N):
    """Documented semantics (module docstring): a token whose block-table column is past the table or whose page id
    is < 0 or >= num_blocks is skipped (-inf), never read; lengths clip to [0, max_context_len]. Before: the kernel
    read the block table past its row and pages past the cache (a segfault under the interpreter, an out-of-bounds
    read on a GPU)."""
    q, cache, w, lens, bt, maxc = _invalid_index_case(6, N, 16, device, seed=N)
    r = ref.paged_mqa_logits_ref(q, cache, w, lens, bt, maxc)
    mag = ref.paged_mqa_logits_magnitude(q, cache, w, lens, bt, maxc)
    assert torch.isneginf(r[0 * N, 128:]).all() and torch.isfinite(r[0 * N, :128]).all()   # past the table: skipped
    assert torch.isneginf(r[1 * N + N - 1, 64:128]).all()                                    # page nb: skipped
    in_len = torch.arange(maxc)[None, :] < ref.row_lengths(lens, 6, N)[:, None]
    for clean in (True, False):
        poisoned = torch.full((6 * N, maxc), float("nan"), device=device)
        out = op.paged_mqa_logits(q, cache, w, lens, bt, maxc, clean_logits=clean, out=poisoned)
        _check(out, r, mag, clean)
        # within the lengths a skipped token is -inf also without clean_logits (only the tail may stay unwritten)
        assert torch.isneginf(out.cpu()[in_len & torch.isneginf(r)]).all()


def test_paged_next_n_up_to_8(device):
    """DSpark verify (DeepSeek-V4-Flash-0731): up to 8 draft tokens per request, 64 heads; with 1-D and 2-D lengths
    (next_n > 4 runs as rows of next_n = 1 sharing their request's block-table row)."""
    lens = [70, 0, 131]
    for N, H in ((8, 64), (5, 16), (4, 128)):
        _run_paged(3, N, H, lens, 160, device, clean=True, seed=N)
        lens_2d = torch.tensor([[i * 9 + j for j in range(N)] for i in range(3)], dtype=torch.int32) + 60
        _run_paged(3, N, H, lens_2d.max(1).values.tolist(), 160, device, clean=True, lens_2d=lens_2d, seed=N + 1)


def _make_flat(M, n, H, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    k, s = ref.quantize_k(torch.randn(n, 128, generator=g) * (0.5 + torch.rand(n, 1, generator=g) * 4))
    q = (torch.randn(M, H, 128, generator=g) * 1.5).to(torch.float8_e4m3fn)
    w = torch.randn(M, H, generator=g) * 0.2
    return q.to(device), (k.to(device), s.to(device)), w.to(device)


@pytest.mark.parametrize("clean,max_seqlen_k", [(True, 0), (False, 0), (False, 176)])
def test_flat_small(device, clean, max_seqlen_k):
    M, n, H = 7, 170, 32
    q, kv, w = _make_flat(M, n, H, device, seed=11)
    ks = torch.tensor([0, 0, 5, 30, 0, 169, 100], dtype=torch.int32)
    ke = torch.tensor([0, 1, 120, 170, 170, 170, 90], dtype=torch.int32)  # last row empty (ke < ks)
    out = op.fp8_mqa_logits(q, kv, w, ks.to(device), ke.to(device), clean_logits=clean,
                            max_seqlen_k=max_seqlen_k)
    width = max_seqlen_k or n
    assert out.shape == (M, width)
    r = ref.mqa_logits_ref(q, kv, w, ks, ke, max_seqlen_k=max_seqlen_k)
    mag = ref.mqa_logits_ref(q, kv, w, ks, ke, max_seqlen_k=max_seqlen_k, magnitude=True)
    _check(out, r, mag, clean)


def test_bad_inputs(device):
    q, cache, w, cl, bt = _make_paged(2, 1, 32, [10, 20], 64, device)
    # each message names the argument, what was expected and what came
    with pytest.raises(UnsupportedCase, match=r"q must be float8_e4m3fn .*got .*float32"):
        op.paged_mqa_logits(q.float(), cache, w, cl, bt, 64)
    with pytest.raises(UnsupportedCase, match=r"kv_cache must be 1-byte \[num_blocks, 64, 1, 132\], got torch.uint8 \[\d+\]"):
        op.paged_mqa_logits(q, cache.view(-1), w, cl, bt, 64)
    with pytest.raises(UnsupportedCase, match=r"weights must be float32 or bf16 \[2, 32\], got torch.float32 \[1, 32\]"):
        op.paged_mqa_logits(q, cache, w[:1], cl, bt, 64)
    with pytest.raises(UnsupportedCase, match=r"context_lens must be int32 or int64, got torch.float32"):
        op.paged_mqa_logits(q, cache, w, cl.float(), bt, 64)
    with pytest.raises(UnsupportedCase, match=r"context_lens must be int32 \[2\] or \[2, 1\], got torch.int32 \[3\]"):
        op.paged_mqa_logits(q, cache, w, torch.cat([cl, cl[:1]]), bt, 64)
    with pytest.raises(UnsupportedCase, match=r"block_table must be int32 or int64 \[2, max_blocks\], got torch.float32"):
        op.paged_mqa_logits(q, cache, w, cl, bt.float(), 64)
    with pytest.raises(UnsupportedCase, match=r"max_context_len must be an integer >= 0, got -1"):
        op.paged_mqa_logits(q, cache, w, cl, bt, -1)
    with pytest.raises(UnsupportedCase, match=r"out must be float32 \[2, 64\] .*got torch.float32 \[2, 63\]"):
        op.paged_mqa_logits(q, cache, w, cl, bt, 64, out=torch.empty(2, 63, device=device))
    with pytest.raises(UnsupportedCase, match=r"indices must be None .*got Tensor"):
        op.fp8_paged_mqa_logits(q, cache, w, cl, bt, None, 64, False, indices=cl)
    qf, kv, wf = _make_flat(3, 10, 32, device)
    z = torch.zeros(3, dtype=torch.int32, device=device)
    with pytest.raises(UnsupportedCase, match=r"clean_logits=True with max_seqlen_k > 0"):
        op.fp8_mqa_logits(qf, kv, wf, z, z, clean_logits=True, max_seqlen_k=16)
    with pytest.raises(UnsupportedCase, match=r"kv must be a tuple .*got Tensor"):
        op.fp8_mqa_logits(qf, kv[0], wf, z, z, clean_logits=False)
    # a tensor on another device than q: named in the error (meta stands in for a second GPU on CPU CI)
    with pytest.raises(UnsupportedCase, match=r"weights must be on .*the device of q.*meta"):
        op.paged_mqa_logits(q, cache, w.to("meta"), cl, bt, 64)
    with pytest.raises(UnsupportedCase, match=r"block_table must be on"):
        op.paged_mqa_logits(q, cache, w, cl, bt.to("meta"), 64)
    with pytest.raises(UnsupportedCase, match=r"cu_seq_len_k_end must be on"):
        op.fp8_mqa_logits(qf, kv, wf, z, z.to("meta"), clean_logits=False)
    with pytest.raises(UnsupportedCase, match=r"kv\[1\] must be on"):
        op.fp8_mqa_logits(qf, (kv[0], kv[1].to("meta")), wf, z, z, clean_logits=False)


def test_reference_packer_roundtrip():
    k = torch.randn(2, 64, 128) * 3
    cache = ref.pack_paged_k_cache(k)
    vals, sc = ref.unpack_paged_k_cache(cache)
    deq = vals * sc[..., None]
    assert ((deq - k.double()).abs() <= 0.07 * k.double().abs().amax(-1, keepdim=True)).all()


# ------------------------------------- GPU-only sizes -----------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("N,H", [(1, 64), (2, 64), (4, 64), (3, 32), (1, 32)])
def test_paged_gpu_large(N, H):
    lens = [0, 1, 4097, 20000, 12345, 64, 8191, 3000]
    maxc = 20480
    _run_paged(len(lens), N, H, lens, maxc, "cuda", clean=True, seed=N * 10 + H)
    _run_paged(len(lens), N, H, lens, maxc, "cuda", clean=False, seed=N * 10 + H + 1)


@pytest.mark.gpu
def test_flat_gpu_prefill():
    M, n, H = 300, 2048, 64
    q, kv, w = _make_flat(M, n, H, "cuda", seed=5)
    ke = torch.linspace(1, n, M).int()
    ks = torch.zeros(M, dtype=torch.int32)
    ks[::7] = ke[::7] // 3
    for clean, msk in [(True, 0), (False, 0), (False, 2048)]:
        out = op.fp8_mqa_logits(q, kv, w, ks.cuda(), ke.cuda(), clean_logits=clean, max_seqlen_k=msk)
        r = ref.mqa_logits_ref(q, kv, w, ks, ke, max_seqlen_k=msk)
        mag = ref.mqa_logits_ref(q, kv, w, ks, ke, max_seqlen_k=msk, magnitude=True)
        _check(out, r, mag, clean)


@pytest.mark.gpu
def test_cuda_graph_and_smem():
    q, cache, w, cl, bt = _make_paged(8, 1, 64, [100, 5000, 0, 64, 7000, 1, 2, 3], 8192, "cuda")
    out = op.paged_mqa_logits(q, cache, w, cl, bt, 8192, clean_logits=True)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out_g = op.paged_mqa_logits(q, cache, w, cl, bt, 8192, clean_logits=True)
    cl2 = cl.clone()
    cl.copy_(torch.tensor([1, 1, 1, 1, 1, 1, 1, 1], dtype=torch.int32))
    g.replay()
    torch.cuda.synchronize()
    assert torch.isneginf(out_g[:, 1:]).all()
    cl.copy_(cl2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_g, out)
    # compiled shared memory of every specialization this session built
    paged, flat = op._kernels()
    n = 0
    for kern in (paged, flat):
        for cache_ in kern.device_caches.values():
            for compiled in cache_[0].values():
                assert compiled.metadata.shared <= op.SMEM_LIMIT, compiled.metadata.shared
                n += 1
    assert n >= 1


def test_shim_signatures():
    """Keyword names/order as DeepGEMM's pybind registration and SGLang's fallbacks (docs/indexer_logits.md)."""
    import inspect

    def params(f):
        return [(p.name, p.default) for p in inspect.signature(f).parameters.values()]

    E = inspect.Parameter.empty
    assert params(op.fp8_paged_mqa_logits) == [
        ("q", E), ("kv_cache", E), ("weights", E), ("context_lens", E), ("block_table", E),
        ("schedule_meta", E), ("max_context_len", E), ("clean_logits", False), ("indices", None)]
    assert params(op.fp8_mqa_logits) == [
        ("q", E), ("kv", E), ("weights", E), ("cu_seq_len_k_start", E), ("cu_seq_len_k_end", E),
        ("clean_logits", True), ("max_seqlen_k", 0)]
    assert params(op.get_paged_mqa_logits_metadata) == [
        ("context_lens", E), ("block_kv", E), ("num_sms", E), ("indices", None)]
    for f in (ad.fp8_paged_mqa_logits_torch, ad.fp8_paged_mqa_logits_torch_sm120, ad.tilelang_fp8_paged_mqa_logits):
        assert params(f) == [
            ("q_fp8", E), ("kvcache_fp8", E), ("weight", E), ("seq_lens", E), ("page_table", E),
            ("deep_gemm_metadata", E), ("max_seq_len", E), ("clean_logits", True)]


# ----------------------------------------------------------------------------- sm_120 AOT (CPU)
@pytest.fixture(scope="module")
def sm120_aot():
    """Every launch configuration the op can pick (paged next_n 1..4 x heads 16..128 with 1-D / 2-D
    lengths, flat with absolute / relative columns), compiled for sm_120a by tools/aot_indexer_logits.py
    in a subprocess (this process may run Triton in interpreter mode)."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "aot_indexer_logits.py"), "--arch", "120"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=root)
    if r.returncode != 0:
        skip_or_fail(r.stderr, "sm_120 AOT compile")
    return [json.loads(ln[3:]) for ln in r.stdout.splitlines() if ln.startswith("AOT")]


def test_sm120_aot_smem_registers_and_instructions(sm120_aot):
    """On sm_120a every configuration compiles, fits 101376 B of shared memory (the H100 GPU tests
    cannot show it: 227 KB there, and wgmma instead of mma.sync changes the tiles' footprint), spills
    nothing, and runs its fp8 dot on mma.sync (no wgmma / tcgen05, which SM120 lacks)."""
    # 14 paged (next_n, heads) pairs within next_n * heads <= 256, 10 of them with 2-D lengths too; 8 flat
    assert len(sm120_aot) == 32, len(sm120_aot)
    for d in sm120_aot:
        assert "error" not in d, d
        assert d["target"] == "sm_120a", d
        assert d["shared"] <= op.SMEM_LIMIT, d
        assert d["local"] == 0 and d["stack"] == 0, d   # no spills
        assert d["mma_sync"] and d["fp8_mma"] and not d["wgmma"] and not d["tcgen05"], d


def test_launch_configs_are_what_the_aot_check_compiles(monkeypatch):
    """The op launches with paged_config / flat_config (the functions the sm_120a check compiles): a
    changed config there changes the launch."""
    seen = {}

    class FakeKernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen[self.name] = kw
            return launch

    monkeypatch.setattr(op, "_kernels", lambda: (FakeKernel("paged"), FakeKernel("flat")))
    monkeypatch.setattr(op, "paged_config", lambda n, h: (op._next_pow2(n), 32, 2, 5))
    monkeypatch.setattr(op, "flat_config", lambda h: (3, 32, 2, 5))
    q, cache, w, cl, bt = _make_paged(2, 1, 64, [100, 70], 128, "cpu")
    op.paged_mqa_logits(q, cache, w, cl, bt, 128)
    assert (seen["paged"]["BLOCK_T"], seen["paged"]["num_warps"], seen["paged"]["NUM_STAGES"]) == (32, 2, 5)
    qf = (torch.randn(5, 64, 128) * 1.5).to(torch.float8_e4m3fn)
    kv = ((torch.randn(40, 128)).to(torch.float8_e4m3fn), torch.rand(40) + 0.5)
    op.mqa_logits(qf, kv, torch.randn(5, 64), torch.zeros(5, dtype=torch.int32), torch.full((5,), 40, dtype=torch.int32))
    assert (seen["flat"]["BR"], seen["flat"]["BLOCK_T"], seen["flat"]["num_warps"], seen["flat"]["NUM_STAGES"]) \
        == (3, 32, 2, 5)


# ------------------------------------- GPU fuzz -----------------------------------------------
# Random calls beyond the hand-picked cases (paged: batch, next_n, heads, ragged / 2-D lengths, the output
# width against the page table, clean or not, a caller's out; flat: rows, keys, windows (empty ones
# included), width, clean or not), the grid sized for 188 / 170 / 24 SMs or this GPU's (op._sm_count); every third
# paged call also replayed from a CUDA graph. Seeds (8 per run by default) and failure naming: tests/fuzz.py.
@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS)
def test_gpu_fuzz_paged(monkeypatch, seed):
    import random
    r = random.Random(seed)
    N = r.choice([1, 1, 2, 3, 4])
    H = r.choice([16, 32, 64])   # next_n * heads <= 256
    maxc = r.choice([r.randint(1, 300), r.randint(1, 9000)])
    B = max(1, min(int(2 ** r.uniform(0, 6)), 30_000_000 // (N * H * maxc)))
    lens = [r.choice([0, maxc, r.randint(0, maxc)]) for _ in range(B)]
    lens_2d = None
    if N > 1 and r.random() < 0.4:   # per next_n position, each at most its row's pages
        lens_2d = torch.tensor([[r.randint(0, l) for _ in range(N)] for l in lens], dtype=torch.int32)
        lens = lens_2d.max(1).values.tolist()
    width = maxc if r.random() < 0.7 else r.randint(1, maxc)
    clean = r.random() < 0.5
    sms = r.choice(SM_COUNTS)
    desc = f"seed {seed}: B={B} N={N} H={H} maxc={maxc} width={width} lens_2d={lens_2d is not None} clean={clean} sms={sms}"
    print(desc)
    patch_sm_count(monkeypatch, op, "_sm_count", sms)
    q, cache, w, cl, bt = _make_paged(B, N, H, lens, maxc, "cuda", lens_2d=lens_2d, seed=seed,
                                      extra_blocks=r.randint(0, 5))
    out = None
    if r.random() < 0.5:
        out = torch.full((B * N, width), float("nan"), device="cuda")
    got = op.paged_mqa_logits(q, cache, w, cl, bt, width, clean_logits=clean, out=out)
    assert out is None or got is out
    assert got.shape == (B * N, width) and got.dtype == torch.float32
    rr = ref.paged_mqa_logits_ref(q, cache, w, cl, bt, width)
    mag = ref.paged_mqa_logits_magnitude(q, cache, w, cl, bt, width)
    with named(desc):
        _check(got, rr, mag, clean)
    if seed % 3 == 0:   # every third call also replayed from a CUDA graph (the decode path runs captured)
        gl = replay_on_poisoned(lambda: op.paged_mqa_logits(q, cache, w, cl, bt, width, clean_logits=clean),
                                lambda res: (res,))
        keep = torch.ones_like(gl, dtype=torch.bool) if clean else torch.isfinite(rr).to(gl.device)
        assert torch.equal(gl[keep], got[keep]), f"graph replay differs from eager: {desc}"   # unspecified past


@pytest.mark.gpu
@pytest.mark.parametrize("seed", SEEDS)
def test_gpu_fuzz_flat(monkeypatch, seed):
    import random
    r = random.Random(seed)
    H = r.choice([16, 32, 64])
    n = r.randint(1, 3000)
    M = max(1, min(int(2 ** r.uniform(0, 9)), 20_000_000 // (H * n)))
    q, kv, w = _make_flat(M, n, H, "cuda", seed=seed)
    g = torch.Generator().manual_seed(seed)
    ks = torch.randint(0, n + 1, (M,), generator=g, dtype=torch.int32)   # windows in [0, n]; ke < ks: empty
    ke = (ks + torch.randint(-5, n, (M,), generator=g, dtype=torch.int32)).clamp(0, n)
    if r.random() < 0.5:   # the prefill shape: windows [0 or a start, causal end]
        ke = torch.linspace(1, n, M).int()
        ks = torch.where(torch.rand(M, generator=g) < 0.3, ke // 3, torch.zeros_like(ke))
    msk = r.choice([0, 0, r.randint(1, n + 50)])
    clean = r.random() < 0.5
    sms = r.choice(SM_COUNTS)
    desc = f"seed {seed}: M={M} n={n} H={H} max_seqlen_k={msk} clean={clean} sms={sms}"
    print(desc)
    patch_sm_count(monkeypatch, op, "_sm_count", sms)
    if clean and msk:   # DeepGEMM asserts against this pair; the op names it
        with pytest.raises(UnsupportedCase, match="clean_logits=True with max_seqlen_k > 0"):
            op.fp8_mqa_logits(q, kv, w, ks.cuda(), ke.cuda(), clean_logits=True, max_seqlen_k=msk)
        clean = False
    got = op.fp8_mqa_logits(q, kv, w, ks.cuda(), ke.cuda(), clean_logits=clean, max_seqlen_k=msk)
    assert got.shape == (M, msk or n) and got.dtype == torch.float32
    rr = ref.mqa_logits_ref(q, kv, w, ks, ke, max_seqlen_k=msk)
    mag = ref.mqa_logits_ref(q, kv, w, ks, ke, max_seqlen_k=msk, magnitude=True)
    with named(desc):
        _check(got, rr, mag, clean)


def test_chunk_rule_matches_the_mma_sync_sweep(monkeypatch):
    """Context tiles per program (op._chunk) at the shapes of the H200 mma.sync sweep (docs/indexer_logits.md section
    4): the tile count that was fastest there (b x compressed context -> tiles), on 132 SMs; the rule scales with SMs."""
    monkeypatch.setattr(op, "_sm_count", lambda device: 132)
    best = {(1, 16384): 1, (2, 16384): 1, (8, 4096): 1, (8, 16384): 4, (8, 65536): 4, (32, 16384): 4,
            (32, 65536): 16, (128, 16384): 16}
    for (b, ctx), tiles in best.items():
        assert op._chunk(ctx // 128, b, 128, None) == tiles * 128, (b, ctx)
    assert op._chunk(65536 // 128, 10, 128, None) == 8 * 128
    monkeypatch.setattr(op, "_sm_count", lambda device: 188)   # RTX PRO 6000: more programs before tiles grow
    assert op._chunk(65536 // 128, 10, 128, None) == 4 * 128
    assert op._chunk(1, 1, 64, None) == 64 and op._chunk(1 << 20, 1, 128, None) == 64 * 128   # bounds: 1..64 tiles
