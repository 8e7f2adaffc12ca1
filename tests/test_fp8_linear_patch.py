"""The fp8_linear rows (block-FP8 linears and FP8 wo_a; docs/sglang_surface.md) against the real SGLang wheels, and
their adapters (patch/fp8_adapters.py) on a float64 stand-in of ops.fp8_linear (tests/fp8_linear_fake.py; the op
itself is tested with its own module).

* the adapters map SGLang's call onto the op (outputs against float64), hand calls above the crossover and any case
  the op rejects back to SGLang's own code with the same arguments (its quantization re-run where ours skipped it);
* the wo_a flag per version, set again in the workers of a launcher that turned it off;
* the real Fp8LinearMethod.apply and deepseek_v4 module globals of the tested wheels are patched and driven.
"""

import ast
import logging
import os
import re
import types

import pytest
import torch

import fp8_linear_fake
from deepseek_v4_kernel.errors import UnsupportedCase
from deepseek_v4_kernel.patch import fp8_adapters, hook, measured, policy, targets
from deepseek_v4_kernel.patch.hook import Record
from sglang_env import REPORT_JSON, parse_report, real_module_prelude, run_child, sglang_dir, stand_in_deep_gemm

FORCE = {"DSV4_KERNEL_FORCE": "1"}
FLAG = targets.FP8_WO_A_ENV
E4M3_MAX = 448.0


def _row(attr, version="0.5.23"):
    return next(t for t in targets.TARGETS if t.attr == attr and t.applies_to_version(version)[0])


def _wrapped(attr, original, version="0.5.23"):
    """The hook's wrapper around ``original`` for the row of ``attr`` (hand-backs counted in the returned record)."""
    t = _row(attr, version)
    rec = Record(t)
    return hook.make_replacement(t, rec, original, hook.resolve(t.replacement)), rec


