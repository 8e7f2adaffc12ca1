"""Every environment switch we read goes through the one parser (deepseek_v4_kernel/switches.py): a value it does not
accept is an error that names the variable and the accepted values, the doctor reports it instead of a traceback,
and the start-up line says it."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from deepseek_v4_kernel import switches
from deepseek_v4_kernel.ops import fp4_moe, hc_prenorm
from deepseek_v4_kernel.ops import sparse_decode as sd
from deepseek_v4_kernel.bench import moe_competitors
from deepseek_v4_kernel.ops.fp8_linear import dispatch as fp8_dispatch
from deepseek_v4_kernel.patch import policy
from deepseek_v4_kernel.switches import InvalidSwitch, choice
from sglang_env import run_child

PKG = os.path.join(ROOT, "deepseek_v4_kernel")
# variables we read that hold a path, not a switch value
# paths, and values with their own typed parser that names the variable (DSV4_KERNEL_MEASURE_BUDGET_S: seconds > 0)
PATHS = ("DSV4_KERNEL_LIB", "DSV4_KERNEL_STATS_DIR", "DSV4_KERNEL_MEASURED", "DSV4_SGLANG_SOURCES",
         "DSV4_KERNEL_ENV_SET", "DSV4_KERNEL_CACHE_DIR",
         # numbers, each parsed where it is read with an error naming it (not on/off, not a choice)
         "DSV4_KERNEL_MEASURE_BUDGET_S")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
    env.update(PYTHONPATH=ROOT, **extra)
    return env


def test_choice_names_the_variable_the_accepted_values_and_the_default(monkeypatch):
    monkeypatch.setenv("DSV4_TEST_CHOICE", " Measure ")
    with pytest.raises(InvalidSwitch, match=r"^DSV4_TEST_CHOICE must be one of ours, measured, got ' Measure ' "
                                            r"\(unset: ours\)$"):
        choice("DSV4_TEST_CHOICE", ("ours", "measured"), "ours")
    monkeypatch.setenv("DSV4_TEST_CHOICE", " MEASURED ")
    assert choice("DSV4_TEST_CHOICE", ("ours", "measured"), "ours") == "measured"
    monkeypatch.setenv("DSV4_TEST_CHOICE", "  ")
    assert choice("DSV4_TEST_CHOICE", ("ours", "measured"), "ours") == "ours"


def test_switch_table_holds_the_ops_own_values():
    assert switches.SWITCHES["DSV4_SPARSE_DECODE_IMPL"] == tuple(sd.HEAD_TILE) + ("auto",)
    assert switches.SWITCHES["DSV4_HC_PRENORM_IMPL"] == hc_prenorm.IMPLS
    assert switches.SWITCHES[fp4_moe.IMPL_ENV] == fp4_moe.IMPLS
    assert switches.SWITCHES[hc_prenorm.ATOMIC_ENV] is None


def _sources(ext):
    for d, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(ext):
                yield os.path.join(d, f)


def test_every_switch_the_package_reads_is_in_the_table_and_read_by_the_parser():
    """The doctor checks the table: a switch read elsewhere would escape it. And no switch is read around the parser
    (os.environ.get(...) == "0" took "no" for on; DSV4_SPARSE_DECODE_UNPADDED_HEADS did)."""
    read, loose = set(), []
    for path in _sources(".py"):
        text = open(path).read()
        consts = dict(re.findall(r'^\s*([A-Z_]+_ENV)\s*=\s*"(DSV4_[A-Z0-9_]+)"', text, re.M))
        for m in re.finditer(r'\b(?:env_bool|env_choice|choice|env_flag|env_int)\(\s*(?:"(DSV4_[A-Z0-9_]+)"|([A-Z_]+_ENV)\b)',
                             text):
            read.add(m.group(1) or consts.get(m.group(2), m.group(2)))
        rel = os.path.relpath(path, ROOT)
        for m in re.finditer(r'(?:os\.environ\.get|os\.getenv|os\.environ\[)\(?\s*(?:"(DSV4_[A-Z0-9_]+)"|([A-Z_]+_ENV)\b)',
                             text):
            name = m.group(1) or consts.get(m.group(2), m.group(2))
            if name.startswith("DSV4_") and name not in PATHS and rel != os.path.join("deepseek_v4_kernel",
                                                                                     "switches.py"):
                loose.append(f"{rel}: {name}")
    assert not loose, f"switches read around the parser: {loose}"
    for path in _sources((".cu", ".cuh", ".h")):
        read.update(re.findall(r'getenv\("(DSV4_[A-Z0-9_]+)"\)', open(path).read()))
        read.update(re.findall(r'PdlSwitch\s+\w+\s*\{?\(?"(DSV4_[A-Z0-9_]+)"', open(path).read()))
    assert "DSV4_SPARSE_DECODE_IMPL" in read and "DSV4_FP4_MOE_IMPL" in read and "DSV4_HC_PRENORM_ATOMIC" in read
    missing = sorted(n for n in read - set(switches.SWITCHES) if n not in PATHS)
    assert not missing, f"read but not in switches.SWITCHES (the doctor would not check them): {missing}"


def fp8_backend_read():
    """bench/fp8_competitors reads its switch where it sets SGLang's backend for a process with no server."""
    import types

    from deepseek_v4_kernel.bench import fp8_competitors as fc

    fu = types.SimpleNamespace(FP8_GEMM_RUNNER_BACKEND=None, Fp8GemmRunnerBackend=str,
                               dispatch_w8a8_block_fp8_linear=lambda: None)
    real = fc.importlib.import_module
    fc.importlib.import_module = lambda name: fu if name == fc.FP8_UTILS else real(name)
    try:
        return fc._resolve_in_process()
    finally:
        fc.importlib.import_module = real


