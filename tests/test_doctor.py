"""The doctor runs anywhere, and its self-test checks are themselves correct (run here on the CPU
under the Triton interpreter at small sizes; on a GPU at full size)."""

import ast
import json
import os
import subprocess
import sys
import textwrap

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

    for mod in (_device, fp4_moe.dispatch, hc_prenorm.dispatch):   # the ops hold the function by name
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


def test_selftest_decides_without_assert_statements():
    """`python -O` (PYTHONOPTIMIZE) strips asserts: a bound checked by one would pass anything there."""
    tree = ast.parse(open(selftest.__file__).read())
    asserts = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert not asserts, f"selftest.py decides with assert at lines {asserts}"


# Every op replaced by a broken one (its float64 reference, off by half, or zeros); the checks then run on the CPU
# (the references and the broken ops are torch code: no kernel runs).
BROKEN_OPS = """
import json, sys
from deepseek_v4_kernel import selftest
from deepseek_v4_kernel.ops import fp4_moe, hc_prenorm, indexer_logits, sparse_decode
from deepseek_v4_kernel.reference.hc_prenorm import hc_prenorm_gemm_ref
from deepseek_v4_kernel.reference.indexer_logits import paged_mqa_logits_ref
from deepseek_v4_kernel.reference.sparse_decode import sparse_decode_ref

def broken_sparse_decode(q, cache, idx, **kw):
    out, lse = sparse_decode_ref(q, cache, idx, **kw)
    return (out * 1.5).to(q.dtype), lse.float()

def broken_indexer(q, cache, w, lens, table, max_len, clean_logits=True):
    return (paged_mqa_logits_ref(q, cache, w, lens, table, max_len) * 1.5).float()

def broken_hc_prenorm(x, fn, out, sq, num_splits=None, **kw):
    ref_out, ref_sq = hc_prenorm_gemm_ref(x, fn, num_splits)
    out.copy_(ref_out * 1.5)
    sq.copy_(ref_sq)

def broken_fp4_moe(*args, out=None, **kw):
    return out.zero_()

sparse_decode.sparse_decode = broken_sparse_decode
indexer_logits.paged_mqa_logits = broken_indexer
hc_prenorm.hc_prenorm_gemm = broken_hc_prenorm
fp4_moe.fp4_moe = broken_fp4_moe
selftest.CHECKS["hc_prenorm"] = lambda device: selftest.check_hc_prenorm(device=device, K=512)
selftest.CHECKS["fp4_moe"] = lambda device: selftest.check_fp4_moe(device=device, hidden=64, inter=64, experts=8)
print("OPTIMIZED=%s" % (not __debug__))
print("RESULTS=" + json.dumps(selftest.run_all(["cpu"])))
"""


def test_selftest_fails_broken_ops_under_python_optimize():
    """The doctor's self-test under `python -O`: each broken op FAILs, the message naming the op, the quantity,
    its value and the bound."""
    r = subprocess.run([sys.executable, "-O", "-c", textwrap.dedent(BROKEN_OPS)], capture_output=True, text=True,
                       cwd=ROOT, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, r.stderr
    assert "OPTIMIZED=True" in r.stdout, r.stdout
    results = json.loads(next(l for l in r.stdout.splitlines() if l.startswith("RESULTS="))[len("RESULTS="):])
    assert [x["op"] for x in results] == list(selftest.CHECKS), results
    said = {x["op"]: x["detail"] for x in results}
    for x in results:
        assert not x["ok"] and x["detail"].startswith(f"CheckFailed: {x['op']}: "), x
    assert "out rel err = 0.5, not < the bound 0.01 (bf16 output)" in said["sparse_decode"], said
    assert "rel err = 0.5, not < the bound 0.002" in said["indexer_logits"], said
    assert "m=5 splits=64: out rel err = 0.5, not < the bound 0.002" in said["hc_prenorm"], said
    assert "out rel err = 1, not < the bound 0.02" in said["fp4_moe"], said


def test_doctor_says_whether_the_start_up_hook_ran(tmp_path):
    """Ours ran; an image's sitecustomize.py first on the path shadowed it (Python runs only the first one)."""
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text("IMAGE = True\n")
    doctor = [sys.executable, "-m", "deepseek_v4_kernel", "doctor", "--no-selftest"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
    for path, says in (([ROOT], "start-up hook (sitecustomize.py): ran (" + os.path.join(ROOT, "sitecustomize.py")),
                       ([str(image), ROOT], f"start-up hook (sitecustomize.py): did not run: Python ran "
                                            f"{image / 'sitecustomize.py'}, the first sitecustomize.py on sys.path")):
        r = subprocess.run(doctor, capture_output=True, text=True, cwd=str(tmp_path), timeout=300,
                           env={**env, "PYTHONPATH": os.pathsep.join(path)})
        assert r.returncode == 0, r.stderr
        assert says in r.stdout, r.stdout