def block_fp8(n, k, gen, groups=None):
    """e4m3 weight [.., n, k] and its fp32 block scales [.., ceil(n/128), ceil(k/128)] (powers of two: as the
    DeepSeek-V4 checkpoint's UE8M0 scales load)."""
    lead = (groups,) if groups else ()
    w = (torch.randn(*lead, n, k, generator=gen) * 2).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    s = torch.exp2(torch.randint(-9, -5, (*lead, -(-n // 128), -(-k // 128)), generator=gen).float())
    return w, s


def reference(x, w, s):
    """float64 x @ dequant(w)^T (per group for 3-D x [T, G, K] and w [G, N, K])."""
    deq = fp8_linear_fake.make_module().dequant(w, s)
    return torch.einsum("tgk,gnk->tgn", x.double(), deq) if x.dim() == 3 else x.double() @ deq.t()


def quant_per_group(x, group=128):
    """A torch stand-in of SGLang's per-token-group quantization: e4m3 [.., K] and fp32 scales [.., K/group]."""
    xs = x.float().unflatten(-1, (-1, group))
    s = (xs.abs().amax(-1, keepdim=True) / E4M3_MAX).clamp(min=1e-10)
    return (xs / s).to(torch.float8_e4m3fn).flatten(-2), s.squeeze(-1)


@pytest.fixture
def op(monkeypatch):
    monkeypatch.delenv("DSV4_KERNEL_STRICT", raising=False)
    monkeypatch.delenv(policy.PREFER, raising=False)
    return fp8_linear_fake.install(monkeypatch)


# ----------------------------------------------------------------------------- Fp8LinearMethod.apply
def _method(**kw):
    base = dict(use_marlin=False, use_mxfp8=False, block_quant=True, weight_block_size=[128, 128],
                block_fp8_as_mxfp8=False)
    base.update(kw)
    return types.SimpleNamespace(**base)


class SGLangApply:
    """Records the calls of the original method (SGLang's own backend would run there)."""

    def __init__(self):
        self.calls = []

    def __call__(self, me, layer, x, bias=None):
        self.calls.append((me, layer, x, bias))
        return "sglang"


@pytest.mark.parametrize("shape", [(1, 256), (5, 256), (2, 3, 256), (64, 256)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_apply_runs_ours_on_sglangs_parameters(op, shape, with_bias):
    gen = torch.Generator().manual_seed(sum(shape) + with_bias)
    w, s = block_fp8(320, 256, gen)   # N not a multiple of 128: the last scale row covers 64 rows
    layer = types.SimpleNamespace(weight=w, weight_scale_inv=s)
    x = torch.randn(*shape, generator=gen).bfloat16()
    bias = torch.randn(320, generator=gen).bfloat16() if with_bias else None
    original = SGLangApply()
    apply, rec = _wrapped("Fp8LinearMethod.apply", original)
    y = apply(_method(), layer, x, bias)
    ref = reference(x.reshape(-1, 256), w, s) + (bias.double() if with_bias else 0)
    assert y.dtype == torch.bfloat16 and y.shape == (*shape[:-1], 320)
    err = ((y.reshape(-1, 320).double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-2, err
    assert not original.calls and rec.handbacks == 0 and rec.kept == 0
    assert op.CALLS[-1] == ("fp8_linear", dict(m=x.numel() // 256, block_size=(128, 128), bias=with_bias))


def test_apply_hands_back_above_the_crossover_and_what_ours_rejects(op, caplog):
    gen = torch.Generator().manual_seed(1)
    w, s = block_fp8(256, 256, gen)
    layer = types.SimpleNamespace(weight=w, weight_scale_inv=s)
    original = SGLangApply()
    apply, rec = _wrapped("Fp8LinearMethod.apply", original)
    me = _method()
    with caplog.at_level(logging.INFO, logger="deepseek_v4_kernel"):
        for m in (fp8_adapters.FP8_LINEAR_MAX_M + 1, 500):
            x = torch.randn(m, 256, generator=gen).bfloat16()
            assert apply(me, layer, x) == "sglang" and original.calls[-1] == (me, layer, x, None)
        assert rec.kept == 2 and rec.handbacks == 0 and len(rec.kept_reasons) == 1   # one reason, said once
        op.REJECT.append("fp8_linear: N must be a multiple of 64, got 100")
        x = torch.randn(3, 256, generator=gen).bfloat16()
        bias = torch.zeros(256).bfloat16()
        for _ in range(3):
            assert apply(me, layer, x, bias) == "sglang" and original.calls[-1] == (me, layer, x, bias)
    assert rec.handbacks == 3 and rec.handback_reasons == {"fp8_linear: N must be a multiple of 64, got 100": 3}
    assert caplog.text.count("handing this call back") == 1 and caplog.text.count("keeping the original") == 1
    assert not [c for c in op.CALLS if c[0] == "fp8_linear"]


@pytest.mark.parametrize("case, expect", [
    (dict(me=dict(use_marlin=True)), "Marlin"),
    (dict(me=dict(use_mxfp8=True)), "MXFP8 checkpoint"),
    (dict(me=dict(block_quant=False, weight_block_size=None)), "not block-scaled"),
    (dict(me=dict(block_fp8_as_mxfp8=True), layer=dict(block_fp8_mxfp8_ready=True)), "MXFP8 view"),
    (dict(x="tuple"), "pre-quantized"),
    (dict(x="fp16"), "bfloat16"),
    (dict(layer=dict(weight="bf16")), "float8_e4m3fn"),
    (dict(x="empty"), "no rows"),
])
def test_apply_hands_back_layers_and_inputs_ours_does_not_take(op, case, expect):
    gen = torch.Generator().manual_seed(2)
    w, s = block_fp8(128, 256, gen)
    layer = types.SimpleNamespace(weight=w, weight_scale_inv=s, **{k: v for k, v in case.get("layer", {}).items()
                                                                   if k != "weight"})
    if case.get("layer", {}).get("weight") == "bf16":
        layer.weight = w.to(torch.bfloat16)
    x = torch.randn(2, 256, generator=gen).bfloat16()
    x = {"tuple": (x.to(torch.float8_e4m3fn), torch.ones(2, 2)), "fp16": x.half(), "empty": x[:0]}.get(
        case.get("x"), x)
    original = SGLangApply()
    apply, rec = _wrapped("Fp8LinearMethod.apply", original)
    me = _method(**case.get("me", {}))
    assert apply(me, layer, x) == "sglang" and original.calls == [(me, layer, x, None)]
    assert rec.handbacks == 1 and expect in next(iter(rec.handback_reasons)), rec.handback_reasons


def test_apply_without_the_op_hands_back_and_strict_raises(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, fp8_linear_fake.NAME, None)   # `import` raises ImportError
    monkeypatch.delenv("DSV4_KERNEL_STRICT", raising=False)
    gen = torch.Generator().manual_seed(3)
    w, s = block_fp8(128, 128, gen)
    layer = types.SimpleNamespace(weight=w, weight_scale_inv=s)
    original = SGLangApply()
    apply, rec = _wrapped("Fp8LinearMethod.apply", original)
    x = torch.randn(2, 128, generator=gen).bfloat16()
    assert apply(_method(), layer, x) == "sglang" and "not importable" in next(iter(rec.handback_reasons))
    monkeypatch.setenv("DSV4_KERNEL_STRICT", "1")
    with pytest.raises(UnsupportedCase, match="not importable"):
        apply(_method(), layer, x)


def test_apply_keeps_sglang_where_the_measured_file_says_it_won(op, monkeypatch):
    m = measured.Measured(True, "read test", files=["t.json"], classes={"fp8_linear": {
        "m2-8": {"winner": "sglang", "handback_runnable": True, "sglang": "triton", "ours_us": 9, "sglang_us": 7},
        "m1": {"winner": "ours"}}})
    monkeypatch.setattr(measured, "load", lambda: m)
    monkeypatch.setenv(policy.PREFER, "measured")
    gen = torch.Generator().manual_seed(4)
    w, s = block_fp8(128, 128, gen)
    layer = types.SimpleNamespace(weight=w, weight_scale_inv=s)
    original = SGLangApply()
    apply, rec = _wrapped("Fp8LinearMethod.apply", original)
    assert apply(_method(), layer, torch.randn(1, 128).bfloat16()) is not None and not original.calls
    assert apply(_method(), layer, torch.randn(4, 128).bfloat16()) == "sglang" and rec.kept == 1
    assert "m2-8" in next(iter(rec.kept_reasons))
    assert measured.size_class("fp8_linear", 17) == "m17+" and measured.class_representatives("fp8_linear") == (
        1, 8, 16, 64)


# ----------------------------------------------------------------------------- FP8 wo_a
T_SMALL, G, R, D = 3, 2, 256, 384


class SGLangWoA:
    """SGLang's wo_a pieces as the forward calls them (its quantizations, DeepGEMM's fp8_einsum, 0.5.23's wrapper),
    in torch, recording their calls; the GEMM checks it gets a real e4m3 activation and computes in float64."""

    def __init__(self):
        self.calls = []

    def quant(self, x, group_size, eps=1e-10, column_major_scales=False, scale_tma_aligned=False, scale_ue8m0=False):
        self.calls.append("quant")
        return quant_per_group(x, group_size)

    def quant_ue8m0(self, x):
        self.calls.append("quant_ue8m0")
        return quant_per_group(x)

    def einsum(self, expr, a, b, d, recipe=None):
        self.calls.append("fp8_einsum")
        assert expr == "bhr,hdr->bhd" and a[0].dtype == torch.float8_e4m3fn, (expr, a[0].dtype)
        xq = (a[0].float().unflatten(-1, (-1, 128)) * a[1].float().unsqueeze(-1)).flatten(-2)
        d.copy_(reference(xq, *b))
        return None

    def wrapper(self, o_fp8, o_s, weight, weight_scale, recipe, out=None):   # 0.5.23 _fp8_wo_a_einsum
        out = out if out is not None else torch.empty(o_fp8.shape[0], weight.shape[0], weight.shape[1],
                                                      dtype=torch.bfloat16)
        self.einsum("bhr,hdr->bhd", (o_fp8, o_s), (weight, weight_scale), out, recipe=recipe)
        return out


def _forward(version, sg, o, w, s, ue8m0=False):
    """DeepSeek-V4's FP8 wo_a forward as the SGLang version writes it (0.5.17 deepseek_v4.py:1320-1349, 0.5.23
    :3000-3027 and _fp8_wo_a_einsum :704-724), with the patched functions in SGLang's place."""
    quant, q_rec = _wrapped("sglang_per_token_group_quant_fp8", sg.quant, version)
    quant_ue8m0, u_rec = _wrapped("sglang_per_token_group_quant_fp8_dsv4_wo_a", sg.quant_ue8m0, version)
    t, g, d = o.shape
    if ue8m0:
        o_fp8, o_s = quant_ue8m0(o)
    else:
        o_fp8, o_s = quant(o.reshape(t * g, d).contiguous(), group_size=128, scale_ue8m0=False)
        o_fp8, o_s = o_fp8.view(t, g, d), o_s.view(t, g, -1)
    if version == "0.5.23":
        gemm, g_rec = _wrapped("_fp8_wo_a_einsum", sg.wrapper, version)
        return gemm(o_fp8, o_s, w.view(g, R, d), s, recipe=(1, 128, 128)), g_rec
    out = torch.empty(t, g, R, dtype=torch.bfloat16)
    gemm, g_rec = _wrapped("fp8_einsum", sg.einsum, version)
    gemm("bhr,hdr->bhd", (o_fp8, o_s), (w.view(g, R, d), s), out, recipe=(1, 128, 128))
    return out, g_rec


@pytest.fixture
def wo_a(op, monkeypatch):
    monkeypatch.setattr(fp8_adapters, "_wo_a_gemm_is_ours", lambda: True)
    gen = torch.Generator().manual_seed(5)
    w, s = block_fp8(R, D, gen, groups=G)
    return op, w, s, gen


@pytest.mark.parametrize("version", ["0.5.17", "0.5.20", "0.5.23"])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_wo_a_gemm_is_ours_on_the_bf16_activation(wo_a, version, ue8m0):
    op, w, s, gen = wo_a
    o = torch.randn(T_SMALL, G, D, generator=gen).bfloat16()
    sg = SGLangWoA()
    y, rec = _forward(version, sg, o, w, s, ue8m0)
    ref = reference(o, w, s)
    err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    assert err < 1e-2, err   # bf16 output: the activation was never quantized to e4m3 (that gives ~3e-2 here)
    assert sg.calls == [] and rec.handbacks == 0 and op.CALLS[-1][0] == "fp8_grouped_linear"


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
@pytest.mark.parametrize("deep_gemm_runs", [True, False])
def test_wo_a_hand_back_reruns_sglangs_quantization_and_gemm(wo_a, monkeypatch, version, deep_gemm_runs):
    """Above the crossover, and for a case ours rejects: SGLang's quantization runs after all, then DeepGEMM's
    fp8_einsum where it runs on this GPU, else SGLang's bf16 einsum on the dequantized weight."""
    op, w, s, gen = wo_a
    monkeypatch.setattr(fp8_adapters, "deep_gemm_einsum_runs_on", lambda x: deep_gemm_runs)
    for t, reject in ((fp8_adapters.FP8_WO_A_MAX_M + 1, None), (T_SMALL, "fp8_linear: K = 384 not covered")):
        op.REJECT[:] = [reject] if reject else []
        o = torch.randn(t, G, D, generator=gen).bfloat16()
        sg = SGLangWoA()
        y, rec = _forward(version, sg, o, w, s)
        assert sg.calls == (["quant", "fp8_einsum"] if deep_gemm_runs else []), sg.calls
        ref = reference(o, w, s)
        err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        assert err < (6e-2 if deep_gemm_runs else 1e-2), err   # e4m3 activation on SGLang's fp8 path
        assert (rec.kept, rec.handbacks) == ((1, 0) if reject is None else (0, 1)), rec
        reason = next(iter(rec.kept_reasons if reject is None else rec.handback_reasons))
        assert (reject or ("fp8_einsum runs" if deep_gemm_runs else "bf16 wo_a einsum")) in reason, reason


def test_wo_a_quantization_is_sglangs_where_the_gemm_is_not_ours(op, monkeypatch):
    """Without our GEMM in SGLang's place (its row not patched) the quantization must be real, and a GEMM call
    that arrives with a real e4m3 activation goes to DeepGEMM as it came."""
    monkeypatch.setattr(fp8_adapters, "_wo_a_gemm_is_ours", lambda: False)
    gen = torch.Generator().manual_seed(6)
    w, s = block_fp8(R, D, gen, groups=G)
    o = torch.randn(T_SMALL, G, D, generator=gen).bfloat16()
    sg = SGLangWoA()
    y, rec = _forward("0.5.17", sg, o, w, s)
    assert sg.calls == ["quant", "fp8_einsum"] and rec.handbacks == 1
    assert "arrives quantized by SGLang" in next(iter(rec.handback_reasons))
    ref = reference(o, w, s)
    assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 6e-2


def test_wo_a_quantization_of_another_caller_is_sglangs(op, monkeypatch):
    monkeypatch.setattr(fp8_adapters, "_wo_a_gemm_is_ours", lambda: True)
    sg = SGLangWoA()
    quant, rec = _wrapped("sglang_per_token_group_quant_fp8", sg.quant)
    x = torch.randn(4, 256).bfloat16()
    q, s = quant(x, 128, column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=False)
    assert q.dtype == torch.float8_e4m3fn and sg.calls == ["quant"] and rec.handbacks == 1
    q, s = quant(x, group_size=64)
    assert q.dtype == torch.float8_e4m3fn and rec.handbacks == 2


def test_wo_a_bf16_fallback_is_sglangs_einsum_on_the_dequantized_weight():
    gen = torch.Generator().manual_seed(7)
    w, s = block_fp8(200, 300, gen, groups=3)   # odd R and D: partial scale blocks
    x = torch.randn(5, 3, 300, generator=gen).bfloat16()
    deq = fp8_linear_fake.make_module().dequant(w, s).to(torch.bfloat16)   # SGLang's load-time dequant
    expect = torch.einsum("tgd,grd->tgr", x, deq)
    out = torch.full((5, 3, 200), float("nan"), dtype=torch.bfloat16)
    got = fp8_adapters.wo_a_bf16_einsum(x, w, s, out)
    assert got is out and torch.allclose(got.float(), expect.float(), rtol=2e-2, atol=1e-2)
    with pytest.raises(UnsupportedCase, match="no fallback"):
        fp8_adapters.wo_a_bf16_einsum(x, w, s.to(torch.int32), None)


# ----------------------------------------------------------------------------- against the real wheels
# The real Fp8LinearMethod.apply of each tested wheel, patched by the hook, driven with a DeepSeek-V4-shaped block-FP8
# layer as SGLang's loader leaves it; its original (above the crossover) calls self.w8a8_block_fp8_linear, recorded.
FP8_APPLY = """
import types, torch
import sglang.srt.layers.quantization.fp8 as fp8
from deepseek_v4_kernel.ops import fp8_linear as op
torch.manual_seed(0)
N, K = 512, 384
w = (torch.randn(N, K) * 2).to(torch.float8_e4m3fn)
s = torch.exp2(torch.randint(-9, -5, (N // 128, K // 128)).float())
layer = types.SimpleNamespace(weight=w, weight_scale_inv=s)
seen = []
def backend(**kw):
    seen.append(sorted(kw))
    return torch.zeros(kw["input"].shape[0], N, dtype=torch.bfloat16)
me = types.SimpleNamespace(use_marlin=False, use_mxfp8=False, block_quant=True, block_fp8_as_mxfp8=False,
                           quant_config=types.SimpleNamespace(weight_block_size=[128, 128]),
                           w8a8_block_fp8_linear=backend)
if hasattr(fp8.Fp8LinearMethod, "validate_block_quant_shapes") and "self.weight_block_size" in __import__(
        "inspect").getsource(fp8.Fp8LinearMethod.apply):
    me.weight_block_size = [128, 128]   # 0.5.16+ (0.5.12-0.5.15 read the quant config's)
x = torch.randn(3, K).bfloat16()
y = fp8.Fp8LinearMethod.apply(me, layer, x, None)
ref = x.double() @ op.dequant(w, s).t()
print("ERR=%g" % ((y.double() - ref).abs().max() / ref.abs().max()).item())
big = fp8.Fp8LinearMethod.apply(me, layer, torch.randn(100, K).bfloat16())
print("SEEN=%r" % seen)
"""


@pytest.mark.parametrize("version", targets.TESTED)
def test_real_fp8_linear_method_apply_runs_ours_and_hands_back_above_the_crossover(version):
    code = real_module_prelude("sglang.srt.layers.quantization.fp8") + fp8_linear_fake.CHILD_PRELUDE + FP8_APPLY \
        + REPORT_JSON
    r = run_child(code, path=[sglang_dir(version)], env=FORCE)
    assert r.returncode == 0, r.stderr[-3000:]
    row = {x["target"]: x for x in parse_report(r.stdout)}["sglang.srt.layers.quantization.fp8.Fp8LinearMethod.apply"]
    assert row["status"] == "patched" and row["kept"] == 1 and row["handbacks"] == 0, row
    assert float(re.search(r"ERR=(\S+)", r.stdout).group(1)) < 1e-2
    # SGLang's own method ran the 100-row call: its backend got the bf16 input and SGLang's parameters
    assert "SEEN=[['bias', 'block_size', 'input', 'input_scale', 'weight', 'weight_scale']]" in r.stdout, r.stdout


@pytest.mark.parametrize("version", targets.SURVEYED)
def test_wo_a_flag_condition_per_version(version, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    for has_deep_gemm in (True, False):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (object() if has_deep_gemm else None)
                            if name == "deep_gemm" else real(name, *a))
        ok, why = targets.fp8_wo_a_path_takes_ours(version)
        v = policy.parse_version(version)
        if v < policy.parse_version("0.5.16"):
            assert not ok and "UE8M0" in why
        elif v < policy.parse_version("0.5.23"):
            assert ok == has_deep_gemm and (ok or "import deep_gemm" in why), why
        else:
            assert ok, why   # 0.5.23 calls its own wrapper (ours): no deep_gemm import on our path


def _real_modules_report(version, modules, env, extra_path=(), also_real=()):
    names = list(modules) + list(also_real)
    code = real_module_prelude(names[0], *names[1:], "sglang.srt.environ") + fp8_linear_fake.CHILD_PRELUDE + \
        "import os\n" + "".join(f"import {m}\n" for m in modules) + \
        f"print('FLAG=%r' % os.environ.get({FLAG!r}))\n" + REPORT_JSON
    r = run_child(code, path=[sglang_dir(version), *extra_path], env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return {x["target"]: x for x in parse_report(r.stdout)}, re.search(r"FLAG=(.*)", r.stdout).group(1)


def test_wo_a_flag_set_again_in_sglang_0_5_17_workers_and_left_where_the_user_set_it(tmp_path):
    """0.5.17's launcher sets the flag False on SM120 (server_args.py:5310) after this layer set it; its spawned
    workers inherit False and this layer's mark, and set it again before deepseek_v4 reads it. A user's 0 stays."""
    path = [stand_in_deep_gemm(tmp_path)]
    mod = ["sglang.srt.layers.quantization.fp8"]
    rows, flag = _real_modules_report("0.5.17", mod, {**FORCE}, path)
    assert flag == "'1'" and rows[FLAG]["status"] == "patched", rows[FLAG]
    rows, flag = _real_modules_report("0.5.17", mod, {**FORCE, FLAG: "False", policy.ENV_SET: FLAG}, path)
    assert flag == "'1'" and "again" in rows[FLAG]["reason"], rows[FLAG]
    rows, flag = _real_modules_report("0.5.17", mod, {**FORCE, FLAG: "0"}, path)
    assert flag == "'0'" and rows[FLAG]["status"] == "left"
    rows, flag = _real_modules_report("0.5.12", mod, {**FORCE}, path)
    assert flag == "None" and rows[FLAG]["status"] == "left" and "UE8M0" in rows[FLAG]["reason"], rows[FLAG]


QUANT_ROWS = ("sglang_per_token_group_quant_fp8", "sglang_per_token_group_quant_fp8_dsv4_wo_a")


@pytest.mark.parametrize("version", ["0.5.17", "0.5.20", "0.5.23"])
def test_wo_a_call_sites_in_the_real_model(version):
    """In each wheel's deepseek_v4.py the two quantization functions are module globals called once each, in the
    FP8 wo_a branch, right before the GEMM the rows replace (nothing else between them reads their outputs)."""
    src = open(os.path.join(sglang_dir(version), "sglang", "srt", "models", "deepseek_v4.py")).read()
    tree = ast.parse(src)
    calls = {n: [c for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == n]
             for n in QUANT_ROWS}
    assert all(len(v) == 1 for v in calls.values()), {k: len(v) for k, v in calls.items()}
    gemm = "_fp8_wo_a_einsum(" if version == "0.5.23" else "deep_gemm.fp8_einsum("
    lines = src.splitlines()
    for c in calls.values():
        after = "\n".join(lines[c[0].lineno - 1:c[0].lineno + 24])
        assert gemm in after, (version, c[0].lineno)
        between = after[:after.index(gemm)]
        assert set(re.findall(r"\bo_(?:fp8|s)\.(\w+)", between)) <= {"view"}, between


@pytest.mark.parametrize("version, flag", [("0.5.17", "1"), ("0.5.23", "1"), ("0.5.23", "0")])
def test_wo_a_rows_patch_the_real_model_module(version, flag, tmp_path):
    mods = ["sglang.srt.models.deepseek_v4"]
    rows, _ = _real_modules_report(version, mods, {**FORCE, FLAG: flag}, [stand_in_deep_gemm(tmp_path)])
    names = QUANT_ROWS + (("_fp8_wo_a_einsum",) if version == "0.5.23" else ())
    for n in names:
        row = rows[f"sglang.srt.models.deepseek_v4.{n}"]
        assert row["status"] == ("patched" if flag == "1" else "left"), row
    if version == "0.5.17":
        assert rows["deep_gemm.fp8_einsum"]["status"] in ("pending", "skipped")   # the stand-in has no fp8_einsum


def test_wo_a_flag_readers_are_the_ones_surveyed():
    """Every reader of SGLANG_OPT_FP8_WO_A_GEMM in the tested wheels is one docs/sglang_surface.md names: the
    launcher's argument handling (which only turns it off) and the DeepSeek-V4 model (its wo_a); turning it on in
    the workers reaches no other code, and in particular none of the decisions tools/e2e/sm120_points.py lists
    besides server_args.py's SM120 branch (launcher only)."""
    allowed = {"srt/environ.py", "srt/server_args.py", "srt/models/deepseek_v4.py",
               "srt/arg_groups/model_hook.py", "srt/arg_groups/serving_hook.py", "srt/arg_groups/expert_pack_hook.py",
               "srt/models/deepseek_common/amd/deepseek_v4_wo_a_fp8.py"}
    for version in targets.TESTED:
        base = os.path.join(sglang_dir(version), "sglang")
        readers = set()
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith(".py") and FLAG in open(os.path.join(dirpath, f), errors="replace").read():
                    readers.add(os.path.relpath(os.path.join(dirpath, f), base))
        assert readers <= allowed and "srt/models/deepseek_v4.py" in readers, (version, sorted(readers - allowed))
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools", "e2e"))
    try:
        import sm120_points as sp
    finally:
        sys.path.pop(0)
    flagged = [p for p in sp.POINTS if "FP8_WO_A" in p.decides or "FP8 wo_a" in p.decides]
    assert {p.file for p in flagged} == {"srt/server_args.py"}, flagged
