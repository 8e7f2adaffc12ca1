"""scripts/test.sh leaves the user's python3 alone: it makes its own virtual environment on the first run, installs the
test requirements there (again only when requirements-test.txt changes) and runs pytest with it. Checked with
stand-in interpreters that log what they are asked and run no pip or pytest (the script's logic only, in seconds)."""
import os
import stat
import subprocess
import sys

from conftest import ROOT
from deepseek_v4_kernel.patch.targets import TESTED

STAND_IN = """#!/usr/bin/env bash
# {role}: log the call; pip and pytest do nothing; anything else runs the real interpreter
echo "{role} $*" >> {log}
if [ "$1" = -m ] && [ "$2" = venv ]; then
    dir="${{@: -1}}"
    mkdir -p "$dir/bin"
    sed "s/^# user python:/# venv python:/; s/^echo \\"user python /echo \\"venv python /" "$0" > "$dir/bin/python"
    chmod +x "$dir/bin/python"
    exit 0
fi
if [ "$1" = -m ] && {{ [ "$2" = pip ] || [ "$2" = pytest ]; }}; then exit 0; fi
exec {python} "$@"
"""


def _run(tmp_path, log, env_extra=None, args=("-k", "nothing")):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
    env.update(PYTHON=str(tmp_path / "python3"), DSV4_TEST_VENV=str(tmp_path / "venv"),
               DSV4_SGLANG_WHEELS_DIR=str(tmp_path / "sglang"), **(env_extra or {}))
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "test.sh"), *args], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    lines = open(log).read().splitlines()
    open(log, "w").close()
    return lines, r.stdout


def test_test_script_installs_into_its_own_venv_not_the_users_python(tmp_path):
    log = tmp_path / "calls.log"
    log.write_text("")
    user = tmp_path / "python3"
    user.write_text(STAND_IN.format(role="user python", log=log, python=sys.executable))
    user.chmod(user.stat().st_mode | stat.S_IXUSR)
    for v in TESTED:   # the fetch step finds the wheels unpacked already
        os.makedirs(tmp_path / "sglang" / f"sglang-{v}" / "sglang")
    os.makedirs(tmp_path / "sglang" / "flash_mla" / "flash_mla")

    first, out = _run(tmp_path, log)
    assert "creating the test environment" in out, out
    user_calls = [c for c in first if c.startswith("user python")]
    assert user_calls and all(" pip " not in c and " pytest" not in c for c in user_calls), first
    assert any(c.startswith("user python -m venv") for c in user_calls), first
    venv_calls = [c for c in first if c.startswith("venv python")]
    assert "venv python -m pip install -q --disable-pip-version-check -r requirements-test.txt" in venv_calls, first
    assert "venv python -m pytest -ra -q tests -k nothing" in venv_calls, first

    again, out = _run(tmp_path, log)   # reused: no new venv, no install while requirements-test.txt is unchanged
    assert "creating the test environment" not in out and not any(" pip install" in c for c in again), again
    assert "venv python -m pytest -ra -q tests -k nothing" in again, again
    assert not any(c.startswith("user python") for c in again), again
