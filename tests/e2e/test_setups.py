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

    assert run_e2e.parse_session("b-graphs-mtp") == ("b", True, True, False, False)
    assert run_e2e.parse_session("b-graphs-soak") == ("b", True, False, True, False)
    assert run_e2e.parse_session("b-graphs-measured") == ("b", True, False, False, True)
    # one throughput table and profile per setup: graphs sessions without MTP or the measured setting
    assert [run_e2e.parse_session(n).timed for n in ("b-graphs", "b-graphs-mtp", "b-graphs-measured", "c-eager")] \
        == [True, False, False, False]
    for bad in ("d-graphs", "b-fast", "b"):
        with pytest.raises(ValueError, match="expected"):
            run_e2e.parse_session(bad)
    with pytest.raises(ValueError, match="setup b only"):
        run_e2e.parse_session("a-graphs-measured")


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
