"""Issue 60 item 3 on the real wheels: where SGLang 0.5.16+ resolves `--moe-runner-backend auto` to FlashInfer's MXFP4
runner for DeepSeek-V4 on SM120, the fp4_moe runner rows (targets.py) declare the triton runner instead (whose
quant method, Fp8MoEMethod.apply, our adapter replaces) where the measurement in the dispatch cache says ours is faster
or FlashInfer's cannot run here, and leave SGLang's choice otherwise. SGLang's own resolution code runs (0.5.17: the
post-process pass through run_post_process_pass, as server_args.py calls it; 0.5.23: collect_model_override_declarations
over the registered providers); only the GPU check is answered as SM120 and the model config is a stand-in."""

import json

import pytest

from sglang_env import STUB_MISSING_MODULES, real_module_prelude, run_child, sglang_dir

# 0.5.23's `import sglang` needs transformers: its resolution modules run from their real files, the rest stood in
REAL_0523 = real_module_prelude("sglang.srt.arg_groups.overrides", "sglang.srt.arg_groups.model_override_base",
                                "sglang.srt.arg_groups.model_overrides",
                                "sglang.srt.arg_groups.model_overrides.deepseek_v4")

WRITE_ENTRY = """
import json, os, sys, types
from deepseek_v4_kernel.patch import decisions, measured
verdict = VERDICT
if verdict is not None:
    key = decisions.environment_key(0)
    d, _ = decisions.cache_dir()
    classes = {measured.size_class("fp4_moe", n): dict(verdict) for n in (1, 8, 32)}
    decisions.write_atomic(os.path.join(d, decisions.file_name(key)),
                           decisions.merge(decisions.new_entry(key), 4, {"fp4_moe_runner": {"classes": classes}}))
"""

V0517 = """
import sglang.srt.arg_groups.overrides as ov
ov.is_sm120_supported = lambda *a, **k: True           # the GPU check, answered as on SM120
from sglang.srt.arg_groups.overrides import _deepseek_v4_sm120_moe, run_post_process_pass   # as server_args.py does
hf = types.SimpleNamespace(architectures=["DeepseekV4ForCausalLM"])
sa = types.SimpleNamespace(moe_runner_backend=BACKEND, tp_size=4,
                           get_model_config=lambda: types.SimpleNamespace(hf_config=hf))
run_post_process_pass(sa, _deepseek_v4_sm120_moe)
declared = {}
for _, d in getattr(sa, "_resolved_overrides", None) or []:
    declared.update(d)
print("RESULT=" + json.dumps(declared.get("moe_runner_backend", BACKEND)))
"""

V0523 = """
import sglang.srt.arg_groups.overrides as ov
import sglang.srt.arg_groups.model_overrides                       # registers the providers
import sglang.srt.arg_groups.model_overrides.deepseek_v4 as dsv4
dsv4.get_platform = lambda: types.SimpleNamespace(is_hip=False, is_sm90=False, is_sm100=False, is_sm120=True)
hf = types.SimpleNamespace(architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", quantization_config={})
sa = types.SimpleNamespace(moe_runner_backend=BACKEND, tp_size=4, device="cuda", moe_a2a_backend="none",
                           fp8_gemm_runner_backend="auto", swa_full_tokens_ratio=0.1, model_path="m",
                           _model_config=types.SimpleNamespace(nvfp4_moe_meta=None, is_fp4_experts=True))
declared = {}
for source, d in ov.collect_model_override_declarations("DeepseekV4ForCausalLM", sa, hf):
    declared.update(d)
print("RESULT=" + json.dumps(declared.get("moe_runner_backend", BACKEND)))
"""


def _resolve(version, tmp_path, verdict, backend="auto", prefer=None):
    body = {"0.5.17": V0517, "0.5.23": V0523}[version]
    prelude = STUB_MISSING_MODULES if version == "0.5.17" else REAL_0523
    code = (prelude + WRITE_ENTRY.replace("VERDICT", repr(verdict))
            + body.replace("BACKEND", repr(backend)))
    env = {"DSV4_KERNEL_FORCE": "1", "DSV4_KERNEL_CACHE_DIR": str(tmp_path)}
    if prefer:
        env["DSV4_KERNEL_PREFER"] = prefer
    r = run_child(code, path=[sglang_dir(version)], env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("RESULT="))[len("RESULT="):])
    said = [l for l in r.stderr.splitlines() if "MoE runner for DeepSeek-V4" in l]
    return result, said


