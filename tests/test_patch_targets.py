"""Every target row against the real SGLang wheels (oldest, middle, newest with DeepSeek-V4).

* the call sites: the keywords each SGLang caller passes (read from its source with ast)
  are all accepted by the row's replacement and listed in the row;
* the hook patches the real module in a fresh interpreter (FORCE=1, as on an H100);
* the conditions: SGLang's native SM120 path is left alone unless DSV4_KERNEL_PREFER=ours.
"""

import ast
import os
import sys

import pytest

from deepseek_v4_kernel.patch import targets
from sglang_env import (FLASH_MLA_LOADER_STUB, REPORT_JSON, ROOT, flash_mla_dir, parse_report, run_child,
                        sglang_dir, stand_in_deep_gemm)

FORCE = {"DSV4_KERNEL_FORCE": "1"}


def _rows_for(version):
    return [t for t in targets.TARGETS if t.applies_to_version(version)[0]]


def _source(version, module):
    base = sglang_dir(version)
    path = os.path.join(base, *module.split(".")) + ".py"
    assert os.path.exists(path), f"{module} missing in SGLang {version}"
    return path


def _call_keywords(path, attr):
    tree = ast.parse(open(path).read())
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == attr:
                calls.append({k.arg for k in node.keywords if k.arg is not None})
    return calls


@pytest.mark.parametrize("version", targets.TESTED)
def test_every_op_has_a_row_for_each_tested_version(version):
    ops = {t.op for t in targets.TARGETS}
    have = {t.op for t in _rows_for(version)}
    assert ops <= have, f"SGLang {version}: no target row for {sorted(ops - have)}"


@pytest.mark.parametrize("version", targets.TESTED)
def test_callers_pass_only_keywords_the_row_lists(version):
    checked = 0
    for t in _rows_for(version):
        for caller in t.callers:
            calls = _call_keywords(_source(version, caller), t.attr.split(".")[-1])
            assert calls, f"SGLang {version}: {caller} no longer calls {t.attr}"
            for kws in calls:
                assert kws <= set(t.params), f"SGLang {version} {caller} passes {sorted(kws - set(t.params))} to {t.attr}"
            checked += 1
    assert checked, f"no caller checked for SGLang {version}"


def _binds(tree, attr):
    """Whether a module's top level binds ``attr`` (a def, an assignment or an import, in any branch of a top-level
    if / try), or for ``Class.method`` a top-level class whose body defines the method."""
    def top(body):
        for node in body:
            if isinstance(node, (ast.If, ast.Try)):
                yield from top(node.body + node.orelse + getattr(node, "finalbody", [])
                               + [n for h in getattr(node, "handlers", []) for n in h.body])
            else:
                yield node
    if "." in attr:
        cls, name = attr.split(".")
        return any(isinstance(n, ast.ClassDef) and n.name == cls and _binds(ast.Module(body=n.body, type_ignores=[]), name)
                   for n in top(tree.body))
    for n in top(tree.body):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == attr:
            return True
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            tgts = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(x, ast.Name) and x.id == attr for t in tgts for x in ast.walk(t)):
                return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name.split(".")[0]) == attr
                                                               for a in n.names):
            return True
    return False


def test_binds_finds_only_real_bindings():
    """The check below must fail on a module that only mentions the name (a comment, a call, a string)."""
    mentions = ast.parse("# flash_mla_with_kvcache_sm120\nx = flash_mla_with_kvcache_sm120(1)\n"
                         "y = 'flash_mla_with_kvcache_sm120'\nclass A:\n    z = 1\n")
    assert not _binds(mentions, "flash_mla_with_kvcache_sm120") and not _binds(mentions, "A.apply")
    real = ast.parse("try:\n    from m import f as flash_mla_with_kvcache_sm120\nexcept ImportError:\n    pass\n"
                     "class A:\n    def apply(self):\n        pass\n")
    assert _binds(real, "flash_mla_with_kvcache_sm120") and _binds(real, "A.apply")


@pytest.mark.parametrize("version", targets.TESTED)
def test_owning_modules_exist_in_wheel(version):
    """Each row's module, in each tested wheel, binds the attribute the row replaces (ast, not a text search)."""
    for t in _rows_for(version):
        if t.kind == "env" or not t.module.startswith("sglang"):
            continue
        tree = ast.parse(open(_source(version, t.module)).read())
        assert _binds(tree, t.attr), f"SGLang {version}: {t.module} binds no {t.attr}"


