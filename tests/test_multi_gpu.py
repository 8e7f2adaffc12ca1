"""Several GPUs in one process (users H100 to 8 cards).

SGLang makes one GPU current per worker process, but a process that drives several GPUs (a script, a
test, a future SGLang layout) calls an op with inputs on cuda:1 while cuda:0 is current. Triton launches
on the current device and its current stream, so without a guard such a call would run on the wrong GPU;
the compiled ops keep per-device state (kernel attributes, PDL switch, counters, workspaces). These tests
check, on the second GPU while the first stays current, each op against its float64 reference (the
per-op tolerances of the op's own test file), that nothing lands on the first GPU, that per-device state
does not leak between GPUs when calls alternate, that a CUDA graph captured on the second GPU replays the
eager result, and that one process per GPU (SGLang's layout) passes the self-test on its own GPU.
Those need >= 2 CUDA devices and skip otherwise; the guard's pass-through and signatures are checked on CPU.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import HAS_CUDA, ROOT

N_DEV = torch.cuda.device_count() if HAS_CUDA else 0


def two_gpus(test):
    """GPU test on two devices, run with cuda:0 current (fixture first_gpu_current)."""
    test = pytest.mark.usefixtures("first_gpu_current")(test)
    test = pytest.mark.skipif(N_DEV < 2, reason=f"needs 2 CUDA devices, this machine has {N_DEV}")(test)
    return pytest.mark.gpu(test)


OTHER = "cuda:1"


def test_device_guard_switches_only_when_the_input_is_on_another_gpu(monkeypatch):
    """CPU: the Triton ops carry the guard, which makes the first argument's GPU current for the call when
    another one is current (a stand-in tensor claims to live on cuda:1), and calls straight through
    otherwise (CPU inputs, or the input's GPU already current: the usual case, one GPU per process)."""
    from deepseek_v4_kernel.ops import fp4_moe, hc_prenorm, indexer_logits
    from deepseek_v4_kernel.ops._device import on_input_device

    for f in (indexer_logits.paged_mqa_logits, indexer_logits.mqa_logits, hc_prenorm.hc_prenorm_gemm,
              fp4_moe.fp4_moe):
        assert getattr(f, "__wrapped__", None) is not None, f"{f.__name__} has no device guard"

    class OnSecondGpu(torch.Tensor):
        is_cuda = property(lambda self: True)
        device = property(lambda self: torch.device("cuda", 1))

    entered, current = [], [0]

    class FakeDeviceGuard:
        def __init__(self, d):
            self.d = d

        def __enter__(self):
            entered.append(self.d)
            current.insert(0, self.d.index)

        def __exit__(self, *exc):
            current.pop(0)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(torch.cuda, "device", FakeDeviceGuard)
    seen = []

    @on_input_device
    def op(x, y=None, *, z=0):
        seen.append((current[0], y, z))
        return "ran"

    t = torch.ones(2).as_subclass(OnSecondGpu)
    assert op(t, 3, z=4) == "ran" and op(x=t) == "ran"
    assert entered == [torch.device("cuda", 1)] * 2 and seen == [(1, 3, 4), (1, None, 0)] and current == [0]
    assert op(torch.ones(2)) == "ran" and op(None) == "ran" and len(entered) == 2   # CPU / no tensor
    current[0] = 1
    assert op(t) == "ran" and len(entered) == 2                                     # already current


@pytest.fixture
def first_gpu_current(request):
    """cuda:0 current during the test; unless the test itself uses cuda:0, its allocated bytes must not
    change (nothing of a cuda:1 call lands there); the current device is still cuda:0 afterwards."""
    torch.cuda.set_device(0)
    torch.cuda.synchronize(0)
    before = torch.cuda.memory_allocated(0)
    yield
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0, "an op left another device current"
    if request.node.get_closest_marker("uses_first_gpu") is None:
        assert torch.cuda.memory_allocated(0) == before, "a cuda:1 call allocated on cuda:0"


@pytest.mark.parametrize("op", ["sparse_decode", "indexer_logits", "hc_prenorm", "fp4_moe"])
@two_gpus
def test_selftest_check_on_the_second_gpu(op):
    from deepseek_v4_kernel import selftest

    assert "rel err" in selftest.CHECKS[op](device=OTHER)   # asserts against the float64 reference inside


@two_gpus
def test_sparse_decode_every_impl_on_the_second_gpu():
    from test_sparse_decode import _case, _check, _to_cuda

    from deepseek_v4_kernel.ops import sparse_decode as sd

    a = _to_cuda(_case(b=3, s_q=2, h_q=64, topk=67, extra_topk=100, stride_pad=576, with_len=True,
                       with_extra_len=True, sink=True, seed=21), OTHER)
    for impl in ("mma64", "mma64h32", "mma64h16", "mma64ws", "mma64wsh32", "mma64wsh16", "mma64wsh16deep", "mma",
                 "simt"):
        out, lse = sd.sparse_decode(**a, impl=impl)
        torch.cuda.synchronize(1)
        assert out.device == torch.device(OTHER) and lse.device == torch.device(OTHER)
        _check(a, out, lse)
    # the decode step's shape (main 128 + extra 512 at b = 1): the launch rule's many splits and the small-grid
    # combine (17-24 splits in one round trip, two blocks per head row), sized from cuda:1's SM count
    a = _to_cuda(_case(b=1, s_q=1, h_q=64, topk=128, extra_topk=512, sink=True, seed=22), OTHER)
    out, lse = sd.sparse_decode(**a)
    torch.cuda.synchronize(1)
    _check(a, out, lse)
    # and at b = 40 (one 64-head block per row, 20 tiles): "auto" runs the warp-specialised kernel there
    a = _to_cuda(_case(b=40, s_q=1, h_q=64, topk=128, extra_topk=512, n_extra=1200, sink=True, seed=23), OTHER)
    assert sd.launch_kernel(64, "auto", sd.mma64_launch(40, 1, 64, 640, torch.cuda.get_device_properties(1)
                                                        .multi_processor_count)[2]) == ("mma64ws" if sd.WS else "mma64")
    out, lse = sd.sparse_decode(**a)
    torch.cuda.synchronize(1)
    _check(a, out, lse)
    # a batch 5 rows beyond one wave of cuda:1's SMs: two calls (batch_parts), both launched on cuda:1's stream with
    # cuda:0 current
    sms1 = torch.cuda.get_device_properties(1).multi_processor_count
    assert sd.batch_parts(sms1 + 5, 1, 64, 640, sms1) == (sms1,)
    a = _to_cuda(_case(b=sms1 + 5, s_q=1, h_q=64, topk=128, extra_topk=512, n_extra=1200, with_len=True, sink=True,
                       seed=24), OTHER)
    assert torch.cuda.current_device() == 0
    out, lse = sd.sparse_decode(**a)
    torch.cuda.synchronize(1)
    _check(a, out, lse)


def _needs_hc_prenorm_extension():
    from deepseek_v4_kernel._ext import has_hc_prenorm
    if not has_hc_prenorm():
        pytest.skip("the CUDA extension with the hc_prenorm kernel is not built: scripts/build_ext.sh")


@pytest.mark.parametrize("impl,P", [("triton", None), ("cuda", 4), ("cuda", 1)])
@pytest.mark.parametrize("num_splits", [None, 2])
@two_gpus
def test_hc_prenorm_both_kernels_on_the_second_gpu(impl, P, num_splits):
    from test_hc_prenorm import _check, _inputs, _poisoned

    from deepseek_v4_kernel.ops import hc_prenorm as hp

    if impl == "cuda":
        _needs_hc_prenorm_extension()
    m, K = 100, 4096
    x, fn = _inputs(m, K, device=OTHER, seed=5)
    out, sq = _poisoned(m, 24, num_splits or 1, OTHER, flat=num_splits is None)
    hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl=impl, _config={"p": P} if P else None)
    torch.cuda.synchronize(1)
    assert hp.api.last_launch[0] == impl
    _check(x, fn, out, sq, num_splits)


