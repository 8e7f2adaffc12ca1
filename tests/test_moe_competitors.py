"""CPU side of the MoE competitors (deepseek_v4_kernel/bench/moe_competitors.py) and of bench_fp4_moe.py's section
against them (benchmarks/fp4_moe_vs_sglang.py): discovery says why a runner cannot run (no GPU, another GPU class,
no SGLang, a broken SGLang, JIT modules not built) and never raises; the TP shards; the floor and ratio arithmetic; a
wrong competitor is reported and not timed; the table and JSON carry the new columns; the SGLang 0.5.17 sources have
the call forms the loader uses. The GPU run is tools/gpu_moe_competitors.sh's."""

import argparse
import ast
import importlib
import os
import sys
import types

import pytest
import torch

from sglang_env import ROOT, sglang_dir

from deepseek_v4_kernel.bench import moe_competitors as mc
from deepseek_v4_kernel.bench import runner, shapes
from deepseek_v4_kernel.bench import sources

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import fp4_moe_vs_sglang as vs  # noqa: E402


# ----------------------------------------------------------------------------- shapes and arithmetic
@pytest.mark.parametrize("tp,inter", [(1, 2048), (2, 1024), (4, 512)])
def test_tp_shards(tp, inter):
    s = mc.moe_shape(tp)
    assert (s.experts, s.topk, s.hidden, s.inter, s.tp) == (256, 6, 4096, inter, tp)


@pytest.mark.parametrize("tp", [0, 3, 8, "1"])
def test_tp_shard_errors_name_the_argument(tp):
    with pytest.raises(ValueError, match="tp must be one of 1, 2, 4"):
        mc.moe_shape(tp)


