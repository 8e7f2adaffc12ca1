"""A broken install or a bad switch value: the doctor still reports (text and --json), naming what is wrong, and the
serving side hands back to SGLang instead of dying.

* A truncated _C.so (an interrupted copy, a full disk): dlopen maps segments past the end of the file and the first
  access raises SIGBUS, which killed the doctor without a word (exit 135). _ext.elf_problem refuses it first.
* A switch holding a value we do not read (DSV4_KERNEL_FORCE=maybe): the doctor said nothing but a traceback.
"""
import _ctypes
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from deepseek_v4_kernel import _ext
from deepseek_v4_kernel.errors import ExtensionUnavailable

DOCTOR = [sys.executable, "-m", "deepseek_v4_kernel", "doctor", "--no-selftest"]
BUILT = os.path.join(ROOT, "build", "dsv4", "deepseek_v4_kernel", "_C.so")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
    env.update(PYTHONPATH=ROOT, **extra)
    return env


def _truncated_library(tmp_path):
    """A real shared library cut to half its size: the built _C.so where there is one, else one of Python's own
    extension modules (present wherever CPython runs; dlopen of its truncated copy raises SIGBUS the same way)."""
    src = BUILT if os.path.exists(BUILT) else _ctypes.__file__
    dst = tmp_path / "_C.so"
    shutil.copyfile(src, dst)
    os.truncate(dst, os.path.getsize(src) // 2)
    return str(dst)


def test_elf_problem_names_a_truncated_file_and_accepts_whole_ones(tmp_path):
    bad = _truncated_library(tmp_path)
    why = _ext.elf_problem(bad)
    assert why is not None and why.startswith("truncated: the file has ") and "ELF headers describe" in why, why
    assert _ext.elf_problem(_ctypes.__file__) is None
    if os.path.exists(BUILT):
        assert _ext.elf_problem(BUILT) is None
    text = tmp_path / "text.so"
    text.write_bytes(b"not a library\n")
    assert _ext.elf_problem(str(text)).startswith("not an ELF shared library (14 bytes")
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    assert _ext.elf_problem(str(empty)).startswith("not an ELF shared library (0 bytes")


def test_load_refuses_a_truncated_library_in_process(tmp_path, monkeypatch):
    """In the serving process: ExtensionUnavailable (the patch layer hands the call back to SGLang), not SIGBUS. Run
    in a child process so that a regression shows as its exit code instead of killing pytest."""
    bad = _truncated_library(tmp_path)
    code = ("from deepseek_v4_kernel import _ext\n"
            "from deepseek_v4_kernel.errors import ExtensionUnavailable\n"
            "try:\n    _ext.load()\nexcept ExtensionUnavailable as e:\n    print('REFUSED', e)\n"
            "print('has_fp4_moe_decode', _ext.has_fp4_moe_decode(), 'has_hc_prenorm', _ext.has_hc_prenorm())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env=_env(DSV4_KERNEL_LIB=bad))
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert f"REFUSED cannot load {bad}: truncated: the file has" in r.stdout, r.stdout
    assert "rebuild with scripts/build.sh" in r.stdout
    assert "has_fp4_moe_decode False has_hc_prenorm False" in r.stdout


@pytest.mark.parametrize("as_json", [False, True])
def test_doctor_reports_a_truncated_extension(tmp_path, as_json):
    """The issue's repro: a copy of the build directory with its _C.so truncated."""
    build = tmp_path / "dsv4"
    pkg = build / "deepseek_v4_kernel"
    shutil.copytree(os.path.join(ROOT, "deepseek_v4_kernel"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "_C*.so"))
    shutil.copyfile(_truncated_library(tmp_path), pkg / "_C.so")
    env = _env()
    env["PYTHONPATH"] = str(build)
    r = subprocess.run(DOCTOR + (["--json"] if as_json else []), capture_output=True, text=True,
                       cwd=str(tmp_path), timeout=300, env=env)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    if as_json:
        e = json.loads(r.stdout)["extension"]
        assert e["loads"] is False and "truncated: the file has" in e["error"], e
    else:
        assert f"extension: does not load: ExtensionUnavailable: cannot load {pkg / '_C.so'}: truncated" in r.stdout, \
            r.stdout


def test_doctor_on_a_build_only_machine_says_torch_is_missing_not_no_kernel(monkeypatch):
    """The library loads but torch is not installed (a machine that only builds): the GPU check is not made, and the
    doctor says why instead of "NO KERNEL" (which read as a broken build)."""
    from deepseek_v4_kernel import doctor

    monkeypatch.setattr(_ext, "load", lambda: object())
    monkeypatch.setattr(_ext, "built_archs", lambda: ["sm_120a"])
    monkeypatch.setitem(sys.modules, "torch", None)   # import torch -> ImportError
    info = doctor._extension_info()
    assert info["loads"] and info["this_gpu"]["runs"] is None, info
    assert info["this_gpu"]["why"].startswith("not checked: torch not installed"), info
    d = {"deepseek_v4_kernel": "x", "python": "3", "platform": "p", "nvml": {"gpus": [], "error": "none"},
         "torch": {"available": False, "error": "torch not importable"}, "versions": {}, "env": {}, "switches": [],
         "extension": info, "patch": {"active": False, "why": "-", "sglang": None, "targets": []}}
    text = doctor.format_text(d)
    assert "extension on this GPU: not checked: torch not installed" in text and "NO KERNEL" not in text, text


def test_doctor_with_a_built_library_and_a_broken_torch(tmp_path):
    """The same through the command line, with the library scripts/build.sh built (a torch that fails to import)."""
    if not os.path.exists(BUILT):
        pytest.skip(f"no library built at {BUILT} (scripts/build.sh builds it)")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('No module named torch (test)')\n")
    env = _env(DSV4_KERNEL_LIB=BUILT)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), ROOT])
    r = subprocess.run(DOCTOR, capture_output=True, text=True, cwd=str(tmp_path), timeout=300, env=env)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "extension: loads, built for sm_120a" in r.stdout and "NO KERNEL" not in r.stdout, r.stdout
    assert "extension on this GPU: not checked: torch not installed" in r.stdout, r.stdout