@pytest.mark.parametrize("m,num_splits", [(1, None), (33, None), (5, 64), (64, 64)])
@two_gpus
def test_hc_prenorm_few_rows_kernel_on_the_second_gpu(m, num_splits):
    """The decode kernels (kernel_small.cuh) at DeepSeek-V4's K on cuda:1 while cuda:0 is current: SGLang's 64
    splits, and num_splits None (m = 1: the whole-K kernel; m = 33: sub-slices added by float atomics after the zero
    kernel, and with the fixed order asked for, their partials in the per-stream workspace summed by the reduce
    grid), each with the few-rows kernel and with what "auto" takes (16-row MMA tiles from m = 16); eager against
    float64, then a CUDA graph captured on cuda:1 replays onto poisoned outputs the eager result (fixed order) or a
    result float64 accepts (atomic sum)."""
    from fuzz import replay_on_poisoned
    from test_hc_prenorm import _check, _inputs, _poisoned

    from deepseek_v4_kernel.ops import hc_prenorm as hp

    _needs_hc_prenorm_extension()
    x, fn = _inputs(m, 16384, device=OTHER, seed=40 + m)
    # mma_rows 0: the few-rows kernel's rule (without it "auto" takes 16-row MMA tiles from m = 16), then "auto"
    for cfg in ({"mma_rows": 0}, {"atomic": False, "mma_rows": 0}, None, {"atomic": False}):
        out, sq = _poisoned(m, 24, num_splits or 1, OTHER, flat=num_splits is None)
        hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=cfg)
        torch.cuda.synchronize(1)
        if hp.fnrow_enabled(m, 16384, num_splits or 1, 24, cfg):   # m = 1 one split: the whole-K kernel
            assert hp.api.last_launch == ("cuda", 1, "fnrow", None, None), hp.api.last_launch
        else:   # R > 0: the few-rows kernel (or, auto from m = 16, 16-row MMA tiles); num_splits None: atomic unless
            # asked not to
            want = None if num_splits else "reduce" if cfg and "atomic" in cfg else "atomic"
            kernel = hp.api.last_launch[2] > 0 if cfg and "mma_rows" in cfg or m < 16 else hp.api.last_launch[4] == 16
            assert hp.api.last_launch[0] == "cuda" and kernel and hp.api.last_launch[3] == want, hp.api.last_launch
        assert out.device == torch.device(OTHER) and sq.device == torch.device(OTHER)
        _check(x, fn, out, sq, num_splits)
        e_out, e_sq, atomic = out.clone(), sq.clone(), hp.api.last_launch[3] == "atomic"
        with torch.cuda.device(1):
            replay_on_poisoned(lambda: hp.hc_prenorm_gemm(x, fn, out, sq, num_splits, impl="cuda", _config=cfg),
                               lambda _: (out, sq))
        if atomic:
            _check(x, fn, out, sq, num_splits)
        else:
            assert torch.equal(out, e_out) and torch.equal(sq, e_sq)