@pytest.mark.parametrize("name", sorted(n for n, a in switches.SWITCHES.items()
                                        if a is not None and not isinstance(a, switches.IntRange)))
def test_every_choice_switch_refuses_an_unknown_value_where_the_op_reads_it(name, monkeypatch):
    """Unknown values are errors naming the variable and every accepted value (an InvalidSwitch, i.e. an
    UnsupportedCase: inside SGLang the call goes back to SGLang's own code), read where the op reads it."""
    accepted = switches.SWITCHES[name]
    said = f"{name} must be one of {', '.join(accepted)}, got 'fastest'"
    if name == "DSV4_SPARSE_DECODE_IMPL":   # read once, at import
        r = subprocess.run([sys.executable, "-c", "import deepseek_v4_kernel.ops.sparse_decode"], capture_output=True,
                           text=True, cwd=ROOT, timeout=120, env=_env(**{name: "fastest"}))
        assert r.returncode != 0 and f"InvalidSwitch: {said}" in r.stderr, r.stderr
        return
    monkeypatch.setenv(name, "fastest")
    x, fn = torch.zeros(4, 256, dtype=torch.bfloat16), torch.zeros(24, 256)
    read = {"DSV4_HC_PRENORM_IMPL": lambda: hc_prenorm.dispatch.pick_impl(x, fn, 1),
            "DSV4_HC_PRENORM_PRECISION": hc_prenorm.dispatch._precision,
            "DSV4_FP4_MOE_IMPL": lambda: fp4_moe.dispatch.default_impl("decode"),
            "DSV4_KERNEL_PREFER": policy.prefer_mode,
            "DSV4_BENCH_ALLOW_SGLANG_JIT": lambda: moe_competitors._allow_jit(None),
            "DSV4_FP8_LINEAR_KERNEL": fp8_dispatch.kernel_choice,
            "DSV4_FP8_LINEAR_DECODE": fp8_dispatch.decode_choice,
            "DSV4_BENCH_FP8_GEMM_BACKEND": fp8_backend_read}[name]
    with pytest.raises(InvalidSwitch, match=re.escape(said)):
        read()


@pytest.mark.parametrize("name", sorted(n for n, a in switches.SWITCHES.items() if isinstance(a, switches.IntRange)))
def test_every_int_switch_refuses_a_value_outside_its_range(name, monkeypatch):
    """Integer switches (env_int): a non-integer or a value outside the range names the variable and the range."""
    lo, hi = switches.SWITCHES[name]
    for bad in ("fastest", str(hi + 1), str(lo - 1)):
        monkeypatch.setenv(name, bad)
        said = f"{name} must be an integer in [{lo}, {hi}], got {bad!r}"
        with pytest.raises(InvalidSwitch, match=re.escape(said)):
            switches.env_int(name, lo, hi)
        assert any(p.startswith(f"{name} must be an integer") for p in switches.problems())
    monkeypatch.setenv(name, f" {hi} ")
    assert switches.env_int(name, lo, hi) == hi


@pytest.mark.parametrize("name", ["DSV4_KERNEL_FORCE", "DSV4_HC_PRENORM_ATOMIC", "DSV4_FP4_MOE_IMPL"])
def test_doctor_reports_a_bad_switch_instead_of_a_traceback(name):
    """The issue's repro: DSV4_KERNEL_FORCE=maybe ended the doctor in a traceback; now a report, text and JSON, exit 1."""
    for as_json in (False, True):
        r = subprocess.run([sys.executable, "-m", "deepseek_v4_kernel", "doctor", "--no-selftest"]
                           + (["--json"] if as_json else []), capture_output=True, text=True, cwd=ROOT,
                           timeout=300, env=_env(**{name: "maybe"}))
        assert r.returncode == 1 and "Traceback" not in r.stderr, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
        if as_json:
            d = json.loads(r.stdout)
            assert any(p.startswith(f"{name} must be one of ") and p.endswith("got 'maybe'") for p in d["switches"])
            assert d["env"][name] == "maybe"
        else:
            assert f"switch error: {name} must be one of " in r.stdout, r.stdout
            assert "patch layer:" in r.stdout, r.stdout   # the rest of the report is there


def test_start_up_says_a_bad_switch(tmp_path):
    """Serving: a bad global switch installs nothing (one line); a bad op switch is named in the start-up line."""
    sgl = tmp_path / "sgl"
    (sgl / "sglang").mkdir(parents=True)
    (sgl / "sglang" / "__init__.py").write_text("")
    (sgl / "sglang-0.5.23.dist-info").mkdir()
    (sgl / "sglang-0.5.23.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    r = run_child("import sglang", path=[str(sgl)], env={"DSV4_KERNEL_FORCE": "maybe"})
    assert r.returncode == 0, r.stderr
    assert "[deepseek_v4_kernel] not installed: InvalidSwitch: DSV4_KERNEL_FORCE must be one of 1/true/yes/on (on) " \
           "or 0/false/no/off (off), got 'maybe'" in r.stderr, r.stderr
    r = run_child("import sglang", path=[str(sgl)], env={"DSV4_KERNEL_FORCE": "1", "DSV4_HC_PRENORM_ATOMIC": "maybe"})
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("[deepseek_v4_kernel ")]
    assert len(line) == 1 and "switch error: DSV4_HC_PRENORM_ATOMIC must be one of" in line[0], r.stderr
