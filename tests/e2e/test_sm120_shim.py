"""The harness's SM120 view against the real SGLang 0.5.17 sources: the decision points table is exact and complete
for the files it scans, the view turns SGLang's decisions into SM120's on an emulated H200 while torch keeps the real
capability, and the start-up chain runs each sitecustomize once."""
import json
import os
import textwrap

import pytest

import e2e_env  # noqa: F401
import sm120_points as sp
from e2e_env import ROOT, SGLANG_VERSION
from sglang_env import STUB_MISSING_MODULES, real_module_prelude, run_child, sglang_dir

SHIM_DIR = os.path.join(ROOT, "tools", "e2e", "sm120_shim")

# SGLang's predicates read torch.cuda; a CPU machine emulates the H200 (sm_90, CUDA 13.0) for them
EMULATE_H200 = textwrap.dedent("""
    import torch
    torch.cuda.is_available = lambda: True
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.version.cuda = "13.0"
""")

MODULES = {
    "common": "sglang.srt.utils.common",
    "configurer": "sglang.srt.layers.deep_gemm_wrapper.configurer",
    "backend": "sglang.srt.layers.attention.deepseek_v4_backend",
    "fp8_utils": "sglang.srt.layers.quantization.fp8_utils",
    "fp8_kernel": "sglang.kernels.ops.quantization.fp8_kernel",
    "ds_utils": "sglang.srt.models.deepseek_common.utils",
    "overrides": "sglang.srt.arg_groups.overrides",
    "flash_mla_sm120": "sglang.kernels.ops.attention.flash_mla_sm120",
}

PROBE = textwrap.dedent("""
    import importlib, json, types
    m = {k: importlib.import_module(v) for k, v in MODULES.items()}
    view = lambda backend: types.SimpleNamespace(
        get_model_config=lambda: types.SimpleNamespace(
            hf_config=types.SimpleNamespace(architectures=["DeepseekV4ForCausalLM"])),
        moe_runner_backend=backend)
    fp8_backend = {}
    for choice in ("auto", "triton"):
        m["fp8_utils"].FP8_GEMM_RUNNER_BACKEND = None
        m["fp8_utils"].initialize_fp8_gemm_config(types.SimpleNamespace(fp8_gemm_runner_backend=choice,
                                                                        quantization="fp8"))
        fp8_backend[choice] = str(m["fp8_utils"].get_fp8_gemm_runner_backend().value)
    c = m["common"]
    print("RESULT=" + json.dumps({
        "is_sm120_supported": c.is_sm120_supported(), "is_sm90_supported": c.is_sm90_supported(),
        "is_blackwell": c.is_blackwell(), "is_hopper_with_cuda_12_3": c.is_hopper_with_cuda_12_3(),
        "get_device_sm": c.get_device_sm(), "get_device_capability": list(c.get_device_capability()),
        "ENABLE_JIT_DEEPGEMM": m["configurer"].ENABLE_JIT_DEEPGEMM,
        "backend._is_sm120": m["backend"]._is_sm120,
        "fp8_utils._is_sm120_supported": m["fp8_utils"]._is_sm120_supported,
        "fp8_kernel._is_sm120_supported": m["fp8_kernel"]._is_sm120_supported,
        "deepseek_common._device_sm": m["ds_utils"]._device_sm,
        "moe_auto": m["overrides"]._deepseek_v4_sm120_moe(view("auto")),
        "moe_marlin": m["overrides"]._deepseek_v4_sm120_moe(view("marlin")),
        "fp8_gemm_backend": fp8_backend,
        "sm120_flashmla_backend": m["flash_mla_sm120"]._sm120_default_backend,
        "torch_capability": list(__import__("torch").cuda.get_device_capability()),
    }))
""")


def _wheel_source(rel: str) -> str:
    with open(os.path.join(sglang_dir(SGLANG_VERSION), "sglang", rel)) as f:
        return f.read()