@pytest.mark.parametrize("impl", ["dequant", "cuda_decode", "cuda_stream"])
@two_gpus
def test_fp4_moe_both_kernels_on_the_second_gpu(impl):
    from fp4_moe_cases import make_routing, make_weights, run_and_check

    E, H, I, M = 8, 1024, 512, 5
    w = make_weights(E, H, I, OTHER, torch.float32, seed=3)
    tw, ids = make_routing(M, E, 4, OTHER, drop=0.2)
    x = torch.randn(M, H, device=OTHER).bfloat16()
    if impl in ("cuda_decode", "cuda_stream"):
        from deepseek_v4_kernel.ops import fp4_moe as op
        why = (op.dispatch._cuda_decode_unsupported if impl == "cuda_decode" else
               op.dispatch._cuda_stream_unsupported)(x, w[0], w[2], M * 4, H, I)
        if why is not None:
            pytest.skip(f"{impl} does not take this case here: {why}")
    run_and_check(x, w, tw, ids, impl=impl, swiglu_limit=7.0, rsf=1.5)


@two_gpus
def test_indexer_logits_paged_and_flat_on_the_second_gpu():
    from test_indexer_logits import _make_flat, _run_paged
    from test_indexer_logits import _check as check_logits

    from deepseek_v4_kernel.ops import indexer_logits as op
    from deepseek_v4_kernel.reference import indexer_logits as ref

    _run_paged(4, 2, 64, [1, 300, 0, 1000], 1024, OTHER, clean=True, seed=9)
    M, n = 9, 333
    q, kv, w = _make_flat(M, n, 64, OTHER, seed=4)
    ks = torch.tensor([0, 3, 7, 0, 100, 200, 0, 5, 332], dtype=torch.int32)
    ke = torch.tensor([1, 50, 333, 0, 300, 333, 333, 6, 333], dtype=torch.int32)
    out = op.fp8_mqa_logits(q, kv, w, ks.to(OTHER), ke.to(OTHER), clean_logits=True)
    torch.cuda.synchronize(1)
    check_logits(out, ref.mqa_logits_ref(q, kv, w, ks, ke), ref.mqa_logits_ref(q, kv, w, ks, ke, magnitude=True),
                 True)