def test_weight_bytes_and_floor_summary():
    s = mc.moe_shape(1)
    per = 3 * 4096 * 2048 // 2 + 3 * 4096 * 2048 // 32          # packed e2m1 + one UE8M0 byte per 32
    assert mc.weight_bytes(s, 1) == per == 13369344             # the "13.3 MB per expert"
    assert mc.weight_bytes(mc.moe_shape(4), 6) == 6 * per / 4
    assert mc.weight_bytes(s, 2, scale_bytes=4) == 2 * (3 * 4096 * 2048 // 2 + 4 * 3 * 4096 * 2048 // 32)
    got = mc.floor_summary({"ours": 50.0, "marlin": 80.0, "flashinfer_sm90": None}, 40.0)
    assert got["ours_pct_floor"] == 80.0 and got["marlin_pct_floor"] == 50.0
    assert got["marlin_over_ours"] == 1.6 and got["flashinfer_sm90_over_ours"] is None
    assert got["flashinfer_sm90_pct_floor"] is None and "ours_over_ours" not in got
    assert mc.floor_summary({"marlin": 80.0}, 40.0)["marlin_over_ours"] is None   # ours not timed: no ratio


# ----------------------------------------------------------------------------- discovery
def test_discovery_without_gpu_says_why_and_never_raises():
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: the GPU script covers discovery")
    found = {c.short: c for c in mc.moe_competitors()}
    assert set(found) == {"marlin", "flashinfer_sm120", "flashinfer_sm90"}
    assert not any(c.available for c in found.values())
    assert "no CUDA GPU here" in found["marlin"].reason
    assert found["flashinfer_sm120"].reason.startswith("cannot run on this GPU") and "sm_120" in \
        found["flashinfer_sm120"].reason
    assert "sm_90 only" in found["flashinfer_sm90"].reason
    with pytest.raises(RuntimeError, match="cannot run here: .*no CUDA GPU"):
        found["marlin"].prepare({})
    with pytest.raises(ValueError, match="include must name"):
        mc.moe_competitors(include=("marlin", "cutlass"))


def test_flashinfer_sm120_on_sm90_cannot_run(monkeypatch):
    monkeypatch.setattr(mc, "_capability", lambda: (9, 0))
    c = mc.moe_competitors(include=("flashinfer_sm120",))[0]
    assert not c.available and c.reason == ("cannot run on this GPU: this FlashInfer MoE kernel is built for sm_120 "
                                            "only; this GPU is sm_90")


def test_marlin_on_other_gpu_classes(monkeypatch):
    monkeypatch.setattr(mc, "_capability", lambda: (10, 0))
    c = mc.moe_competitors(include=("marlin",))[0]
    assert "SM90 and SM120 only" in c.reason and "sm_100" in c.reason


def test_marlin_without_sglang(monkeypatch):
    monkeypatch.setattr(mc, "_capability", lambda: (9, 0))
    real = importlib.util.find_spec
    monkeypatch.setattr(mc.importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    c = mc.moe_competitors(include=("marlin",))[0]
    assert c.reason == "SGLang is not installed here (the Marlin runner is SGLang's own code)"


def test_marlin_with_a_broken_sglang(monkeypatch, tmp_path):
    pkg = tmp_path / "sglang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('orjson is missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, k)
    monkeypatch.setattr(mc, "_capability", lambda: (12, 0))
    found = {c.short: c for c in mc.moe_competitors()}
    assert "does not import here (ImportError: orjson is missing)" in found["marlin"].reason
    assert "does not import here" in found["flashinfer_sm120"].reason   # FlashInfer or SGLang's method
    assert "sm_90 only" in found["flashinfer_sm90"].reason


def test_a_loader_bug_costs_its_competitor_only(monkeypatch):
    monkeypatch.setattr(mc, "_marlin", lambda allow: 1 / 0)
    found = mc.moe_competitors(include=("marlin", "flashinfer_sm90"))
    assert found[0].name == mc.MARLIN and found[0].reason.startswith("discovery failed: ZeroDivisionError")
    assert found[1].name == mc.FLASHINFER_SM90


# ----------------------------------------------------------------------------- SGLang's JIT modules
FAKE_JIT = '''
def _build(name):
    from tvm_ffi.cpp import load_inline      # as SGLang's load_jit: at call time, only without a cached .so
    return load_inline(name, build_directory="/cache/" + name)

def not_cached():
    return _build("sgl_kernel_jit_marlin")

def cached():
    return "module"

def broken():
    raise RuntimeError("bad ELF")
'''


@pytest.fixture
def fake_jit(monkeypatch, tmp_path):
    (tmp_path / "fake_sgl_jit.py").write_text(FAKE_JIT)
    cpp = types.ModuleType("tvm_ffi.cpp")
    compiled = []
    cpp.load_inline = lambda name, **k: compiled.append(name) or "built"
    cpp.load = cpp.load_inline
    tvm = types.ModuleType("tvm_ffi")
    tvm.cpp = cpp
    monkeypatch.setitem(sys.modules, "tvm_ffi", tvm)
    monkeypatch.setitem(sys.modules, "tvm_ffi.cpp", cpp)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_sgl_jit", raising=False)
    entries = tuple(("fake_sgl_jit", b, lambda torch: (), "") for b in ("not_cached", "cached", "broken"))
    return cpp, compiled, entries + (("fake_sgl_jit_absent", "x", lambda torch: (), ""),)


def test_probe_loads_cached_modules_and_compiles_nothing(fake_jit):
    cpp, compiled, entries = fake_jit
    real = cpp.load_inline
    got = mc.probe_jit(entries)
    assert got["not_cached"][0] == "would compile" and "sgl_kernel_jit_marlin is not in the tvm-ffi cache" in \
        got["not_cached"][1]
    assert got["cached"] == ("loaded", "") and got["broken"] == ("failed", "RuntimeError: bad ELF")
    assert got["x"][0] == "absent"
    assert compiled == [] and cpp.load_inline is real     # nothing compiled; tvm-ffi's entry point restored
    assert importlib.import_module("fake_sgl_jit").not_cached() == "built" and compiled == ["sgl_kernel_jit_marlin"]


def test_jit_verdict(fake_jit):
    _, _, entries = fake_jit
    status = mc.probe_jit(entries[:2])
    reason, notes = mc.jit_verdict(status, allow_jit=False)
    assert reason.startswith("SGLang would JIT-compile not_cached first") and "prebuild_jit.py" in reason
    assert "tens of seconds" in reason and mc.ALLOW_JIT_ENV in reason and notes == []
    assert mc.jit_verdict(status, allow_jit=True) == ("", ["compiles on first use: not_cached"])
    assert mc.jit_verdict(status, allow_jit="small") == ("", ["compiles on first use: not_cached"])
    heavy = {"_jit_moe_wna16_marlin_module": ("would compile", "x"), "small_one": ("would compile", "y")}
    reason, _ = mc.jit_verdict(heavy, allow_jit="small")
    assert reason.startswith("SGLang would JIT-compile _jit_moe_wna16_marlin_module first") and "~5 min" in reason
    assert mc.jit_verdict(heavy, allow_jit="all")[0] == ""
    reason, _ = mc.jit_verdict(mc.probe_jit(entries), allow_jit=True)
    assert reason == "SGLang's JIT modules do not load: broken: RuntimeError: bad ELF"
    assert mc.jit_verdict({"a": ("loaded", ""), "b": ("absent", "ImportError: no")}, False) == (
        "", ["b absent from this SGLang (ImportError: no)"])


@pytest.mark.parametrize("env,arg,want", [(None, None, ""), ("1", None, "all"), ("small", None, "small"),
                                          ("0", None, ""), ("1", False, ""), (None, True, "all"),
                                          (None, "small", "small")])
def test_allow_jit_from_the_argument_or_the_environment(monkeypatch, env, arg, want):
    if env is None:
        monkeypatch.delenv(mc.ALLOW_JIT_ENV, raising=False)
    else:
        monkeypatch.setenv(mc.ALLOW_JIT_ENV, env)
    assert mc._allow_jit(arg) == want


def test_allow_jit_refuses_an_unknown_value(monkeypatch):
    """A typo is an error naming the variable and the accepted values, never silently "no JIT"."""
    from deepseek_v4_kernel.switches import InvalidSwitch

    monkeypatch.setenv(mc.ALLOW_JIT_ENV, "yes")
    with pytest.raises(InvalidSwitch, match="DSV4_BENCH_ALLOW_SGLANG_JIT must be one of 0, 1, small, got 'yes'"):
        mc._allow_jit(None)


# ----------------------------------------------------------------------------- the user bench's form
def _weights(E=4, inter=64, H=128):
    g = torch.Generator().manual_seed(0)
    return dict(w13=torch.randint(0, 256, (E, 2 * inter, H // 2), generator=g, dtype=torch.uint8),
                w13_scale=torch.full((E, 2 * inter, H // 32), 127, dtype=torch.uint8),
                w2=torch.randint(0, 256, (E, H, inter // 2), generator=g, dtype=torch.uint8),
                w2_scale=torch.full((E, H, inter // 32), 127, dtype=torch.uint8))


def test_weights_are_checked():
    w = _weights()
    mc._check_weights(w)
    with pytest.raises(ValueError, match="must hold 'w2_scale'"):
        mc._check_weights({k: v for k, v in w.items() if k != "w2_scale"})
    with pytest.raises(ValueError, match=r"weights\['w13_scale'\] must be uint8 UE8M0 bits or float8_e8m0fnu"):
        mc._check_weights(dict(w, w13_scale=w["w13_scale"].float()))
    with pytest.raises(ValueError, match=r"weights\['w2'\] must be \[E, H, I/2\]"):
        mc._check_weights(dict(w, w2=w["w2"][:, :, :-1]))


def test_user_bench_entry_prepares_once_per_weight_set():
    calls = []
    c = mc.MoeCompetitor(mc.MARLIN, "test", prepare_fn=lambda w: calls.append(("prep", w["w13"].shape)) or "state",
                         bind_fn=lambda st, x, tw, ids: (lambda: (st, x.shape, tw.shape, ids.shape)))
    e = mc.UserBenchEntry("fp4_moe", c.name, c.origin, "sglang", prepare=mc._user_bench_prepare(c))
    w = _weights()
    sets = [dict(w, x=torch.zeros(3, 128), topk_weights=torch.ones(3, 6), topk_ids=torch.zeros(3, 6, dtype=torch.int32),
                 swiglu_limit=10.0) for _ in range(3)]
    outs = [e.prepare(a)() for a in sets]
    assert outs[0] == ("state", (3, 128), (3, 6), (3, 6)) and len(calls) == 1   # one preparation for shared weights
    e.prepare(dict(sets[0], **_weights(inter=32)))
    assert len(calls) == 2 and calls[1][1] == (4, 64, 64)
    assert e.runnable and e.role == runner.comp.SGLANG


def test_user_bench_lists_marlin_with_its_reason(monkeypatch):
    monkeypatch.setattr(mc, "_capability", lambda: (8, 9))
    entries = mc.user_bench_competitors()
    assert [e.name for e in entries] == [mc.MARLIN] and not entries[0].runnable
    assert "SM90 and SM120 only" in entries[0].reason and entries[0].op == "fp4_moe"


def test_run_op_of_the_user_bench_reports_marlin(monkeypatch):
    monkeypatch.setattr(mc, "_capability", lambda: (8, 9))
    monkeypatch.setattr(shapes, "cases", lambda op, *a, **k: [])
    lines = []
    pools = types.SimpleNamespace(drop=lambda prefix: None)
    rec = runner.run_op("fp4_moe", runner.Options(ops=["fp4_moe"]), pools, lines.append, 132, "0.5.17")
    marlin = [c for c in rec["competitors"] if c["name"] == mc.MARLIN]
    assert marlin and not marlin[0]["runnable"] and "SM90 and SM120 only" in marlin[0]["reason"]
    assert any(mc.MARLIN in l and "not timed" in l for l in lines), lines


# ----------------------------------------------------------------------------- bench_fp4_moe's section
class FakeBench:
    """bench_fp4_moe's names that vs.rows_for uses, on the CPU at a tiny shape."""
    LIMIT, RSF, TOPK = 10.0, 1.5, 2

    def __init__(self, E=8, H=64):
        self.E, self.H = E, H

    def make_routing(self, M, seed=0):
        g = torch.Generator().manual_seed(seed)
        ids = torch.rand(M, self.E, generator=g).topk(self.TOPK, dim=1).indices.int()
        return torch.randn(M, self.H, generator=g).bfloat16(), torch.rand(M, self.TOPK, generator=g) + 0.1, ids

    def run_ours(self, x, w, tw, ids, impl, out):
        out.copy_(self.reference(x, *w, tw, ids, swiglu_limit=self.LIMIT, routed_scaling_factor=self.RSF))
        return out

    @staticmethod
    def reference(x, w13, s13, w2, s2, tw, ids, swiglu_limit=None, routed_scaling_factor=None):
        scale = tw.double().sum(1, keepdim=True) * routed_scaling_factor
        return x.double() * scale + ids.double().sum(1, keepdim=True)


class _Prepared:
    def __init__(self, fn):
        self.fn = fn

    def bind(self, x, tw, ids):
        return lambda: self.fn(x, tw, ids)


def test_rows_check_before_timing_and_report_wrong_and_failed():
    bench = FakeBench()
    shape = mc.MoeShape(8, 2, 64, 32)
    w = (None, None, None, None)
    ok = _Prepared(lambda x, tw, ids: bench.reference(x, *w, tw, ids, routed_scaling_factor=bench.RSF).bfloat16())
    wrong = _Prepared(lambda x, tw, ids: torch.zeros(x.shape, dtype=torch.bfloat16) + 1)
    broken = _Prepared(lambda x, tw, ids: 1 / 0)
    timed = []

    def time_rotated(calls):
        timed.append(len(calls))
        return 10.0 * len(timed), "graph"
    op = types.SimpleNamespace(pick_impl=lambda *a: "cuda_decode", DECODE_MAX_SLOTS=256)
    row = vs.rows_for(4, 2, shape, w, {}, {"marlin": ok, "flashinfer_sm90": wrong, "flashinfer_sm120": broken,
                                           "other": "prepare: RuntimeError: x"},
                      ["default"], bench, 1e12, 1 << 20, op, bench.reference,
                      lambda b, l2, hi: 3, time_rotated)
    assert row["us"] == {"ours": 10.0, "marlin": 20.0} and timed == [3, 3]   # the wrong and failed: never timed
    assert row["status"]["flashinfer_sm90"].startswith("WRONG: relative error") and "not timed" in \
        row["status"]["flashinfer_sm90"]
    assert row["status"]["flashinfer_sm120"].startswith("failed: ZeroDivisionError")
    assert row["status"]["other"] == "prepare: RuntimeError: x"
    assert row["error"]["ours"] < 1e-2 and row["error"]["marlin"] < 1e-2
    hit = row["experts_hit"]
    assert row["weight_floor_us"] == pytest.approx(mc.weight_bytes(shape, hit) / 1e12 * 1e6)
    assert row["marlin_over_ours"] == 2.0 and row["ours_pct_floor"] == pytest.approx(
        100 * row["weight_floor_us"] / 10.0)
    assert (row["tp"], row["inter"], row["tokens"], row["sets"], row["default_impl"]) == (2, 32, 4, 3, "cuda_decode")


def _fake_result():
    comps = [dict(name=mc.MARLIN, short="marlin", available=True, reason="", notes=[]),
             dict(name=mc.FLASHINFER_SM120, short="flashinfer_sm120", available=False,
                  reason="cannot run on this GPU: ...", notes=[])]
    rows = []
    for tp, M, ours, marlin in ((1, 1, 50.0, 40.0), (1, 8, 100.0, 150.0), (4, 256, 200.0, None)):
        r = {"tp": tp, "inter": 2048 // tp, "tokens": M, "experts_hit": 6.0 * M, "weight_floor_us": 20.0,
             "default_impl": "cuda_decode", "us": {"ours": ours}, "status": {}, "error": {}, "how": {}}
        if marlin:
            r["us"]["marlin"] = marlin
        else:
            r["status"]["marlin"] = "WRONG: relative error 1.2"
        r.update(mc.floor_summary(r["us"], 20.0))
        rows.append(r)
    return {"mma_sync": True, "tp": [1, 4], "competitors": comps, "rows": rows}


def test_table_and_summary_on_fake_timings():
    res = _fake_result()
    text = vs.table(res)
    head = text.splitlines()[1]
    for col in ("floor us", "our impl", "ours us", "ours %floor", "marlin us", "marlin %floor", "marlin/ours"):
        assert f" {col} |" in head
    assert "flashinfer_sm120 us" not in head and "flashinfer_sm120: not timed: cannot run on this GPU" in text
    assert "| 1 | 2048 | 1 | 6.0 | 20.0 | cuda_decode | 50.0 | 40% | 40.0 | 50% | 0.80x |" in text
    assert "| 1 | 2048 | 8 | 48.0 | 20.0 | cuda_decode | 100.0 | 20% | 150.0 | 13% | 1.50x |" in text
    assert "| 4 | 512 | 256 | 1536.0 | 20.0 | cuda_decode | 200.0 | 10% | WRONG | - | - |" in text
    assert "mma.sync builds" in text.splitlines()[0]
    assert vs.ratio_summary(res) == ("marlin/ours: min 0.80x (tp 1, 1 tokens), max 1.50x (tp 1, 8 tokens); "
                                     "1 of 2 points >= 1.3x")
    assert vs.ratio_summary({"rows": []}) is None


def test_bench_options():
    ap = argparse.ArgumentParser()
    vs.add_args(ap)
    a = ap.parse_args([])
    assert vs._ints(a.vs_tokens, "--vs-tokens") == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert vs._ints(a.vs_tp, "--vs-tp") == [1, 2, 4] and a.vs_impls == "default" and not a.vs_only
    assert a.vs == "marlin,flashinfer_sm120,flashinfer_sm90"
    with pytest.raises(SystemExit, match="--vs-tp must be comma-separated integers"):
        vs._ints("1,two", "--vs-tp")
    assert vs.tolerance_for("flashinfer_sm120") == vs.TOLERANCE_MXFP8_ACT > vs.tolerance_for("marlin")


def test_required_competitor_stops_the_run(monkeypatch):
    monkeypatch.setattr(mc, "_capability", lambda: (8, 9))
    args = argparse.Namespace(vs="marlin", vs_tp="1", vs_tokens="1", vs_impls="default", vs_require="marlin",
                              allow_jit=False, vs_only=True)
    lines = []
    with pytest.raises(vs.Required) as e:
        vs.run(args, FakeBench(), 1e12, log=lines.append)
    assert e.value.code == 3 and any("required competitor cannot run: marlin: SGLang's Mxfp4MarlinMoEMethod" in l
                                     for l in lines)
    # without --vs-require and --vs-only (the bench's default run): nothing runs, no rows, no GPU touched
    res = vs.run(argparse.Namespace(**dict(vars(args), vs_require="", vs_only=False)), FakeBench(), 1e12,
                 log=lines.append)
    assert res["rows"] == [] and "section skipped" in lines[-1] and not res["competitors"][0]["available"]


# ----------------------------------------------------------------------------- SGLang's call forms
def _methods(path, cls):
    tree = ast.parse(open(path).read())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return {f.name: [a.arg for a in f.args.args] for f in node.body if isinstance(f, ast.FunctionDef)}, \
        ast.get_source_segment(open(path).read(), node)


def test_sglang_0_5_17_has_the_forms_the_loader_uses():
    tree = os.path.join(sglang_dir("0.5.17"), "sglang")
    q = os.path.join(tree, "srt", "layers", "quantization")
    meth, src = _methods(os.path.join(q, "mxfp4_marlin_moe.py"), "Mxfp4MarlinMoEMethod")
    assert meth["__init__"] == ["self", "fp8_method", "prefix"]
    assert meth["create_moe_runner"] == ["self", "layer", "moe_runner_config"]
    assert meth["process_weights_after_loading"] == ["self", "layer"] and meth["apply"][:3] == [
        "self", "layer", "dispatch_output"]
    assert "prepare_moe_mxfp4_layer_for_marlin(layer)" in src
    meth, src = _methods(os.path.join(q, "mxfp4_flashinfer_cutlass_moe.py"), "Mxfp4FlashinferCutlassMoEMethod")
    assert {"create_moe_runner", "process_weights_after_loading"} <= set(meth)
    assert "_mxfp4_weight_global_scale_tensor" in src and "_swiglu_limit_tensor" in src
    assert "load_up_proj_weight_first" in src          # W13 as [up; gate]
    # the base step the stand-in replaces: for MXFP4 experts on Marlin it only views the weights as int8
    fp8 = open(os.path.join(q, "fp8.py")).read()
    i = fp8.index("if get_moe_runner_backend().is_marlin():\n                    layer.w13_weight.data = "
                  "layer.w13_weight.data.view(torch.int8)")
    assert fp8[i:i + 300].count("return") == 1
    # the Marlin MXFP4 path does not apply the routed scaling factor (the model multiplies after the experts)
    fm = open(os.path.join(tree, "srt", "layers", "moe", "fused_moe_triton", "fused_marlin_moe.py")).read()
    assert "moe_topk_sum(intermediate_cache3, output)" in fm and "is_mxfp4_marlin" in fm
    base = open(os.path.join(tree, "srt", "layers", "moe", "moe_runner", "base.py")).read()
    for f in ("num_experts", "num_local_experts", "hidden_size", "intermediate_size_per_partition", "top_k",
              "params_dtype", "activation", "is_gated", "routed_scaling_factor", "swiglu_limit", "gemm1_alpha"):
        assert f"    {f}: " in base, f
    std = open(os.path.join(tree, "srt", "layers", "moe", "token_dispatcher", "standard.py")).read()
    assert "    hidden_states_scale: Optional[torch.Tensor]\n    topk_output: TopKOutput" in std
    assert '@register_fused_func("none", "marlin")' in open(
        os.path.join(tree, "srt", "layers", "moe", "moe_runner", "marlin.py")).read()
    for mod, builder, _, _ in mc.MARLIN_JIT:
        path = os.path.join(os.path.dirname(tree), *mod.split(".")) + ".py"
        assert builder in {n.name for n in ast.parse(open(path).read()).body if isinstance(n, ast.FunctionDef)}
    assert sources.signature_of(os.path.join(tree, "kernels", "ops", "moe", "moe_wna16_marlin.py"),
                                "_jit_moe_wna16_marlin_module") == ["dtype", "is_ep", "has_bias"]


def test_run_per_tp_shard_writes_rows_as_it_goes(monkeypatch):
    """vs.run end to end on the CPU: tiny shards, the real float64 reference as the check, a fake competitor that
    computes the right answer and fixed timings; the JSON of every row so far is handed to on_row."""
    import json

    from deepseek_v4_kernel.bench import timing
    from deepseek_v4_kernel.reference.fp4_moe import fp4_moe_reference

    class Bench(FakeBench):
        def make_weights(self, seed=0, inter=None):
            g = torch.Generator().manual_seed(seed)
            return (torch.randint(0, 256, (self.E, 2 * inter, self.H // 2), generator=g, dtype=torch.uint8),
                    torch.randint(118, 125, (self.E, 2 * inter, self.H // 32), generator=g, dtype=torch.uint8),
                    torch.randint(0, 256, (self.E, self.H, inter // 2), generator=g, dtype=torch.uint8),
                    torch.randint(118, 125, (self.E, self.H, inter // 32), generator=g, dtype=torch.uint8))

        def run_ours(self, x, w, tw, ids, impl, out):
            out.copy_(fp4_moe_reference(x, *w, tw, ids, swiglu_limit=self.LIMIT, routed_scaling_factor=self.RSF))
            return out

    bench = Bench()
    prepared = []

    def prep(w):
        prepared.append(w["w13"].shape[1] // 2)
        return (w["w13"], w["w13_scale"], w["w2"], w["w2_scale"])
    fake = mc.MoeCompetitor(mc.MARLIN, "test", prepare_fn=prep, bind_fn=lambda st, x, tw, ids: (
        lambda: fp4_moe_reference(x, *st, tw, ids, swiglu_limit=10.0, routed_scaling_factor=1.5).bfloat16()))
    monkeypatch.setattr(mc, "moe_competitors", lambda allow_jit=None, include=(): [fake])
    monkeypatch.setattr(mc, "moe_shape", lambda tp: mc.MoeShape(8, 2, 64, 128 // tp, tp))
    monkeypatch.setattr(timing, "l2_bytes", lambda: 1 << 16)
    monkeypatch.setattr(timing, "time_rotated", lambda calls: (7.0 * len(calls), "graph"))
    args = argparse.Namespace(vs="marlin", vs_tp="1,4", vs_tokens="1,3", vs_impls="default", vs_require="marlin",
                              allow_jit=False, vs_only=True)
    saved = []
    res = vs.run(args, bench, 1e12, log=lambda m: None, on_row=lambda r: saved.append(json.dumps(r)))
    assert prepared == [128, 32] and len(saved) == 4 and [(r["tp"], r["tokens"]) for r in res["rows"]] == [
        (1, 1), (1, 3), (4, 1), (4, 3)]
    for r in res["rows"]:
        assert set(r["us"]) == {"ours", "marlin"} and r["status"] == {} and r["marlin_over_ours"] == 1.0
        assert r["error"]["marlin"] < vs.TOLERANCE and r["sets"] >= 2
    assert json.loads(saved[-1])["rows"][-1]["inter"] == 32
    assert "| 4 | 32 | 3 |" in vs.table(res)


def test_mma_sync_pass_takes_the_native_pass_competitor_times():
    native = _fake_result()
    mma = {"mma_sync": True, "tp": [1, 4], "competitors": [], "rows": []}
    for r in native["rows"]:
        m = {k: v for k, v in r.items() if not k.endswith(("_pct_floor", "_over_ours"))}
        m.update(us={"ours": r["us"]["ours"] / 2}, status={}, error={})
        mma["rows"].append(m)
    mma["rows"].append(dict(mma["rows"][0], tokens=2, us={"ours": 30.0}))   # a point the native pass lacks
    got = vs.with_competitors_of(mma, native, "the native pass")
    assert [r["us"] for r in got["rows"]] == [{"ours": 25.0, "marlin": 40.0}, {"ours": 50.0, "marlin": 150.0},
                                              {"ours": 100.0}, {"ours": 30.0}]
    assert got["rows"][0]["marlin_over_ours"] == 1.6 and got["rows"][1]["marlin_over_ours"] == 3.0
    assert got["rows"][2]["status"]["marlin"].startswith("WRONG") and "marlin_over_ours" not in got["rows"][3]
    assert mma["rows"][0]["us"] == {"ours": 25.0}    # the input is left as it was
    assert "competitor times: the native pass" in vs.table(got)