def _import_and_report(version, modules, env, extra_path=(), prelude=""):
    code = prelude + "\n".join(f"import {m}" for m in modules) + "\n" + REPORT_JSON
    r = run_child(code, path=[sglang_dir(version), *extra_path], env=env)
    assert r.returncode == 0, r.stderr
    return {x["target"]: x for x in parse_report(r.stdout)}


SM120_DISPATCH = {
    "0.5.17": "sglang.kernels.ops.attention.flash_mla_sm120",
    "0.5.23": "sglang.kernels.ops.attention.flash_mla_sm120",
}


@pytest.mark.parametrize("version", sorted(SM120_DISPATCH))
def test_sm120_dispatcher_replaced_when_flashinfer_lacks_native_kernel(version):
    mod = SM120_DISPATCH[version]
    rows = _import_and_report(version, [mod], FORCE)
    row = rows[f"{mod}.flash_mla_with_kvcache_sm120"]
    assert row["status"] == "patched", row


@pytest.mark.parametrize("version", sorted(SM120_DISPATCH))
def test_native_flashinfer_sm120_kernel_is_left_unless_preferred(version, tmp_path):
    fi = tmp_path / "flashinfer"
    (fi / "mla").mkdir(parents=True)
    (fi / "__init__.py").write_text("")
    (fi / "mla" / "__init__.py").write_text("")
    (fi / "mla" / "_sparse_mla_sm120.py").write_text("# presence is what SGLang's dispatcher relies on\n")
    mod = SM120_DISPATCH[version]
    rows = _import_and_report(version, [mod], {**FORCE, "DSV4_KERNEL_PREFER": "builtin"}, extra_path=[str(tmp_path)])
    row = rows[f"{mod}.flash_mla_with_kvcache_sm120"]
    assert row["status"] == "left" and "FlashInfer" in row["reason"], row
    rows = _import_and_report(version, [mod], {**FORCE, "DSV4_KERNEL_PREFER": "ours"}, extra_path=[str(tmp_path)])
    assert rows[f"{mod}.flash_mla_with_kvcache_sm120"]["status"] == "patched"
    # measured dispatch (the default) wraps it and decides per size class (FlashInfer's stays where not timed)
    rows = _import_and_report(version, [mod], FORCE, extra_path=[str(tmp_path)])
    row = rows[f"{mod}.flash_mla_with_kvcache_sm120"]
    assert row["status"] == "patched", row


# FlashInfer's native SM120 module as a CPU stand-in: records what SGLang's FlashInfer path passes it
FAKE_FLASHINFER_SM120 = """
_DECODE_MAX_TOKENS = 64
CALLS = []
def _sparse_mla_sm120_paged_attention(q, kv, idx, output, out_lse, softmax_scale, **kw):
    CALLS.append(dict(q=tuple(q.shape), kv=tuple(kv.shape), idx=tuple(idx.shape), out=tuple(output.shape),
                      scale=softmax_scale, d_v=kw["d_v"], topk_length=tuple(kw["topk_length"].shape),
                      extra_idx=tuple(kw["extra_indices"].shape), extra_len=tuple(kw["extra_topk_length"].shape),
                      sink=tuple(kw["attn_sink"].shape)))
    output.fill_(1.0)
"""


