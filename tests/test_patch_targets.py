"""Every target row against the real SGLang wheels (oldest, middle, newest with DeepSeek-V4).

* the call sites: the keywords each SGLang caller passes (read from its source with ast)
  are all accepted by the row's replacement and listed in the row;
* the hook patches the real module in a fresh interpreter (FORCE=1, as on an H100);
* the conditions: SGLang's native SM120 path is left alone unless DSV4_KERNEL_PREFER=ours.
"""

import ast
import os

import pytest

from deepseek_v4_kernel.patch import targets
from sglang_env import FLASH_MLA_LOADER_STUB, REPORT_JSON, flash_mla_dir, parse_report, run_child, sglang_dir

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
            calls = _call_keywords(_source(version, caller), t.attr)
            assert calls, f"SGLang {version}: {caller} no longer calls {t.attr}"
            for kws in calls:
                assert kws <= set(t.params), f"SGLang {version} {caller} passes {sorted(kws - set(t.params))} to {t.attr}"
            checked += 1
    assert checked, f"no caller checked for SGLang {version}"


@pytest.mark.parametrize("version", targets.TESTED)
def test_owning_modules_exist_in_wheel(version):
    for t in _rows_for(version):
        if t.kind == "env" or not t.module.startswith("sglang"):
            continue
        src = open(_source(version, t.module)).read()
        assert f"def {t.attr}" in src or f"{t.attr} =" in src or f"import {t.attr}" in src or t.attr in src, \
            f"SGLang {version}: {t.module} has no {t.attr}"


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
    rows = _import_and_report(version, [mod], FORCE, extra_path=[str(tmp_path)])
    row = rows[f"{mod}.flash_mla_with_kvcache_sm120"]
    assert row["status"] == "left" and "FlashInfer" in row["reason"], row
    rows = _import_and_report(version, [mod], {**FORCE, "DSV4_KERNEL_PREFER": "ours"}, extra_path=[str(tmp_path)])
    assert rows[f"{mod}.flash_mla_with_kvcache_sm120"]["status"] == "patched"


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
