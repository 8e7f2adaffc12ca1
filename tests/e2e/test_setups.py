"""The three setups' environments and server commands, checked against SGLang 0.5.17's options."""
import os
import re

import pytest

import e2e_env  # noqa: F401
import setups as st
from e2e_env import SGLANG_VERSION

PATHS = st.Paths(work="/tmp/e2e", repo="/repo")


def _src(rel):
    from sglang_env import sglang_dir

    with open(os.path.join(sglang_dir(SGLANG_VERSION), "sglang", rel)) as f:
        return f.read()


def test_pythonpath_order():
    s = st.make_setups()
    assert st.pythonpath(s["a"], PATHS) == ["/tmp/e2e/tf", "/repo/tools/e2e/sm120_shim", "/tmp/e2e/site"]
    assert st.pythonpath(s["b"], PATHS) == ["/tmp/e2e/tf", "/repo/tools/e2e/sm120_shim", "/tmp/e2e/dsv4",
                                            "/tmp/e2e/site"]
    assert st.pythonpath(s["c"], PATHS)[0] == "/tmp/e2e/tf"


def test_environments():
    s = st.make_setups()
    base = {"PATH": "/bin", "DSV4_KERNEL_DISABLE": "1", "SGLANG_STALE": "1"}
    env = {k: st.server_env(s[k], PATHS, base, 5, "/w") for k in "abc"}
    assert all("DSV4_KERNEL_DISABLE" not in e and "SGLANG_STALE" not in e for e in env.values())
    assert env["a"]["DSV4_E2E_SM120_VIEW"] == env["b"]["DSV4_E2E_SM120_VIEW"] == "1"
    assert "DSV4_E2E_SM120_VIEW" not in env["c"]
    assert env["b"]["DSV4_KERNEL_FORCE"] == "1" and "DSV4_KERNEL_FORCE" not in env["a"]
    assert env["a"]["SGLANG_SM120_FLASHMLA_BACKEND"] == env["b"]["SGLANG_SM120_FLASHMLA_BACKEND"] == "triton"
    assert env["c"]["SGLANG_JIT_DEEPGEMM_PRECOMPILE"] == "0"
    assert all(e["DSV4_E2E_WEIGHT_SEED"] == "5" and e["NCCL_NVLS_ENABLE"] == "0" for e in env.values())
    assert all(e["SGLANG_DSV4_FP4_EXPERTS"] == "1" for e in env.values())


def test_commands():
    s = st.make_setups()
    cmd = st.server_command(s["b"], PATHS, port=1234, tp=2, cuda_graphs=False, mtp=True)
    joined = " ".join(cmd)
    assert "--tp-size 2" in joined and "--load-format dummy" in joined and "--skip-tokenizer-init" in joined
    assert "--moe-runner-backend triton" in joined and "--fp8-gemm-backend triton" in joined
    assert "--cuda-graph-backend-decode disabled" in joined and "--speculative-algorithm EAGLE" in joined
    assert "--moe-runner-backend marlin" in " ".join(st.server_command(s["c"], PATHS, port=1))
    with pytest.raises(ValueError, match="tp must be >= 1"):
        st.server_command(s["a"], PATHS, port=1, tp=0)
    with pytest.raises(ValueError, match="moe_c"):
        st.make_setups("triton")


def _cli_flags():
    src = _src("srt/server_args.py")
    fields = set(re.findall(r"^    (\w+): A\[", src, re.M))
    flags = {"--" + f.replace("_", "-") for f in fields} | set(re.findall(r'"(--[a-z0-9-]+)"', src))
    return src, flags


def test_every_flag_and_choice_exists_in_sglang():
    src, flags = _cli_flags()
    s = st.make_setups()
    for key in "abc":
        for mtp in (False, True):
            for graphs in (False, True):
                cmd = st.server_command(s[key], PATHS, port=1, cuda_graphs=graphs, mtp=mtp)
                unknown = [a for a in cmd if a.startswith("--") and a not in flags]
                assert unknown == [], unknown
    moe = re.search(r"MOE_RUNNER_BACKEND_CHOICES = \[(.*?)\]", src, re.S).group(1)
    fp8 = re.search(r"FP8_GEMM_RUNNER_BACKEND_CHOICES = \[(.*?)\]", src, re.S).group(1)
    assert all(f'"{x}"' in moe for x in ("marlin", "triton", "flashinfer_mxfp4"))
    assert '"triton"' in fp8