@pytest.mark.uses_first_gpu
@two_gpus
def test_alternating_gpus_keep_their_own_state():
    """hc_prenorm's sub-split counters and workspaces (Triton's and the few-rows kernel's), sparse decode's split
    workspace and per-device kernel set-up: calls alternating between the GPUs, with different shapes, all match
    the reference."""
    from test_hc_prenorm import _check, _inputs, _poisoned
    from test_sparse_decode import _case
    from test_sparse_decode import _check as check_sd
    from test_sparse_decode import _to_cuda

    from deepseek_v4_kernel.ops import hc_prenorm as hp
    from deepseek_v4_kernel.ops import sparse_decode as sd

    cases = {d: _to_cuda(_case(b=1 + i, s_q=1, h_q=64, topk=128, extra_topk=512, sink=True, seed=30 + i), d)
             for i, d in enumerate(("cuda:0", OTHER))}
    for rnd in range(3):
        for i, d in enumerate(("cuda:0", OTHER) if rnd % 2 == 0 else (OTHER, "cuda:0")):
            m = 70 + 13 * i + rnd
            x, fn = _inputs(m, 2048, device=d, seed=rnd * 2 + i)
            out, sq = _poisoned(m, 24, 1, d, flat=True)
            hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="triton", _config={"p": 4, "r": 1})
            torch.cuda.synchronize(d)
            _check(x, fn, out, sq, None)
            m = 3 + 2 * i + rnd   # the few-rows kernel's sub-slices: each GPU's exchange buffer (m <= 8)
            x, fn = _inputs(m, 16384, device=d, seed=50 + rnd * 2 + i)
            out, sq = _poisoned(m, 24, 1, d, flat=True)
            hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="cuda", _config={"xchg": True})
            torch.cuda.synchronize(d)
            assert hp.api.last_launch[0] == "cuda" and hp.api.last_launch[2] > 0 and hp.api.last_launch[3] == "xchg", hp.api.last_launch
            assert all(b.device == torch.device(d) for k, b in hp.api._XCHG.items() if k[0] == torch.device(d).index)
            _check(x, fn, out, sq, None)
            o, l = sd.sparse_decode(**cases[d])
            torch.cuda.synchronize(d)
            check_sd(cases[d], o, l)


@two_gpus
def test_cuda_graph_on_the_second_gpu_replays_eager():
    """Sparse decode (split: workspace + combine), hc_prenorm with sub-splits (counters) and the paged indexer
    logits captured together into one graph on cuda:1, replayed onto poisoned outputs."""
    from test_hc_prenorm import _inputs
    from test_indexer_logits import _make_paged
    from test_sparse_decode import _case, _to_cuda

    from deepseek_v4_kernel.ops import hc_prenorm as hp
    from deepseek_v4_kernel.ops import indexer_logits as il
    from deepseek_v4_kernel.ops import sparse_decode as sd

    a = _to_cuda(_case(b=1, s_q=2, h_q=64, topk=128, extra_topk=256, with_extra_len=True, sink=True, seed=8), OTHER)
    x, fn = _inputs(96, 4096, device=OTHER, seed=6)
    out = torch.empty(96, 24, device=OTHER)
    sq = torch.empty(96, device=OTHER)
    q, cache, w, cl, bt = _make_paged(3, 1, 64, [700, 5, 64], 1024, OTHER, seed=2)
    logits = torch.empty(3, 1024, device=OTHER)

    def step():
        o, l = sd.sparse_decode(**a)
        hp.hc_prenorm_gemm(x, fn, out, sq, None, impl="triton", _config={"p": 4, "r": 1})
        il.paged_mqa_logits(q, cache, w, cl, bt, 1024, out=logits)
        return o, l

    with torch.cuda.device(1):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            eo, el = step()                          # eager on the capture stream first, as SGLang warms up
            e_out, e_sq, e_logits = out.clone(), sq.clone(), logits.clone()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            go, gl = step()
        for _ in range(2):
            for t in (go, gl, out, sq, logits):
                t.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize(1)
            assert torch.equal(go, eo) and torch.equal(gl, el)
            assert torch.equal(out, e_out) and torch.equal(sq, e_sq) and torch.equal(logits, e_logits)


@two_gpus
def test_one_process_per_gpu_like_sglang_workers():
    """Two processes, each making its own GPU current (as SGLang's TP workers do) and importing the package
    through sitecustomize, run the self-test on "cuda" (the current device) at the same time."""
    code = ("import sys, json, torch; torch.cuda.set_device(int(sys.argv[1])); "
            "from deepseek_v4_kernel import selftest; "
            "r = selftest.run_all(['cuda']); "
            "print(json.dumps({'current': torch.cuda.current_device(), 'results': r}))")
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "DSV4_KERNEL_FORCE": "1", "DSV4_KERNEL_QUIET": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT, env=env) for i in range(2)]
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        d = json.loads(out.strip().splitlines()[-1])
        assert d["current"] == i
        assert d["results"] and all(r["ok"] for r in d["results"]), d["results"]


@two_gpus
def test_doctor_self_tests_every_gpu():
    env = {**os.environ, "DSV4_KERNEL_FORCE": "1", "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "doctor", "--json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    st = json.loads(r.stdout)["selftest"]
    assert {x["device"] for x in st} == {f"cuda:{i}" for i in range(N_DEV)}
    assert all(x["ok"] for x in st), [x for x in st if not x["ok"]]
