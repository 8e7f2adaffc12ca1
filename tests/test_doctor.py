"""The doctor runs anywhere, and its self-test checks are themselves correct (run here on the CPU
under the Triton interpreter at small sizes; on a GPU at full size)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import HAS_CUDA, ROOT
from deepseek_v4_kernel import selftest


def test_doctor_json_runs_without_gpu_and_lists_every_target():
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "doctor", "--json", "--no-selftest"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    from deepseek_v4_kernel.patch.targets import TARGETS

    assert len(d["patch"]["targets"]) == len(TARGETS)
    assert "extension" in d and "versions" in d


def test_doctor_text_says_what_would_happen():
    env = {**os.environ, "DSV4_KERNEL_FORCE": "1", "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "doctor"], capture_output=True, text=True,
                       cwd=ROOT, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "patch layer: ACTIVE" in r.stdout
    # (several GPUs: "self-test (on N GPUs):", test_doctor_text_names_the_gpu_of_each_check_when_there_are_several)
    assert "self-test:" in r.stdout or "self-test (on " in r.stdout, r.stdout


@pytest.mark.parametrize("version, says, not_says", [
    ((3, 6), ["the defaults as measured"], ["newer than the newest"]),
    ((3, 8), ["dot_scaled, not dequant", "per tile where Triton builds wgmma"], ["newer than the newest"]),
    ((3, 9), ["dot_scaled, not dequant", "per tile where Triton builds wgmma"], ["newer than the newest"]),
    ((3, 10), ["slower under triton 3.9, the newest measured", "is newer than the newest measured here (3.9)"], [])])
def test_doctor_says_the_triton_dependent_choices(monkeypatch, version, says, not_says):
    from deepseek_v4_kernel import doctor
    from deepseek_v4_kernel.ops import _device, fp4_moe, hc_prenorm

    for mod in (_device, fp4_moe, hc_prenorm):   # the ops hold the function by name
        monkeypatch.setattr(mod, "triton_version", lambda: version)
    text = doctor._triton_choices_info()
    assert text.startswith("triton " + ".".join(map(str, version))), text
    for s in says:
        assert s in text, text
    for s in not_says:
        assert s not in text, text


def test_cli_usage_errors():
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "nonsense"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 2 and "usage" in r.stderr


def test_doctor_text_names_the_gpu_of_each_check_when_there_are_several():
    from deepseek_v4_kernel import doctor

    d = doctor.collect(run_selftest=False, import_modules=False)
    one = [{"op": "sparse_decode", "device": "cuda:0", "ok": True, "detail": "fine"}]
    d["selftest"] = one
    text = doctor.format_text(d)
    assert "self-test:\n  [PASS] sparse_decode  fine" in text  # one GPU: the output as before
    d["selftest"] = one + [{"op": "sparse_decode", "device": "cuda:1", "ok": False, "detail": "bad"}]
    text = doctor.format_text(d)
    assert "self-test (on 2 GPUs):" in text
    assert "[PASS] cuda:0 sparse_decode  fine" in text and "[FAIL] cuda:1 sparse_decode  bad" in text


def test_doctor_devices_argument_is_checked():
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "doctor", "--devices", "0,x"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "--devices takes CUDA device indices" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "doctor", "--devices", ","],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and "no device index given" in r.stderr, r.stderr


@pytest.mark.skipif(HAS_CUDA, reason="the GPU variant runs in the doctor")
def test_selftest_indexer_check_on_cpu_interpreter():
    assert "rel err" in selftest.check_indexer_logits(device="cpu")


@pytest.mark.skipif(HAS_CUDA, reason="the GPU variant runs in the doctor")
def test_selftest_hc_prenorm_check_on_cpu_interpreter():
    assert "rel err" in selftest.check_hc_prenorm(device="cpu", K=512)


@pytest.mark.skipif(HAS_CUDA, reason="the GPU variant runs in the doctor")
def test_selftest_fp4_moe_check_on_cpu_interpreter():
    assert "rel err" in selftest.check_fp4_moe(device="cpu", hidden=64, inter=64, experts=8)


@pytest.mark.gpu
def test_selftest_all_pass_on_gpu():
    results = selftest.run_all()
    assert results and all(r["ok"] for r in results), results