def test_environment_variables_exist_in_sglang():
    env_src = _src("srt/environ.py")
    for name in ("SGLANG_SM120_FLASHMLA_BACKEND", "SGLANG_JIT_DEEPGEMM_PRECOMPILE", "SGLANG_DSV4_FP4_EXPERTS"):
        assert re.search(rf"^\s+{name} = Env", env_src, re.M), name
    dispatcher = _src("kernels/ops/attention/flash_mla_sm120.py")
    assert 'if _sm120_default_backend == "triton":' in dispatcher


def test_stock_triton_runner_cannot_take_mxfp4_experts():
    # why (a) and (c) run Marlin: the triton runner feeds the int8 MXFP4 weights to its FP8 kernel
    fp8 = _src("srt/layers/quantization/fp8.py")
    info = fp8[fp8.index("def get_triton_quant_info"):fp8.index("def apply(", fp8.index("def get_triton_quant_info"))]
    assert "use_fp8_w8a8=not use_rocm_mxfp8" in info and "fp4" not in info
    assert 'f"Hidden size mismatch"' in _src("srt/layers/moe/moe_runner/triton_utils/fused_moe.py")
    assert "return Mxfp4MarlinMoEMethod(fp8_method, prefix=prefix)" in fp8


def test_session_names():
    import run_e2e

    assert run_e2e.parse_session("b-graphs-mtp")[:5] == ("b", True, True, False, False)
    assert run_e2e.parse_session("b-graphs-soak")[:5] == ("b", True, False, True, False)
    assert run_e2e.parse_session("b-graphs-measured")[:5] == ("b", True, False, False, True)
    native = run_e2e.parse_session("a-graphs-native")
    assert native.native and native.timed and native.profile_key == "a-native"
    first, second = run_e2e.parse_session("b-graphs-default"), run_e2e.parse_session("b-graphs-default-restart")
    assert first.default and not first.restart and first.base is None
    assert second.default and second.restart and second.base == "b-graphs-default"
    # one throughput table and profile per profile key: graphs sessions without MTP, measured or default settings
    assert [run_e2e.parse_session(n).timed for n in ("b-graphs", "b-graphs-mtp", "b-graphs-measured", "c-eager",
                                                     "b-graphs-default", "b-graphs-soak")] \
        == [True, False, False, False, False, False]
    for bad in ("d-graphs", "b-fast", "b", "b-graphs-mtp-mtp"):
        with pytest.raises(ValueError, match="expected"):
            run_e2e.parse_session(bad)
    with pytest.raises(ValueError, match="setup b only"):
        run_e2e.parse_session("a-graphs-measured")
    with pytest.raises(ValueError, match="setup b only"):
        run_e2e.parse_session("c-graphs-default")
    with pytest.raises(ValueError, match="c is native already"):
        run_e2e.parse_session("c-graphs-native")
    with pytest.raises(ValueError, match="follows -default"):
        run_e2e.parse_session("b-graphs-restart")
    with pytest.raises(ValueError, match="no other modifier"):
        run_e2e.parse_session("b-graphs-measured-default")