@pytest.mark.parametrize("version", sorted(SM120_DISPATCH))
def test_bench_times_sglangs_own_flashinfer_path(version, tmp_path):
    """benchmarks/bench_sparse_decode.py's 'sgl-fi' competitor: SGLang's own dispatcher (not ours, even with
    DSV4_KERNEL_PREFER=ours) on its FlashInfer path, called with the keywords and row layout of SGLang's call site
    (b * s_q rows of one position); without FlashInfer's SM120 module it says so."""
    fi = tmp_path / "flashinfer"
    (fi / "mla").mkdir(parents=True)
    (fi / "__init__.py").write_text("")
    (fi / "mla" / "__init__.py").write_text("")
    (fi / "mla" / "_sparse_mla_sm120.py").write_text(FAKE_FLASHINFER_SM120)
    mod = SM120_DISPATCH[version]
    code = f"""
        import importlib, sys, torch
        sys.path.insert(0, {os.path.join(ROOT, "benchmarks")!r})
        import bench_sparse_decode as B
        try:
            fn = B.load_flashinfer_dispatcher()
        except Exception as e:
            print("UNAVAILABLE=" + type(e).__name__ + ": " + str(e))
            raise SystemExit(0)
        m = importlib.import_module({mod!r})
        print("OURS_INSTALLED=" + str(hasattr(m.flash_mla_with_kvcache_sm120, "__dsv4_original__")))
        print("SGLANGS_OWN=" + str(fn.__module__ == {mod!r} and not hasattr(fn, "__dsv4_original__")))
        b, s_q, h, topk, extra = 2, 3, 64, 8, 16
        cache = lambda pages: torch.zeros(pages, 64, 1, 584, dtype=torch.uint8)
        a = dict(q=torch.randn(b, s_q, h, 512).bfloat16(), k_cache=cache(4), extra_k_cache=cache(8),
                 indices=torch.zeros(b, s_q, topk, dtype=torch.int32), topk_length=torch.full((b,), topk),
                 extra_indices=torch.zeros(b, s_q, extra, dtype=torch.int32), extra_topk_length=torch.full((b,), extra),
                 attn_sink=torch.zeros(h))
        out = B.flashinfer_call(fn, [a], b, s_q, h)(a)
        from flashinfer.mla import _sparse_mla_sm120 as F
        print("CALL=" + repr(F.CALLS))
        print("OUT=" + repr(tuple(out[0].shape)) + " " + str(float(out[0].float().mean())))
    """
    env = {**FORCE, "DSV4_KERNEL_PREFER": "ours"}
    r = run_child(code, path=[sglang_dir(version), str(tmp_path)], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OURS_INSTALLED=True" in r.stdout and "SGLANGS_OWN=True" in r.stdout, r.stdout + r.stderr
    call = [line for line in r.stdout.splitlines() if line.startswith("CALL=")][0]
    calls = eval(call[len("CALL="):])
    assert len(calls) == 1, calls
    c = calls[0]
    assert c["q"] == (6, 64, 512) and c["idx"] == (6, 8) and c["extra_idx"] == (6, 16), c
    assert c["topk_length"] == (6,) and c["extra_len"] == (6,) and c["sink"] == (64,), c
    assert c["out"] == (6, 64, 512) and c["d_v"] == 512 and abs(c["scale"] - 512 ** -0.5) < 1e-12, c
    assert "OUT=(6, 1, 64, 512) 1.0" in r.stdout, r.stdout
    # without FlashInfer's SM120 module: unavailable, and the reason names it
    r = run_child(code, path=[sglang_dir(version)], env=env)
    assert r.returncode == 0, r.stderr
    assert "UNAVAILABLE=ModuleNotFoundError" in r.stdout and "flashinfer" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("version", sorted(SM120_DISPATCH))
def test_sm120_backend_env_triton_is_replaced(version, tmp_path):
    """A user who forced SGLang's Triton fallback gets ours instead (it is the slow path we exist for)."""
    mod = SM120_DISPATCH[version]
    rows = _import_and_report(version, [mod], {**FORCE, "SGLANG_SM120_FLASHMLA_BACKEND": "triton"})
    row = rows[f"{mod}.flash_mla_with_kvcache_sm120"]
    assert row["status"] == "patched", row


@pytest.mark.parametrize("version", sorted(SM120_DISPATCH))
def test_patched_dispatcher_runs_ours_then_hands_back(version):
    """Called as SGLang calls it, with CPU tensors: ours rejects them (UnsupportedCase, strict)
    or hands the call back to SGLang's own dispatcher (default), which then fails its own way."""
    mod = SM120_DISPATCH[version]
    code = f"""
        import logging, torch
        logging.basicConfig(level=logging.WARNING)
        from {mod} import flash_mla_with_kvcache_sm120 as f
        q = torch.randn(1, 1, 64, 512, dtype=torch.bfloat16)
        kc = torch.zeros(4, 256, 1, 584, dtype=torch.uint8)
        idx = torch.zeros(1, 1, 64, dtype=torch.int32)
        try:
            f(q=q, k_cache=kc, head_dim_v=512, softmax_scale=None, indices=idx, topk_length=None, attn_sink=None,
              extra_k_cache=None, extra_indices_in_kvcache=None, extra_topk_length=None)
        except Exception as e:
            print("RAISED=" + type(e).__name__)
    """
    strict = run_child(code, path=[sglang_dir(version)], env={**FORCE, "DSV4_KERNEL_STRICT": "1"})
    assert "RAISED=UnsupportedCase" in strict.stdout, strict.stdout + strict.stderr
    lenient = run_child(code, path=[sglang_dir(version)], env=FORCE)
    assert "handing this call back" in lenient.stderr, lenient.stderr
    assert "RAISED=UnsupportedCase" not in lenient.stdout


DSV4_MODEL = "sglang.srt.models.deepseek_v4"
KERNEL_HEADS = DSV4_MODEL + ".MqaAttentionBase._kernel_num_heads"
# MqaAttentionBase._kernel_num_heads of the real wheel, called as the attention forward calls it, for a rank of
# 16 heads at attention TP 4 (DeepSeek-V4: 64 heads); `blocker` stands for what the GPU would say
# (patch.adapters._unpadded_heads_blocker: "" = SM12x with a loadable library)
KERNEL_HEADS_CALL = """
import types, torch
import deepseek_v4_kernel.patch.adapters as ad
torch.cuda.is_available = lambda: True
torch.cuda.current_device = lambda: 0
attn = types.SimpleNamespace(attn_tp_size=4, n_local_heads=16, n_heads=64)
for blocker in ("", "GPU 0 is sm_90, not SM12x"):
    ad._unpadded_heads_blocker = lambda i, b=blocker: b
    try:
        print("HEADS=%d" % m.MqaAttentionBase._kernel_num_heads(attn, 1))
    except Exception as e:
        print("RAISED=" + type(e).__name__)
"""


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_decode_q_unpadded_where_the_sm120_sparse_decode_is_ours(version):
    """With ours as SGLang's SM120 dispatcher (the real module, its backend setting stood in: replaced), the model's
    head count for the kernel is the rank's own; where our kernel would not run (blocker), SGLang's method pads."""
    from sglang_env import real_module_prelude

    code = (real_module_prelude(DSV4_MODEL, SM120_DISPATCH["0.5.23"]) + f"\nimport {DSV4_MODEL} as m\n"
            + KERNEL_HEADS_CALL + REPORT_JSON)
    r = run_child(code, path=[sglang_dir(version)], env=FORCE)
    assert r.returncode == 0, r.stderr
    rows = {x["target"]: x for x in parse_report(r.stdout)}
    assert rows[f"{SM120_DISPATCH['0.5.23']}.flash_mla_with_kvcache_sm120"]["status"] == "patched"
    row = rows[KERNEL_HEADS]
    assert row["status"] == "patched" and row["handbacks"] == 1, row
    # ours: the rank's 16 heads; blocked: SGLang's own method (not on SM120 here: its platform is stood in) pads
    assert [l for l in r.stdout.splitlines() if l.startswith(("HEADS=", "RAISED="))] == ["HEADS=16", "HEADS=64"]
    assert "handing this call back" in r.stderr and "q stays padded to 64 heads: GPU 0 is sm_90" in r.stderr
    strict = run_child(code, path=[sglang_dir(version)], env={**FORCE, "DSV4_KERNEL_STRICT": "1"})
    assert [l for l in strict.stdout.splitlines() if l.startswith(("HEADS=", "RAISED="))] == \
        ["HEADS=16", "RAISED=UnsupportedCase"], strict.stdout + strict.stderr


@pytest.mark.parametrize("version", ["0.5.20", "0.5.23"])
def test_decode_q_padding_left_where_sglang_runs_its_own_sparse_decode(version):
    """The dispatcher not ours (here: a stand-in module, as when FlashInfer's native kernel runs), or the user's
    switch: the row is left."""
    from sglang_env import real_module_prelude

    code = real_module_prelude(DSV4_MODEL) + f"\nimport {DSV4_MODEL} as m\n" + REPORT_JSON
    r = run_child(code, path=[sglang_dir(version)], env=FORCE)
    assert r.returncode == 0, r.stderr
    row = {x["target"]: x for x in parse_report(r.stdout)}[KERNEL_HEADS]
    assert row["status"] == "left" and "SGLang's own SM120 sparse decode runs" in row["reason"], row
    # ours as the dispatcher, but the user's switch keeps the pad
    code = (real_module_prelude(DSV4_MODEL, SM120_DISPATCH["0.5.23"]) + f"\nimport {DSV4_MODEL} as m\n"
            + REPORT_JSON)
    r = run_child(code, path=[sglang_dir(version)], env={**FORCE, "DSV4_SPARSE_DECODE_UNPADDED_HEADS": "0"})
    assert r.returncode == 0, r.stderr
    row = {x["target"]: x for x in parse_report(r.stdout)}[KERNEL_HEADS]
    assert row["status"] == "left" and "DSV4_SPARSE_DECODE_UNPADDED_HEADS=0" in row["reason"], row


def test_decode_q_padding_row_inactive_before_0_5_20():
    row = next(t for t in targets.TARGETS if t.attr == "MqaAttentionBase._kernel_num_heads")
    for v in ("0.5.12", "0.5.17", "0.5.19"):
        assert not row.applies_to_version(v)[0], v
    for v in ("0.5.20", "0.5.23"):
        assert row.applies_to_version(v)[0], v


def test_flash_mla_for_sglang_0_5_12_is_patched_through_its_package():
    """SGLang 0.5.12 calls flash_mla.flash_mla_with_kvcache (the FlashMLA wheel's real Python
    files, with its CUDA loader stubbed): the interface attribute and the package's re-export."""
    code = FLASH_MLA_LOADER_STUB + """
import flash_mla, flash_mla.flash_mla_interface as fi
print("PKG=%s" % hasattr(flash_mla.flash_mla_with_kvcache, "__dsv4_original__"))
print("IFACE=%s" % hasattr(fi.flash_mla_with_kvcache, "__dsv4_original__"))
""" + REPORT_JSON
    r = run_child(code, path=[sglang_dir("0.5.12"), flash_mla_dir()], env=FORCE)
    assert r.returncode == 0, r.stderr
    assert "PKG=True" in r.stdout and "IFACE=True" in r.stdout, r.stdout + r.stderr
    rows = {x["target"]: x for x in parse_report(r.stdout)}
    assert rows["flash_mla.flash_mla_interface.flash_mla_with_kvcache"]["status"] == "patched"


def test_flash_mla_signature_covers_what_sglang_0_5_12_passes():
    import inspect
    import importlib.util
    import sys
    import types

    stub = types.ModuleType("flash_mla._loader")
    stub.get_ops = lambda use_legacy=False: None
    path = os.path.join(flash_mla_dir(), "flash_mla", "flash_mla_interface.py")
    saved = sys.modules.get("flash_mla._loader")
    sys.modules["flash_mla._loader"] = stub
    try:
        spec = importlib.util.spec_from_file_location("_dsv4_fmla_iface", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        if saved is None:
            sys.modules.pop("flash_mla._loader", None)
    have = set(inspect.signature(mod.flash_mla_with_kvcache).parameters)
    row = next(t for t in targets.TARGETS if t.module == "flash_mla.flash_mla_interface")
    assert set(row.params) <= have, sorted(set(row.params) - have)


def test_readme_table_matches_target_table():
    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")).read()
    assert targets.markdown_table() in readme, "README's target table is stale: paste targets.markdown_table()"


def _patch_real_module(version, module, env=FORCE, extra_path=()):
    """Import ``module`` from the real SGLang sources (other sglang modules stood in) and report."""
    from sglang_env import real_module_prelude

    code = real_module_prelude(module) + f"\nimport os, {module}\n" + \
        "print('ENV=' + repr({k: os.environ.get(k) for k in ('SGLANG_FP8_PAGED_MQA_LOGITS_TORCH', " \
        "'SGLANG_OPT_DEEPGEMM_HC_PRENORM')}))\n" + REPORT_JSON
    r = run_child(code, path=[sglang_dir(version), *extra_path], env=env)
    assert r.returncode == 0, r.stderr
    env_line = next(l for l in r.stdout.splitlines() if l.startswith("ENV="))
    return {x["target"]: x for x in parse_report(r.stdout)}, eval(env_line[4:])


INDEXER_MODULES = {
    "0.5.12": [("sglang.srt.layers.attention.dsv4.indexer", "fp8_paged_mqa_logits_torch"),
               ("sglang.srt.layers.attention.dsv4.tilelang_kernel", "tilelang_fp8_paged_mqa_logits")],
    "0.5.17": [("sglang.srt.layers.attention.dsv4.indexer", "fp8_paged_mqa_logits_torch_sm120"),
               ("sglang.kernels.ops.attention.dsa.tilelang_kernel", "tilelang_fp8_paged_mqa_logits")],
    "0.5.23": [("sglang.srt.layers.attention.dsv4.indexer", "fp8_paged_mqa_logits_torch_sm120"),
               ("sglang.kernels.ops.attention.dsa.tilelang_kernel", "tilelang_fp8_paged_mqa_logits")],
}


@pytest.mark.parametrize("version", sorted(INDEXER_MODULES))
def test_indexer_rows_patch_real_modules(version):
    for module, attr in INDEXER_MODULES[version]:
        rows, env = _patch_real_module(version, module)
        row = rows[f"{module}.{attr}"]
        assert row["status"] == "patched", row
        # the torch-path gate is ours to set only where SGLang does not choose on SM120 itself
        assert env["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == ("1" if version == "0.5.12" else None)


@pytest.mark.parametrize("version", targets.TESTED)
def test_indexer_dispatch_passes_eight_positional_arguments(version):
    """The rows list the fallback's parameter names: SGLang passes all eight positionally, as `fn(...)`."""
    path = _source(version, "sglang.srt.layers.attention.dsv4.indexer")
    calls = [n for n in ast.walk(ast.parse(open(path).read()))
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "fn"]
    assert any(len(c.args) == 8 and not c.keywords for c in calls), f"SGLang {version}: dispatch call changed"
    src = open(path).read()
    sig = src[src.index("def fp8_paged_mqa_logits_torch("):].split(")")[0]
    for name in ("q_fp8", "kvcache_fp8", "weight", "seq_lens", "page_table", "deep_gemm_metadata", "max_seq_len",
                 "clean_logits"):
        assert name in sig, (version, name)


HC_GATE = "SGLANG_OPT_DEEPGEMM_HC_PRENORM"
HC_HELPER = "sglang.kernels.ops.layernorm.mhc._use_deep_gemm_hc_prenorm"


@pytest.mark.parametrize("version", ["0.5.17", "0.5.20", "0.5.23"])
def test_hc_prenorm_rows_patch_real_modules(version):
    rows, env = _patch_real_module(version, "sglang.srt.layers.deep_gemm_wrapper.entrypoint")
    assert rows["sglang.srt.layers.deep_gemm_wrapper.entrypoint.tf32_hc_prenorm_gemm"]["status"] == "patched"
    if version == "0.5.23":
        assert env[HC_GATE] == "1"
        rows, _ = _patch_real_module(version, "sglang.kernels.ops.layernorm.mhc")
        assert rows[HC_HELPER]["status"] == "patched"
        assert rows["sglang.kernels.ops.layernorm.mhc.mhc_pre"]["status"] == "patched"
    else:   # 0.5.17 / 0.5.20 read the flag themselves (no helper) and import deep_gemm behind it: the condition
        # the env row's condition runs at the first SGLang import, where the prelude's stand-in finder already answers
        # `import deep_gemm` (sglang_env.STAND_IN); test_startup.py checks the unset case on the real wheels
        has_deep_gemm = True
        assert env[HC_GATE] == ("1" if has_deep_gemm else None), env
        assert rows[HC_GATE]["status"] == ("patched" if has_deep_gemm else "left"), rows[HC_GATE]
        rows, _ = _patch_real_module(version, "sglang.kernels.ops.layernorm.mhc")
        assert rows[HC_HELPER]["status"] == "inactive"
        assert rows["sglang.kernels.ops.layernorm.mhc.mhc_pre"]["status"] == "inactive"


def test_mhc_pre_keeps_sglangs_split_k_kernel_where_it_was_measured_faster(monkeypatch):
    """Inside SGLang 0.5.21+'s mhc_pre (wrapped: it runs, told its rows) the replaced gate answers False in the
    classes where SGLang's TileLang split-K pre-GEMM was measured faster (m 9-256), True elsewhere, outside mhc_pre,
    and everywhere under DSV4_KERNEL_PREFER=ours."""
    import importlib.util
    import types

    import torch

    from deepseek_v4_kernel.patch import adapters, policy

    envs = types.SimpleNamespace(SGLANG_OPT_DEEPGEMM_HC_PRENORM=types.SimpleNamespace(get=lambda: True))
    monkeypatch.setitem(sys.modules, "sglang.srt.environ", types.SimpleNamespace(envs=envs))
    monkeypatch.setitem(sys.modules, "sglang.srt.utils", types.SimpleNamespace(is_hip=lambda: False))
    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "deep_gemm" else real_find(name, *a))
    monkeypatch.delenv(policy.PREFER, raising=False)

    def gate_inside(rows):
        seen = []

        def original(residual, fn, **kw):
            seen.append(adapters.use_deep_gemm_hc_prenorm())
            return "ran"
        assert adapters.mhc_pre(original, torch.empty(rows, 4, 16, dtype=torch.bfloat16), None, rms_eps=1e-6) == "ran"
        return seen[0]
    assert [gate_inside(m) for m in (1, 8, 9, 64, 65, 256, 257, 1024, 4096)] == [
        True, True, False, False, False, False, True, True, True]
    assert adapters.use_deep_gemm_hc_prenorm()      # the fused post/pre step asks outside mhc_pre
    monkeypatch.setenv(policy.PREFER, "ours")
    assert gate_inside(256)


@pytest.mark.parametrize("version", ["0.5.17", "0.5.20"])
def test_hc_prenorm_gate_with_a_deep_gemm(version, tmp_path):
    """0.5.17-0.5.20's fused post/pre step imports deep_gemm behind the flag: with one importable (a stand-in with
    the prenorm attribute here) the flag is set, and whichever deep_gemm it is gets our prenorm GEMM."""
    rows, env = _patch_real_module(version, "sglang.kernels.ops.layernorm.mhc",
                                   extra_path=[stand_in_deep_gemm(tmp_path)])
    assert env[HC_GATE] == "1" and rows[HC_GATE]["status"] == "patched", rows[HC_GATE]


def test_hc_prenorm_gate_set_again_in_sglang_0_5_17_workers(tmp_path):
    """0.5.13-0.5.19's launcher sets the flag False on SM120 after start-up, in its own process; its scheduler /
    TP workers (spawned: this layer runs first there) inherit that value and the layer's mark, and set it again.
    A False the user gave (no mark) stays."""
    from deepseek_v4_kernel.patch import policy

    path = [stand_in_deep_gemm(tmp_path)]
    worker = {**FORCE, HC_GATE: "False", policy.ENV_SET: HC_GATE}
    rows, env = _patch_real_module("0.5.17", "sglang.srt.layers.deep_gemm_wrapper.entrypoint", env=worker,
                                   extra_path=path)
    assert env[HC_GATE] == "1" and rows[HC_GATE]["status"] == "patched" and "again" in rows[HC_GATE]["reason"]
    rows, env = _patch_real_module("0.5.17", "sglang.srt.layers.deep_gemm_wrapper.entrypoint",
                                   env={**FORCE, HC_GATE: "False"}, extra_path=path)
    assert env[HC_GATE] == "False" and rows[HC_GATE]["status"] == "left"


def test_hc_prenorm_user_setting_wins():
    rows, env = _patch_real_module("0.5.23", "sglang.kernels.ops.layernorm.mhc",
                                   env={**FORCE, "SGLANG_OPT_DEEPGEMM_HC_PRENORM": "0"})
    assert env["SGLANG_OPT_DEEPGEMM_HC_PRENORM"] == "0"
    assert next(r for r in rows.values() if r["target"] == "SGLANG_OPT_DEEPGEMM_HC_PRENORM")["status"] == "left"


def test_deep_gemm_prenorm_is_replaced_when_deep_gemm_is_imported(tmp_path):
    """No DeepGEMM wheel installs on a CPU machine: a stand-in module with the same attribute
    shows the row applies to whichever deep_gemm the image has."""
    r = run_child("import deep_gemm\nprint('WRAPPED=%s' % hasattr(deep_gemm.tf32_hc_prenorm_gemm, '__dsv4_original__'))",
                  path=[sglang_dir("0.5.23"), stand_in_deep_gemm(tmp_path)], env=FORCE)
    assert "WRAPPED=True" in r.stdout, r.stdout + r.stderr


# SGLang's FusedMoE calls quant_method.apply(layer=..., dispatch_output=...); this drives the real
# Fp8MoEMethod.apply of each wheel (patched by the hook) with a DeepSeek-V4-shaped MXFP4 layer as
# SGLang's loader leaves it (int8 packed e2m1, fp32 power-of-two scales), at tiny sizes so the
# Triton kernels run in interpreter mode on a CPU. Only the combine-input container is stood in.
FP4_MOE_APPLY = """
import collections, importlib, types, torch
import sglang.srt.layers.quantization.fp8 as fp8
from deepseek_v4_kernel.reference.fp4_moe import fp4_moe_reference, quantize_mxfp4
importlib.import_module("sglang.srt.layers.moe.token_dispatcher").StandardCombineInput = \\
    collections.namedtuple("StandardCombineInput", "hidden_states")

class Backend:
    def __init__(self, name): self.name = name
    def is_triton(self): return self.name == "triton"

torch.manual_seed(0)
E, H, I, M, K = 4, 64, 32, 5, 2
w13, s13 = quantize_mxfp4(torch.randn(E, 2 * I, H), scale_dtype=torch.float32)
w2, s2 = quantize_mxfp4(torch.randn(E, H, I), scale_dtype=torch.float32)
layer = types.SimpleNamespace(w13_weight=w13.view(torch.int8), w13_weight_scale_inv=s13,
                              w2_weight=w2.view(torch.int8), w2_weight_scale_inv=s2)
x = torch.randn(M, H).bfloat16()
ids = torch.randint(0, E, (M, K), dtype=torch.int32)
ids[1, 0] = -1  # a slot of an expert on another EP rank
tw = torch.rand(M, K)
d = types.SimpleNamespace(hidden_states=x, hidden_states_scale=None,
                          topk_output=types.SimpleNamespace(topk_weights=tw, topk_ids=ids, router_logits=None))
cfg = types.SimpleNamespace(activation="silu", is_gated=True, apply_router_weight_on_input=False, no_combine=False,
                            gemm1_alpha=None, gemm1_clamp_limit=None, swiglu_limit=1.0, routed_scaling_factor=1.5)
me = types.SimpleNamespace(is_fp4_expert=True, runner=types.SimpleNamespace(runner_backend=Backend("triton")),
                           moe_runner_config=cfg)
out = fp8.Fp8MoEMethod.apply(me, layer, d).hidden_states
ref = fp4_moe_reference(x, w13, s13, w2, s2, tw, ids, swiglu_limit=1.0, routed_scaling_factor=1.5)
print("ERR=%g" % ((out.double() - ref).abs().max() / ref.abs().max()).item())
me.runner.runner_backend = Backend("deep_gemm")  # not ours: SGLang's own method runs
try:
    fp8.Fp8MoEMethod.apply(me, layer, d)
except Exception as e:
    print("RAISED=" + type(e).__name__)
"""


@pytest.mark.parametrize("version", targets.TESTED)
def test_fp4_moe_apply_runs_ours_as_sglang_calls_it(version):
    from sglang_env import real_module_prelude

    code = real_module_prelude("sglang.srt.layers.quantization.fp8") + FP4_MOE_APPLY + REPORT_JSON
    lenient = run_child(code, path=[sglang_dir(version)], env={**FORCE, "TRITON_INTERPRET": "1"})
    assert lenient.returncode == 0, lenient.stderr
    rows = {x["target"]: x for x in parse_report(lenient.stdout)}
    row = rows["sglang.srt.layers.quantization.fp8.Fp8MoEMethod.apply"]
    assert row["status"] == "patched" and row["handbacks"] == 1, row
    err = float(next(l for l in lenient.stdout.splitlines() if l.startswith("ERR="))[4:])
    # bf16 output and bf16 h between the GEMMs: a few bf16 ulps of the largest element
    assert err < 2e-2, err
    assert "handing this call back" in lenient.stderr and "not triton" in lenient.stderr
    strict = run_child(code, path=[sglang_dir(version)],
                       env={**FORCE, "TRITON_INTERPRET": "1", "DSV4_KERNEL_STRICT": "1"})
    assert "RAISED=UnsupportedCase" in strict.stdout, strict.stdout + strict.stderr


def _imported_modules(path):
    """Every module an ``import`` / ``from ... import`` statement of the file names (relative ones resolved)."""
    tree = ast.parse(open(path).read())
    pkg = os.path.relpath(os.path.dirname(path), ROOT).replace(os.sep, ".")
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            names.add(base)
    return names


def test_ops_know_no_serving_engine():
    """deepseek_v4_kernel/ops (and the references) import nothing of SGLang, the patch layer or the engines' kernel
    packages: every SGLang-specific piece (call signatures, method replacements, its env flags) lives in
    deepseek_v4_kernel/patch, so the ops could serve another engine as they are."""
    engine = ("sglang", "deepseek_v4_kernel.patch", "flashinfer", "deep_gemm", "flash_mla", "sgl_kernel", "vllm")
    offenders = []
    for sub in ("ops", "reference"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, "deepseek_v4_kernel", sub)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    offenders += [(os.path.relpath(path, ROOT), m) for m in _imported_modules(path)
                                  if m.split(".")[0] in engine or m.startswith(engine)]
                    assert "SGLANG_" not in open(path).read(), f"{path} reads an SGLang environment flag"
    assert not offenders, offenders


def test_every_replacement_is_in_the_adapters_module():
    """The table's replacements all come from patch/adapters.py (one module maps SGLang's signatures onto the ops),
    and each resolves to a callable; the adapters module registers SGLang's determinism switch with hc_prenorm."""
    from deepseek_v4_kernel.patch.hook import resolve
    rows = [t for t in targets.TARGETS if t.kind == "replace"]
    assert rows and all(t.replacement.startswith("deepseek_v4_kernel.patch.adapters:") for t in rows), \
        [t.replacement for t in rows if not t.replacement.startswith("deepseek_v4_kernel.patch.adapters:")]
    assert all(callable(resolve(t.replacement)) for t in rows)
    from deepseek_v4_kernel.ops import hc_prenorm
    from deepseek_v4_kernel.patch import adapters
    assert adapters.sglang_deterministic_inference in hc_prenorm.DETERMINISTIC_SOURCES