OURS_FASTER = {"winner": "ours", "ours_us": 50.0, "sglang": "flashinfer cutlass mxfp4 moe", "sglang_us": 80.0,
               "handback_runnable": True}
FLASHINFER_FASTER = dict(OURS_FASTER, winner="sglang", ours_us=90.0)
FLASHINFER_CANNOT_RUN = {"winner": "ours", "ours_us": 50.0, "sglang": "flashinfer cutlass mxfp4 moe", "sglang_us": None,
                         "handback_runnable": False, "why": "SGLang's flashinfer cutlass mxfp4 moe cannot run here: "
                                                           "FlashInfer's SM120 module is not built"}


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_measured_ours_faster_takes_the_triton_runner(version, tmp_path):
    result, said = _resolve(version, tmp_path, OURS_FASTER)
    assert result == "triton", said
    assert len(said) == 1 and "ours (triton runner) - measured fastest (least summed us over the decode classes " \
        "tokens1, tokens2-8, tokens9-32: tokens1: triton 50.0, flashinfer_mxfp4 80.0 us" in said[0], said
    assert f"read from {tmp_path}" in said[0], said


MARLIN_FASTEST = dict(OURS_FASTER, runners={"triton": 50.0, "marlin": 40.0, "flashinfer_mxfp4": 80.0})
MARLIN_UNTIMED = dict(OURS_FASTER, runners={"triton": 50.0, "marlin": None, "flashinfer_mxfp4": 80.0})


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_marlin_measured_fastest_takes_sglang_s_marlin_runner(version, tmp_path):
    result, said = _resolve(version, tmp_path, MARLIN_FASTEST)
    assert result == "marlin", said
    assert "SGLang's marlin - measured fastest" in said[0] and "marlin 40.0" in said[0], said
    # a runner not timed in every class is never chosen
    result, said = _resolve(version, tmp_path / "untimed", MARLIN_UNTIMED)
    assert result == "triton" and "marlin" not in said[0].split(" - ")[1].split("us")[0], said


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_flashinfer_faster_or_nothing_measured_keeps_sglang_choice(version, tmp_path):
    result, said = _resolve(version, tmp_path, FLASHINFER_FASTER)
    assert result == "flashinfer_mxfp4" and "SGLang's flashinfer_mxfp4 - measured fastest" in said[0], said
    # no entry, and the timing subprocess cannot run here (no GPU): SGLang's choice stands, and why is said
    result, said = _resolve(version, tmp_path / "empty", None)
    assert result == "flashinfer_mxfp4", said
    assert "not measured (the timing subprocess exited with 1: cache measure: needs a CUDA GPU" in said[0], said


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_flashinfer_that_cannot_run_here_takes_ours(version, tmp_path):
    result, said = _resolve(version, tmp_path, FLASHINFER_CANNOT_RUN)
    assert result == "triton" and "FlashInfer's MXFP4 runner cannot run on this GPU" in said[0], said


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_a_backend_the_user_passed_is_never_changed(version, tmp_path):
    for backend in ("flashinfer_mxfp4", "marlin"):
        result, said = _resolve(version, tmp_path, OURS_FASTER, backend=backend)
        assert result == backend and not said, said


@pytest.mark.parametrize("version", ["0.5.17", "0.5.23"])
def test_prefer_builtin_leaves_the_row_and_ours_takes_it_unmeasured(version, tmp_path):
    result, said = _resolve(version, tmp_path, OURS_FASTER, prefer="builtin")
    assert result == "flashinfer_mxfp4" and not said, said
    result, said = _resolve(version, tmp_path / "none", None, prefer="ours")
    assert result == "triton" and "DSV4_KERNEL_PREFER=ours" in said[0], said