def test_instruction_classes_and_their_caches():
    """(a) and (b) build Triton and TileLang in SM120's class (DISABLE_MMA_V3=1, the shim's TileLang switch) unless
    native; (c) is native; each class has its own kernel-cache directories, and an inherited variable of either
    class never leaks into a server."""
    s = st.make_setups()
    base = {"PATH": "/bin", "DISABLE_MMA_V3": "1", "TRITON_CACHE_DIR": "/elsewhere", "TL_DISABLE_WGMMA": "1"}
    env = {k: st.server_env(s[k], PATHS, base, 0, "/w") for k in "abc"}
    for k in "ab":
        assert env[k]["DISABLE_MMA_V3"] == "1" and env[k]["DSV4_E2E_TL_DISABLE_WGMMA"] == "1"
        assert env[k]["TRITON_CACHE_DIR"] == "/tmp/e2e/cache/mma/triton"
        assert env[k]["TILELANG_CACHE_DIR"] == "/tmp/e2e/cache/mma/tilelang"
        assert env[k]["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/e2e/cache/mma/inductor"
    native_b = st.server_env(s["b"], PATHS, base, 0, "/w", native=True)
    for e in (env["c"], native_b):
        assert "DISABLE_MMA_V3" not in e and "DSV4_E2E_TL_DISABLE_WGMMA" not in e and "TL_DISABLE_WGMMA" not in e
        assert e["TRITON_CACHE_DIR"] == "/tmp/e2e/cache/native/triton"
    assert [st.instruction_class(s[k]) for k in "abc"] == ["mma", "mma", "native"]
    assert st.instruction_class(s["a"], native=True) == "native"
    with pytest.raises(ValueError, match="instruction class"):
        st.class_env("wgmma", "/c")


def test_disable_mma_v3_is_read_by_this_triton():
    """Triton 3.6.0 reads DISABLE_MMA_V3 in libtriton and makes it part of the kernel cache key
    (get_cache_invalidating_env_vars), so a variable the servers' environment sets does take effect."""
    import subprocess
    import sys

    code = ("import json, os; from triton._C.libtriton import get_cache_invalidating_env_vars as g; "
            "a = g(); os.environ['DISABLE_MMA_V3'] = '1'; print(json.dumps([a, g()]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != "DISABLE_MMA_V3"})
    if r.returncode and "No module named 'triton'" in r.stderr:
        pytest.skip("triton is not installed here")
    assert r.returncode == 0, r.stderr[-2000:]
    import json

    without, with_it = json.loads(r.stdout.strip().splitlines()[-1])
    assert "DISABLE_MMA_V3" not in without and with_it.get("DISABLE_MMA_V3") in ("1", "true", True)


def test_extra_args_and_env_per_setup():
    s = st.make_setups(extra_args={"b": ["--enable-x", "1"]}, extra_env={"b": {"DSV4_KERNEL_FP8_LINEAR": "1"},
                                                                         "a": {"SGLANG_Y": "2"}})
    assert s["b"].server_args[-2:] == ("--enable-x", "1") and "--fp8-gemm-backend" in s["b"].server_args
    assert dict(s["b"].env)["DSV4_KERNEL_FP8_LINEAR"] == "1" and dict(s["b"].env)["DSV4_KERNEL_FORCE"] == "1"
    assert dict(s["a"].env)["SGLANG_Y"] == "2" and "SGLANG_Y" not in dict(s["c"].env)
    cmd = " ".join(st.server_command(s["b"], PATHS, port=1))
    assert "--enable-x 1" in cmd
    with pytest.raises(ValueError, match="setup keys"):
        st.make_setups(extra_args={"d": ["--x"]})
    import run_e2e

    args, env = run_e2e.parse_setup_extras(["b=--foo 'a b'", "b=--bar"], ["b:K=v=w", "c:J="])
    assert args == {"b": ["--foo", "a b", "--bar"]} and env == {"b": {"K": "v=w"}, "c": {"J": ""}}
    for bad in (["x=--foo"], ["b--foo"]):
        with pytest.raises(ValueError, match="--setup-arg"):
            run_e2e.parse_setup_extras(bad, [])
    with pytest.raises(ValueError, match="--setup-env"):
        run_e2e.parse_setup_extras([], ["b=K=v"])


def test_default_settings_variant():
    """(b) with default settings: no MoE runner flag, no DSV4_KERNEL_PREFER; the rest of (b) kept."""
    b = st.make_setups(extra_env={"b": {"DSV4_KERNEL_PREFER": "measured"}})["b"]
    d = st.default_variant(b)
    assert "--moe-runner-backend" not in d.server_args and d.server_args == ("--fp8-gemm-backend", "triton")
    assert "DSV4_KERNEL_PREFER" not in dict(d.env) and dict(d.env)["DSV4_KERNEL_FORCE"] == "1"
    assert d.our_patch and d.sm120_view
    with pytest.raises(ValueError, match="setup b"):
        st.default_variant(st.make_setups()["a"])


def test_measured_session_reads_the_user_bench_file(tmp_path):
    """A -measured session's servers get DSV4_KERNEL_PREFER=measured and the directory the prepare stage's user bench
    wrote into; its result carries that file (the report checks the kept classes against it)."""
    import json

    import run_e2e

    env = run_e2e.measured_env(str(tmp_path))
    assert env == {"DSV4_KERNEL_PREFER": "measured", "DSV4_KERNEL_MEASURED": str(tmp_path / "measured")}
    assert run_e2e.measured_file(str(tmp_path)) is None
    (tmp_path / "measured").mkdir()
    (tmp_path / "measured" / "bench-nvidia-h200-sm90-tp1.json").write_text(json.dumps({"ops": {}}))
    assert run_e2e.measured_file(str(tmp_path)) == {"file": "bench-nvidia-h200-sm90-tp1.json", "ops": {}}