def _probe(view: bool, extra_env=None):
    d = sglang_dir(SGLANG_VERSION)
    names = list(MODULES.values())
    # sglang.srt.utils is real too: its __init__ re-exports common (`from .common import *`), as in the server
    code = (EMULATE_H200 + real_module_prelude(names[0], *names[1:], "sglang.srt.utils", "sglang.srt.environ")
            + f"\nMODULES = {MODULES!r}\n" + PROBE)
    env = {"DSV4_E2E_SM120_VIEW": "1"} if view else {}
    env.update(extra_env or {})
    r = run_child(code, path=[SHIM_DIR, d], env=env, with_root=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT=")]
    assert line, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(line[0][len("RESULT="):]), r.stderr


def test_points_table_matches_the_wheel():
    wrong = []
    for p in sp.POINTS:
        lines = _wheel_source(p.file).splitlines()
        if p.line > len(lines) or p.text not in lines[p.line - 1]:
            wrong.append(f"{p.file}:{p.line}: {p.text!r}")
        assert p.handling in ("view", "view+flag", "real", "same", "off-path"), p
        assert bool(p.flag) == (p.handling == "view+flag"), p
    assert wrong == []


def test_points_table_is_complete_for_the_scanned_files():
    rows = {(p.file, p.line) for p in sp.POINTS}
    missing = [f"{rel}:{i}: {line.strip()}" for rel in sp.FULLY_SCANNED
               for i, line in sp.decision_lines(_wheel_source(rel)) if (rel, i) not in rows]
    assert missing == [], "decision points not in tools/e2e/sm120_points.py:\n" + "\n".join(missing)


def test_without_the_view_the_emulated_h200_takes_its_sm90_paths():
    got, _ = _probe(view=False)
    assert got["is_sm120_supported"] is False and got["is_sm90_supported"] is True
    assert got["get_device_sm"] == 90 and got["backend._is_sm120"] is False
    assert got["ENABLE_JIT_DEEPGEMM"] is True  # deep_gemm is a stand-in here: importable
    assert got["moe_auto"] == {}
    assert got["fp8_gemm_backend"]["auto"] == "auto"


def test_the_view_gives_sm120_decisions_and_leaves_torch_alone():
    got, err = _probe(view=True, extra_env={"SGLANG_SM120_FLASHMLA_BACKEND": "triton"})
    assert got["is_sm120_supported"] is True and got["is_blackwell"] is True
    assert got["is_sm90_supported"] is False and got["is_hopper_with_cuda_12_3"] is False
    assert got["get_device_sm"] == 120 and got["get_device_capability"] == [12, 0]
    # module-level constants computed when their modules executed
    assert got["backend._is_sm120"] is True
    assert got["fp8_utils._is_sm120_supported"] is True and got["fp8_kernel._is_sm120_supported"] is True
    assert got["deepseek_common._device_sm"] == 120
    assert got["ENABLE_JIT_DEEPGEMM"] is False  # configurer.py:22, sm_version == 120
    # SGLang's SM120 defaults that need sm_120-only kernels, and the fallbacks the harness passes instead
    assert got["moe_auto"] == {"moe_runner_backend": "flashinfer_mxfp4"}
    assert got["moe_marlin"] == {}
    assert got["fp8_gemm_backend"] == {"auto": "cutlass", "triton": "triton"}
    assert got["sm120_flashmla_backend"] == "triton"
    # nothing else: kernels still see the real GPU
    assert got["torch_capability"] == [9, 0]
    assert err.count("[dsv4-e2e-shim] pid") == 1 and "SM120 view of SGLang" in err


def test_shim_runs_once_and_chains_to_ours_and_the_image(tmp_path):
    build = tmp_path / "dsv4"
    build.mkdir()
    # build/dsv4 as scripts/build.sh --no-ext lays it out: our sitecustomize.py and the package
    import shutil

    shutil.copy(os.path.join(ROOT, "sitecustomize.py"), build / "sitecustomize.py")
    shutil.copytree(os.path.join(ROOT, "deepseek_v4_kernel"), build / "deepseek_v4_kernel",
                    ignore=shutil.ignore_patterns("__pycache__", "_C*.so"))
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text("import sys\nprint('IMAGE-SITECUSTOMIZE', file=sys.stderr)\n")
    # our hook installs the patch layer (and prints its line) at the first import of a watched package
    child = "try:\n    import sglang\nexcept ImportError:\n    pass\nprint('child ran')"
    r = run_child(child, path=[SHIM_DIR, str(build), str(image)], with_root=False,
                  env={"DSV4_E2E_SM120_VIEW": "1", "DSV4_KERNEL_FORCE": "1", "DSV4_E2E_WEIGHT_SEED": "7"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("[dsv4-e2e-shim] pid") == 1, r.stderr
    assert "dummy weights: seeded (DSV4_E2E_WEIGHT_SEED=7" in r.stderr
    assert r.stderr.count("[deepseek_v4_kernel ") == 1, r.stderr
    assert r.stderr.count("IMAGE-SITECUSTOMIZE") == 1, r.stderr
    assert "child ran" in r.stdout


def test_a_bad_seed_is_reported_and_start_up_goes_on():
    r = run_child("print('child ran')", path=[SHIM_DIR], with_root=False, env={"DSV4_E2E_WEIGHT_SEED": "x"})
    assert r.returncode == 0 and "child ran" in r.stdout
    assert "DSV4_E2E_WEIGHT_SEED must be an integer, got 'x'" in r.stderr


def test_line_only_in_processes_that_import_sglang():
    quiet = run_child("print('child ran')", path=[SHIM_DIR], with_root=False, env={"DSV4_E2E_SM120_VIEW": "1"})
    assert quiet.returncode == 0 and "[dsv4-e2e-shim]" not in quiet.stderr
    loud = run_child("try:\n    import sglang\nexcept ImportError:\n    pass\ntry:\n    import sglang.srt\n"
                     "except ImportError:\n    pass", path=[SHIM_DIR], with_root=False, env={"DSV4_E2E_SM120_VIEW": "1"})
    assert loud.stderr.count("[dsv4-e2e-shim] pid") == 1, loud.stderr


def test_forced_predicates_keep_lru_cache_interface():
    import sys

    sys.path.insert(0, SHIM_DIR)
    try:
        from dsv4_e2e_shim import sm120_view
    finally:
        sys.path.remove(SHIM_DIR)
    import types

    common = types.SimpleNamespace(is_sm120_supported=None, is_sm90_supported=None, get_device_sm=None)
    forced = sm120_view.apply(common)
    assert forced == {"is_sm120_supported": True, "is_sm90_supported": False, "get_device_sm": 120}
    assert common.is_sm120_supported() is True and hasattr(common.is_sm120_supported, "cache_clear")
    assert common.get_device_sm() == 120
    assert not hasattr(common, "is_blackwell")  # absent names are not added


STAND_IN_TILELANG = textwrap.dedent('''
    import enum, json, os
    class PassConfigKey(str, enum.Enum):
        TL_DISABLE_TMA_LOWER = "tl.disable_tma_lower"
        TL_DISABLE_WARP_SPECIALIZED = "tl.disable_warp_specialized"
        TL_DISABLE_WGMMA = "tl.disable_wgmma"
    def jit(func=None, *, out_idx=None, pass_configs=None, **kw):
        def decorate(fn):
            cfg = {getattr(k, "value", k): v for k, v in (pass_configs or {}).items()}
            with open(os.environ["TL_RECORD"], "a") as f:
                f.write(json.dumps({"kernel": fn.__name__, "pass_configs": cfg, "out_idx": out_idx}) + "\\n")
            return fn
        return decorate(func) if callable(func) else decorate
''')

TILELANG_CHILD = textwrap.dedent('''
    import importlib
    try:
        import sglang  # noqa: F401  (the shim's line; not installed here)
    except ImportError:
        pass
    import tilelang
    @tilelang.jit
    def bare(): pass
    @tilelang.jit(out_idx=[1], pass_configs={tilelang.PassConfigKey.TL_DISABLE_TMA_LOWER: True,
                                             tilelang.PassConfigKey.TL_DISABLE_WGMMA: False})
    def with_configs(): pass
    def lazy(): pass
    importlib.import_module("tilelang").jit(**{})(lazy)   # mhc.py's lazy proxy: real_tilelang.jit(**kwargs)(fn)
    print("child ran")
''')


@pytest.mark.parametrize("forced", [True, False])
def test_tilelang_kernels_get_the_wgmma_switch_in_the_mma_class(tmp_path, forced):
    """DSV4_E2E_TL_DISABLE_WGMMA=1: every tilelang.jit (bare decorator, with arguments, through the module looked up
    again as mhc.py does) compiles with tl.disable_wgmma on, the kernel's own pass configs kept; without it, none."""
    pkg = tmp_path / "stand_in" / "tilelang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STAND_IN_TILELANG)
    record = tmp_path / "record.jsonl"
    env = {"TL_RECORD": str(record), "DSV4_E2E_SM120_VIEW": "1"}
    if forced:
        env["DSV4_E2E_TL_DISABLE_WGMMA"] = "1"
    r = run_child(TILELANG_CHILD, path=[SHIM_DIR, str(tmp_path / "stand_in")], with_root=False, env=env)
    assert r.returncode == 0 and "child ran" in r.stdout, r.stderr[-3000:]
    rows = {row["kernel"]: row for row in map(json.loads, open(record))}
    assert set(rows) == {"bare", "with_configs", "lazy"}
    assert rows["with_configs"]["out_idx"] == [1] and rows["with_configs"]["pass_configs"]["tl.disable_tma_lower"]
    for row in rows.values():
        assert row["pass_configs"].get("tl.disable_wgmma", False) is forced, rows
    assert ("TileLang: tl.disable_wgmma added to every tilelang.jit" in r.stderr) is forced


def test_sglang_compiles_its_tilelang_kernels_through_tilelang_jit():
    """Why wrapping tilelang.jit reaches every TileLang kernel of SGLang 0.5.17: each is built by the ``jit``
    attribute of the tilelang module (never a name imported from it, nor tilelang.compile / lower)."""
    import re

    root = os.path.join(sglang_dir(SGLANG_VERSION), "sglang")
    users, bypass = [], []
    for d, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            src = open(os.path.join(d, f), errors="replace").read()
            if "tilelang" not in src:
                continue
            rel = os.path.relpath(os.path.join(d, f), root)
            if re.search(r"@tilelang\.jit|real_tilelang\.jit\(", src):
                users.append(rel)
            if re.search(r"from tilelang import [^\n]*\bjit\b|tilelang\.compile\(|tilelang\.lower\(|"
                         r"tilelang\.jit\.compile\(", src):
                bypass.append(rel)
    assert sorted(users) == ["kernels/ops/attention/dsa/tilelang_kernel.py", "kernels/ops/layernorm/mhc.py"]
    assert bypass == []
