"""The harness's seeded dummy weights on a small stand-in of DeepSeek-V4's parameter kinds (CPU torch)."""
import math
import os
import sys

import pytest

import e2e_env  # noqa: F401
from e2e_env import ROOT, SGLANG_VERSION

torch = pytest.importorskip("torch")
nn = torch.nn
sys.path.insert(0, os.path.join(ROOT, "tools", "e2e", "sm120_shim"))
from dsv4_e2e_shim import dummy_weights as dw  # noqa: E402

E, H, I, V = 4, 256, 128, 512  # experts, hidden, expert intermediate, vocab (small; the rules do not depend on size)


class _Method:
    def __init__(self, up_first):
        if up_first:
            self.load_up_proj_weight_first = True


def _param(*shape, dtype):
    return nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)


class Experts(nn.Module):
    def __init__(self, up_first=False, scale_dtype=torch.float32):
        super().__init__()
        self.quant_method = _Method(up_first)
        self.w13_weight = _param(E, 2 * I, H // 2, dtype=torch.int8)
        self.w2_weight = _param(E, H, I // 2, dtype=torch.int8)
        self.w13_weight_scale_inv = _param(E, 2 * I, H // 32, dtype=scale_dtype)
        self.w2_weight_scale_inv = _param(E, H, I // 32, dtype=scale_dtype)


class Fp8Linear(nn.Module):
    def __init__(self, n, k):
        super().__init__()
        self.weight = _param(n, k, dtype=torch.float8_e4m3fn)
        self.weight_scale_inv = _param(n // 128, k // 128, dtype=torch.float32)


class Model(nn.Module):
    def __init__(self, **experts):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, H, dtype=torch.bfloat16)
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = _param(H, dtype=torch.bfloat16)
        self.wq_a = Fp8Linear(256, H)
        self.experts = Experts(**experts)
        self.topk = nn.Module()
        self.topk.tid2eid = _param(V, 6, dtype=torch.int32)
        self.hc_attn_scale = _param(3, dtype=torch.float32)
        self.hc_attn_base = _param(24, dtype=torch.float32)
        self.hc_attn_fn = _param(24, 4 * H, dtype=torch.float32)
        self.lm_head = nn.Module()
        self.lm_head.weight = _param(V, H, dtype=torch.bfloat16)


def _init(model, seed=11):
    dw._SEED = seed
    with torch.no_grad():
        model.topk.tid2eid.copy_(torch.arange(V * 6, dtype=torch.int32).view(V, 6) % 256)
    dw.seeded_dummy_weights(model)
    return model


def _exponents(scale):
    if scale.dtype == torch.float32:
        return torch.log2(scale).round().to(torch.int32)
    return scale.view(torch.uint8).to(torch.int32) - 127


def test_same_seed_same_weights_and_another_seed_others():
    a, b, c = _init(Model()), _init(Model()), _init(Model(), seed=12)
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa.view(torch.uint8) if pa.element_size() == 1 else pa,
                           pb.view(torch.uint8) if pb.element_size() == 1 else pb), name
    assert not torch.equal(a.experts.w13_weight, c.experts.w13_weight)


def test_formats_and_scales():
    m = _init(Model())
    for scale, weight, k in ((m.experts.w13_weight_scale_inv, m.experts.w13_weight, H),
                             (m.wq_a.weight_scale_inv, m.wq_a.weight, H)):
        assert (scale > 0).all()
        exps = _exponents(scale)
        assert torch.equal(torch.exp2(exps.float()), scale)  # powers of two (UE8M0)
        rms = dw.E2M1_RMS if weight.dtype == torch.int8 else 1.0
        base = round(math.log2(1 / (rms * math.sqrt(k))))
        assert set(exps.unique().tolist()) <= {base - 1, base, base + 1}
    fp8 = m.wq_a.weight.float()
    assert (fp8 != 0).float().mean() > 0.9 and 0.8 < fp8.std() < 1.2
    assert m.experts.w13_weight.view(torch.uint8).unique().numel() > 200  # all byte values: random e2m1 pairs
    assert torch.equal(m.input_layernorm.weight, torch.ones(H, dtype=torch.bfloat16))
    assert torch.equal(m.hc_attn_scale, torch.ones(3))
    assert abs(m.lm_head.weight.float().std().item() - dw.LOGIT_STD / math.sqrt(H)) < 0.02
    assert abs(m.hc_attn_fn.std().item() - 1 / math.sqrt(4 * H)) < 0.002
    assert abs(m.embed_tokens.weight.float().std().item() - 1.0) < 0.05
    # left as built: SGLang fills the hash-routing table itself
    assert torch.equal(m.topk.tid2eid, torch.arange(V * 6, dtype=torch.int32).view(V, 6) % 256)


def test_up_first_layout_holds_the_same_experts():
    gate_first = _init(Model())
    up_first = _init(Model(up_first=True, scale_dtype=torch.float8_e8m0fnu))
    g, u = gate_first.experts, up_first.experts
    assert torch.equal(g.w13_weight[:, :I], u.w13_weight[:, I:])   # gate half
    assert torch.equal(g.w13_weight[:, I:], u.w13_weight[:, :I])   # up half
    assert torch.equal(_exponents(g.w13_weight_scale_inv[:, :I]), _exponents(u.w13_weight_scale_inv[:, I:]))
    assert torch.equal(g.w2_weight, u.w2_weight)
    assert torch.equal(_exponents(g.w2_weight_scale_inv), _exponents(u.w2_weight_scale_inv))


def test_parameter_log(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_E2E_WEIGHT_LOG", str(tmp_path))
    _init(Model())
    files = os.listdir(tmp_path)
    assert len(files) == 1
    import json

    rec = json.load(open(os.path.join(tmp_path, files[0])))
    rules = {p["name"]: p["rule"] for p in rec["parameters"]}
    assert rules["experts.w13_weight"] == "mxfp4_weight/gate_first"
    assert rules["experts.w2_weight_scale_inv"] == "block_scale"
    assert rules["topk.tid2eid"] == "kept"
    assert rules["lm_head.weight"] == "lm_head"


def test_hooks_name_sglang_0_5_17s_dummy_initialiser():
    from sglang_env import sglang_dir

    base = os.path.join(sglang_dir(SGLANG_VERSION), "sglang", "srt", "model_loader")
    watched = []

    class Hook:
        def watch(self, name, cb):
            watched.append(name)

    assert dw.install(Hook(), "3") == 3
    assert watched == ["sglang.srt.model_loader.weight_utils", "sglang.srt.model_loader.loader"]
    wu = open(os.path.join(base, "weight_utils.py")).read()
    loader = open(os.path.join(base, "loader.py")).read()
    assert "def initialize_dummy_weights(" in wu
    assert "    initialize_dummy_weights,\n" in loader and "initialize_dummy_weights(model)" in loader
    with pytest.raises(ValueError, match="DSV4_E2E_WEIGHT_SEED must be an integer"):
        dw.parse_seed("seven")


class WoA(nn.Module):
    """DeepSeek-V4's wo_a as SGLang builds it: bf16 where the FP8 wo_a flag is off (SM120), else FP8 + block scales."""

    def __init__(self, fp8: bool, n=256, k=384):
        super().__init__()
        self.wo_a = nn.Module()
        if fp8:
            self.wo_a.weight = _param(n, k, dtype=torch.float8_e4m3fn)
            self.wo_a.weight_scale_inv = _param(n // 128, k // 128, dtype=torch.float32)
        else:
            self.wo_a.weight = _param(n, k, dtype=torch.bfloat16)


def _fill_all(model, seed=7):
    params = dict(model.named_parameters())
    return {name: dw.fill_parameter(model, name, p, params, seed) for name, p in params.items()}


def test_bf16_wo_a_is_the_dequantized_fp8_draw_of_the_fp8_setup():
    """The same model in both setups: (a)/(c) build wo_a in bf16 (dequantized at load on SM120), (b) keeps it FP8
    (SGLANG_OPT_FP8_WO_A_GEMM): the bf16 fill is the FP8 fill times its block scales (a real checkpoint is FP8), and
    the weight fingerprint (checkpoint level) is the same for both."""
    bf, f8 = WoA(fp8=False), WoA(fp8=True)
    assert _fill_all(bf) == {"wo_a.weight": "fp8_dequantized"}
    assert _fill_all(f8) == {"wo_a.weight": "fp8_weight", "wo_a.weight_scale_inv": "block_scale"}
    scale = f8.wo_a.weight_scale_inv.repeat_interleave(128, 0).repeat_interleave(128, 1)
    deq = f8.wo_a.weight.float() * scale
    assert torch.equal(bf.wo_a.weight.float(), deq.to(torch.bfloat16).float())
    assert deq.abs().max() > 0 and set(torch.log2(f8.wo_a.weight_scale_inv).flatten().tolist()) <= {
        float(dw.fp8_block_scale_base(384) + j) for j in (-1, 0, 1)}
    import run_e2e

    rows = lambda m: sorted(r for name, p in m.named_parameters() for r in run_e2e._logical_rows(  # noqa: E731
        {"name": name, "shape": list(p.shape), "dtype": str(p.dtype).replace("torch.", ""),
         "rule": dw.classify(name, str(p.dtype).replace("torch.", ""), p.dim())}))
    assert rows(bf) == rows(f8)
