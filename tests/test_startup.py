"""Start-up survives every fault, costs a process that never imports SGLang nothing, and installs the patch layer
when SGLang is first imported, in a fresh interpreter started the way users start SGLang (our directory on
PYTHONPATH, so our sitecustomize.py runs first)."""

import ast
import importlib.util
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

from deepseek_v4_kernel.patch import targets
from sglang_env import REPORT_JSON, ROOT, parse_report, run_child, sglang_dir, stand_in_deep_gemm

BANNER = "[deepseek_v4_kernel"
HOOK = os.path.join(ROOT, "sitecustomize.py")
STARTED = "_deepseek_v4_kernel_startup"   # sitecustomize.py's sys.modules key: the copy that ran
# what the start-up path must not import (each costs milliseconds in every Python process), nor load NVML
HEAVY_AT_START = ("logging", "inspect", "dataclasses", "importlib.metadata", "ctypes", "deepseek_v4_kernel",
                  "torch", "sglang", "triton")
WHICH_COPY_RAN = f"""
import sys
m = sys.modules.get({STARTED!r})
print('FIRST=' + (m.__file__ if m is not None else 'none'))
print('WATCHERS=%d' % sum(getattr(f, 'dsv4_first_import_hook', False) is True for f in sys.meta_path))
"""


def _banner_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith(BANNER)]


def _run(code, pythonpath, cwd=None, env=None):
    """A fresh interpreter with exactly this PYTHONPATH string (run_child builds its own) and working directory."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
    e.update({"PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1", **(env or {})})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          timeout=240, cwd=cwd or tempfile.gettempdir())


def _copy_of_the_hook(directory):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(open(HOOK).read())
    return str(directory)


def _image_hook(directory, log):
    """An image's own sitecustomize.py: appends a line to ``log`` each time it runs."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(f"open({str(log)!r}, 'a').write('image ran\\n')\n")
    return str(directory)


def _stand_in_sglang(directory, version="0.5.13", body=""):
    """A package ``sglang`` of ``version`` (metadata included) whose __init__ runs ``body``."""
    (directory / "sglang").mkdir(parents=True)
    (directory / "sglang" / "__init__.py").write_text(textwrap.dedent(body))
    dist = directory / f"sglang-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return str(directory)


def _failing_nvml(directory):
    """A libnvidia-ml.so.1 that does not load, found first through LD_LIBRARY_PATH (also where a GPU is)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "libnvidia-ml.so.1").write_bytes(b"")
    return {"LD_LIBRARY_PATH": str(directory)}


# ----------------------------------------------------------------------------- several copies of the hook
def test_two_copies_and_an_image_hook_each_run_once(tmp_path):
    """Ours first, another copy of it next (an older build, a checkout), the image's hook last: our copy runs once,
    skips the other copy and runs the image's hook, once (no copy runs another into a RecursionError)."""
    log = tmp_path / "image.log"
    path = os.pathsep.join([ROOT, _copy_of_the_hook(tmp_path / "copy"), _image_hook(tmp_path / "image", log)])
    r = _run(WHICH_COPY_RAN, path)
    assert r.returncode == 0, r.stderr
    assert "Error" not in r.stderr and "failed" not in r.stderr, r.stderr
    assert f"FIRST={HOOK}" in r.stdout and "WATCHERS=1" in r.stdout, r.stdout
    assert log.read_text() == "image ran\n"


@pytest.mark.parametrize("pythonpath", ["{dsv4}:", "{dsv4}::{image}"])
def test_empty_pythonpath_entry_in_a_checkout(tmp_path, pythonpath):
    """`PYTHONPATH=/dsv4:$PYTHONPATH` with the variable unset leaves an empty entry, the current directory: run from a
    checkout of this repository, that is a second copy of the hook."""
    log = tmp_path / "image.log"
    dsv4 = _copy_of_the_hook(tmp_path / "dsv4")
    path = pythonpath.format(dsv4=dsv4, image=_image_hook(tmp_path / "image", log))
    r = _run(WHICH_COPY_RAN, path, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "Error" not in r.stderr and "failed" not in r.stderr, r.stderr
    assert f"FIRST={os.path.join(dsv4, 'sitecustomize.py')}" in r.stdout and "WATCHERS=1" in r.stdout, r.stdout
    assert log.read_text() == "image ran\n" if "{image}" in pythonpath else not log.exists()


def test_image_hook_first_on_the_path_means_ours_never_runs(tmp_path):
    """Python imports only the first sitecustomize.py on sys.path: an image's own before ours shadows ours (README,
    Troubleshooting: put /dsv4 first)."""
    log = tmp_path / "image.log"
    r = _run(WHICH_COPY_RAN, os.pathsep.join([_image_hook(tmp_path / "image", log), ROOT]))
    assert r.returncode == 0, r.stderr
    assert "FIRST=none" in r.stdout and "WATCHERS=0" in r.stdout, r.stdout
    assert log.read_text() == "image ran\n"


def test_previous_sitecustomize_still_runs(tmp_path):
    log = tmp_path / "image.log"
    r = run_child("print('alive')", path=[_image_hook(tmp_path / "other", log)])
    assert r.returncode == 0, r.stderr
    assert log.read_text() == "image ran\n"


def test_failing_previous_sitecustomize_is_reported_not_fatal(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('image hook broke')\n")
    r = run_child("print('alive')", path=[str(other)])
    assert r.returncode == 0 and "alive" in r.stdout
    assert "image hook broke" in r.stderr


# ----------------------------------------------------------------------------- cost of start-up
def test_start_up_imports_nothing_the_interpreter_did_not():
    """A process that never imports SGLang gets one watcher on sys.meta_path and nothing else: no module beyond the
    interpreter's own (against a child without our directory), no NVML library mapped."""
    code = """
        import sys
        mods = sorted(sys.modules)
        maps = open('/proc/self/maps').read() if sys.platform.startswith('linux') else ''
        print('MODS=' + ','.join(mods))
        print('NVML=%s' % ('libnvidia-ml' in maps))
    """
    mods = lambda r: set(next(l for l in r.stdout.splitlines() if l.startswith("MODS="))[5:].split(","))  # noqa: E731
    base = run_child(code, with_root=False)
    ours = run_child(code, env={"DSV4_KERNEL_FORCE": "1"})
    assert base.returncode == 0 and ours.returncode == 0, base.stderr + ours.stderr
    # (where the interpreter has its own sitecustomize, e.g. the GPU machine's image, ours runs it after itself under
    # the name _dsv4_chained_sitecustomize: the same module the baseline imported as sitecustomize)
    chained = {"_dsv4_chained_sitecustomize"} if "sitecustomize" in mods(base) else set()
    assert mods(ours) - mods(base) <= {"sitecustomize", STARTED} | chained, sorted(mods(ours) - mods(base))
    assert not [m for m in mods(ours) - mods(base) if m.split(".")[0] in HEAVY_AT_START or m in HEAVY_AT_START]
    assert "NVML=False" in ours.stdout
    assert not _banner_lines(ours.stderr), ours.stderr   # nothing installed, nothing to say


def test_patch_layer_installs_when_sglang_is_first_imported_before_its_code_runs(tmp_path):
    """The device probe, the version lookup and the environment rows happen at the first `import sglang`, before
    SGLang's own __init__ runs (SGLang reads its variables from then on: 0.5.20+ import sglang.srt.environ first
    thing), and the start-up line comes after that install, counting targets as they are."""
    body = """
        import os, sys
        policy = sys.modules.get('deepseek_v4_kernel.patch.policy')
        print('PROBED=%s' % (policy is not None and policy._DEVICE is not None))
        print('SEEN=%r' % ((os.environ.get('SGLANG_FP8_PAGED_MQA_LOGITS_TORCH'),
                            os.environ.get('SGLANG_OPT_DEEPGEMM_HC_PRENORM')),))
    """
    code = "import sys\nprint('BEFORE=%s' % ('deepseek_v4_kernel.patch' in sys.modules))\nimport sglang\n" + REPORT_JSON
    r = run_child(code, path=[_stand_in_sglang(tmp_path, "0.5.13", body)], env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    assert "BEFORE=False" in r.stdout and "PROBED=True" in r.stdout, r.stdout
    assert "SEEN=('1', '1')" in r.stdout, r.stdout
    rows = parse_report(r.stdout)
    # (left: the FP8 wo_a flag, which 0.5.13's wo_a path could not take ours)
    n = {s: sum(x["status"] == s for x in rows) for s in ("patched", "pending", "left", "inactive")}
    assert len(rows) == len(targets.TARGETS) and sum(n.values()) == len(rows) and n["patched"] >= 2, rows
    lines = _banner_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert (f"{len(rows)} targets: {n['patched']} patched, {n['pending']} waiting for their module, "
            + (f"{n['left']} left to SGLang, " if n["left"] else "")
            + f"{n['inactive']} not for this version") in lines[0], lines[0]


@pytest.mark.parametrize("version", targets.TESTED)
def test_real_sglang_import_installs_the_layer(version):
    """Each tested wheel's own `import sglang` (its __init__ imports much of SGLang) installs the layer first: one
    line naming the version, the environment rows set as the table says for it."""
    code = "import os, sglang\nprint('ENV=%r' % ((os.environ.get('SGLANG_FP8_PAGED_MQA_LOGITS_TORCH'), " \
           "os.environ.get('SGLANG_OPT_DEEPGEMM_HC_PRENORM')),))\n" + REPORT_JSON
    r = run_child(code, path=[sglang_dir(version)], env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    lines = _banner_lines(r.stderr)
    assert len(lines) == 1 and f"SGLang {version};" in lines[0], r.stderr
    env = {x["target"]: x["status"] for x in parse_report(r.stdout) if x["kind"] == "env"}
    want = tuple("1" if env[name] == "patched" else None
                 for name in ("SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "SGLANG_OPT_DEEPGEMM_HC_PRENORM"))
    assert f"ENV={want!r}" in r.stdout, (r.stdout, env)
    assert env["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == ("patched" if version == "0.5.12" else "inactive")
    # 0.5.17-0.5.20 import deep_gemm behind the hc_prenorm flag: set only where one is importable (none stood in here)
    has_deep_gemm = importlib.util.find_spec("deep_gemm") is not None
    assert env["SGLANG_OPT_DEEPGEMM_HC_PRENORM"] == {"0.5.12": "inactive", "0.5.23": "patched"}.get(
        version, "patched" if has_deep_gemm else "left"), env


def test_watched_packages_are_the_targets_packages():
    """sitecustomize.py names the top-level packages the targets live in (it may not import the table: too slow)."""
    tree = ast.parse(open(HOOK).read())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "WATCHED_PACKAGES")
    watched = set(ast.literal_eval(node.value.args[0]))
    tops = {name.split(".")[0] for t in targets.TARGETS if t.kind != "env" for name in (t.module, *t.importers)}
    assert watched == tops


# ----------------------------------------------------------------------------- the start-up line
def test_no_line_and_nothing_heavy_without_sglang():
    heavy = "import sys\nprint('HEAVY=' + ','.join(m for m in ('torch', 'sglang', 'triton') if m in sys.modules))"
    r = run_child(heavy, env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "HEAVY="
    assert not _banner_lines(r.stderr), r.stderr


def test_line_says_the_nvml_error_and_quiet_silences_it(tmp_path):
    """Inactive where NVML fails: the line names NVML's error (here a library that does not load)."""
    nvml = _failing_nvml(tmp_path / "nvml")
    path = [_stand_in_sglang(tmp_path / "sgl", "0.5.23")]
    r = run_child("import sglang", path=path, env=nvml)
    assert r.returncode == 0, r.stderr
    lines = _banner_lines(r.stderr)
    assert len(lines) == 1 and "inactive: no SM12x device (no GPU visible to NVML: libnvidia-ml.so.1 not " \
                                "loadable: " in lines[0] and "SGLang 0.5.23; nothing patched" in lines[0], r.stderr
    r = run_child("import sglang", path=path, env={**nvml, "DSV4_KERNEL_QUIET": "1"})
    assert r.returncode == 0 and not _banner_lines(r.stderr), r.stderr


def test_forced_without_sglang_says_so():
    """The doctor's way: install() called directly, in a process without SGLang."""
    r = run_child("from deepseek_v4_kernel.patch import install\ninstall()\n" + REPORT_JSON,
                  env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    lines = _banner_lines(r.stderr)
    assert len(lines) == 1 and "active" in lines[0] and "SGLang not installed" in lines[0]
    assert all(x["status"] == "inactive" and "not installed" in x["reason"] for x in parse_report(r.stdout))


# ----------------------------------------------------------------------------- faults
def test_broken_torch_does_not_break_startup(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('broken torch for the test')\n")
    r = run_child("print('alive')", path=[str(tmp_path)], env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0 and "alive" in r.stdout, r.stderr
    d = run_child("from deepseek_v4_kernel.doctor import main; raise SystemExit(main(['--no-selftest']))",
                  path=[str(tmp_path)])
    assert d.returncode == 0, d.stderr
    assert "torch: torch not importable" in d.stdout


def test_disable_leaves_everything_untouched():
    src = sglang_dir("0.5.23")
    r = run_child("""
        import sys
        import sglang.kernels.ops.attention.flash_mla_sm120 as m
        print('WRAPPED=%s' % hasattr(m.flash_mla_with_kvcache_sm120, '__dsv4_original__'))
        print('LOADED=%s' % ('deepseek_v4_kernel.patch' in sys.modules))
        print('WATCHERS=%d' % sum(getattr(f, 'dsv4_first_import_hook', False) is True for f in sys.meta_path))
    """, path=[src], env={"DSV4_KERNEL_DISABLE": "1", "DSV4_KERNEL_FORCE": "1", "DSV4_KERNEL_PREFER": "ours"})
    assert r.returncode == 0, r.stderr
    assert "WRAPPED=False" in r.stdout and "LOADED=False" in r.stdout and "WATCHERS=0" in r.stdout
    assert not _banner_lines(r.stderr)


def test_broken_package_does_not_break_startup(tmp_path):
    """A damaged install (our package unimportable) still lets the program, and its SGLang import, run."""
    fake = tmp_path / "deepseek_v4_kernel"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SyntaxError('damaged install')\n")
    (tmp_path / "sitecustomize.py").write_text(open(HOOK).read())
    _stand_in_sglang(tmp_path, body="print('sglang imported')\n")
    r = run_child("print('alive')\nimport sglang", path=[str(tmp_path)], with_root=False)
    assert r.returncode == 0 and "alive" in r.stdout and "sglang imported" in r.stdout, r.stderr
    lines = _banner_lines(r.stderr)
    assert len(lines) == 1 and "not installed" in lines[0] and "damaged install" in lines[0]


def test_unknown_newer_sglang_version(tmp_path):
    """A version newer than surveyed: open-ended targets are tried (and checked), closed ones not."""
    src = sglang_dir("0.5.23")
    (tmp_path / "sglang").symlink_to(os.path.join(src, "sglang"))
    dist = tmp_path / "sglang-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
    r = run_child("import sglang.kernels.ops.attention.flash_mla_sm120\n" + REPORT_JSON, path=[str(tmp_path)],
                  env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    assert "SGLang 9.9.9" in r.stderr
    rows = {x["target"]: x for x in parse_report(r.stdout)}
    assert rows["flash_mla.flash_mla_interface.flash_mla_with_kvcache"]["status"] == "inactive"
    open_row = rows["sglang.kernels.ops.attention.flash_mla_sm120.flash_mla_with_kvcache_sm120"]
    # the row's checks pass on 0.5.23's source, so the only thing left to decide is its condition: SGLang's default
    # backend is FlashInfer's, left alone where its native SM120 module is installed, replaced (and said to be past
    # the surveyed versions) where it is not
    from deepseek_v4_kernel.patch.targets import _flashinfer_has_sm120_sparse_mla
    if _flashinfer_has_sm120_sparse_mla():
        assert open_row["status"] == "left" and "FlashInfer's native SM120" in open_row["reason"], open_row
    else:
        assert open_row["status"] == "patched" and "newer than surveyed" in open_row["reason"], open_row


# ----------------------------------------------------------------------------- worker processes
def test_patch_applies_in_spawned_child(tmp_path):
    script = tmp_path / "spawn_child.py"
    script.write_text(textwrap.dedent("""
        import multiprocessing as mp

        def child(q):
            import sglang.kernels.ops.attention.flash_mla_sm120 as m
            q.put(hasattr(m.flash_mla_with_kvcache_sm120, '__dsv4_original__'))

        if __name__ == '__main__':
            ctx = mp.get_context('spawn')
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start()
            print('CHILD_PATCHED=%s' % q.get(timeout=180))
            p.join()
    """))
    r = run_child(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", path=[sglang_dir("0.5.23")],
                  env={"DSV4_KERNEL_FORCE": "1", "DSV4_KERNEL_PREFER": "ours"})
    assert r.returncode == 0, r.stderr
    assert "CHILD_PATCHED=True" in r.stdout, r.stdout + r.stderr
    # one line per interpreter that imports SGLang: the child (not the parent, nor multiprocessing's resource tracker)
    assert len(_banner_lines(r.stderr)) == 1, r.stderr


def test_hc_prenorm_gate_set_again_in_a_spawned_worker(tmp_path):
    """SGLang 0.5.17 as it launches on SM120: the launcher's first `import sglang` installs the layer, which sets
    SGLANG_OPT_DEEPGEMM_HC_PRENORM; the launcher's model adjustments then set it False in its own process
    (EnvBool.set, as server_args.py:5313 does), and the scheduler it spawns installs the layer at its own first
    `import sglang` (unpickling its target), before any SGLang code, which sets the flag again; SGLang's own
    reader then says True there. A deep_gemm stand-in is importable (0.5.17's fused step would import one)."""
    stand_in_deep_gemm(tmp_path)
    code = textwrap.dedent("""
        import multiprocessing as mp, os

        def worker(q):
            from sglang.srt.environ import envs
            q.put((os.environ.get('SGLANG_OPT_DEEPGEMM_HC_PRENORM'), envs.SGLANG_OPT_DEEPGEMM_HC_PRENORM.get()))

        if __name__ == '__main__':
            from sglang.srt.environ import envs   # the launcher: python -m sglang.launch_server imports sglang first
            print('LAUNCHER_START=%s' % os.environ.get('SGLANG_OPT_DEEPGEMM_HC_PRENORM'))
            envs.SGLANG_OPT_DEEPGEMM_HC_PRENORM.set(False)   # SGLang's SM120 adjustment, in the launcher
            ctx = mp.get_context('spawn')
            q = ctx.Queue()
            p = ctx.Process(target=worker, args=(q,))
            p.start()
            print('WORKER=%r' % (q.get(timeout=180),))
            p.join()
    """)
    script = tmp_path / "launch.py"
    script.write_text(code)
    for user, want in ((None, "('1', True)"), ("0", "('False', False)")):
        env = {"DSV4_KERNEL_FORCE": "1", **({"SGLANG_OPT_DEEPGEMM_HC_PRENORM": user} if user else {})}
        r = run_child(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
                      path=[sglang_dir("0.5.17"), str(tmp_path)], env=env)
        assert r.returncode == 0, r.stderr
        assert f"LAUNCHER_START={'1' if user is None else user}" in r.stdout, r.stdout + r.stderr
        assert f"WORKER={want}" in r.stdout, (user, r.stdout + r.stderr)


def test_broken_extension_is_reported_and_start_up_survives(tmp_path):
    bad = tmp_path / "_C.so"
    bad.write_bytes(b"not an ELF file")
    r = run_child("from deepseek_v4_kernel.doctor import main; raise SystemExit(main(['--no-selftest']))",
                  env={"DSV4_KERNEL_LIB": str(bad), "DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    assert "extension: does not load: ExtensionUnavailable: cannot load" in r.stdout


def test_watched_package_imported_before_the_hook_installs_at_start(tmp_path):
    """A .pth file runs before sitecustomize: where it imported a watched package the layer installs right away
    (here deep_gemm, imported by a .pth of the user site directory), and patches it."""
    import site
    code = ("import sys, deep_gemm\nprint('BEFORE_HOOK=%s' % getattr(sys, 'dsv4_test_before_hook', None))\n"
            "print('WRAPPED=%s' % hasattr(deep_gemm.tf32_hc_prenorm_gemm, '__dsv4_original__'))")
    pth = "import deep_gemm, sys; sys.dsv4_test_before_hook = 'sitecustomize' not in sys.modules\n"
    sgl = _stand_in_sglang(tmp_path / "sgl", "0.5.23")
    if site.ENABLE_USER_SITE:   # the user site directory's .pth files
        user_base = tmp_path / "userbase"
        site_dir = subprocess.run([sys.executable, "-c", "import site; print(site.getusersitepackages())"],
                                  env={**os.environ, "PYTHONUSERBASE": str(user_base)}, capture_output=True,
                                  text=True).stdout.strip()
        os.makedirs(site_dir)
        stand_in_deep_gemm(site_dir)
        with open(os.path.join(site_dir, "early.pth"), "w") as f:   # an "import" line of a .pth file is executed
            f.write(pth)
        r = run_child(code, path=[sgl], env={"DSV4_KERNEL_FORCE": "1", "PYTHONUSERBASE": str(user_base)})
    else:   # a virtual environment (scripts/test.sh's, the GPU machine's) reads no user site: a venv's own .pth
        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        site_dir = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        stand_in_deep_gemm(site_dir)
        with open(os.path.join(site_dir, "early.pth"), "w") as f:
            f.write(pth)
        import sysconfig

        with open(os.path.join(site_dir, "a-test-environment.pth"), "w") as f:   # this environment's torch & co
            f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
        env.update(PYTHONPATH=os.pathsep.join([ROOT, sgl]), PYTHONUNBUFFERED="1", DSV4_KERNEL_FORCE="1")
        r = subprocess.run([py, "-c", code], capture_output=True, text=True, env=env, timeout=240,
                           cwd=tempfile.gettempdir())
    assert r.returncode == 0, r.stderr
    if "BEFORE_HOOK=None" in r.stdout:
        pytest.skip("the user site directory is off here (PYTHONNOUSERSITE, a venv, another user)")
    assert "BEFORE_HOOK=True" in r.stdout and "WRAPPED=True" in r.stdout, r.stdout + r.stderr
    assert len(_banner_lines(r.stderr)) == 1, r.stderr


def test_two_threads_importing_watched_packages_install_once(tmp_path):
    code = """
        import threading
        threads = [threading.Thread(target=__import__, args=(name,)) for name in ('sglang', 'deep_gemm')]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        import deep_gemm
        print('WRAPPED=%s' % hasattr(deep_gemm.tf32_hc_prenorm_gemm, '__dsv4_original__'))
    """
    slow_sglang = _stand_in_sglang(tmp_path / "sgl", "0.5.23", "import time\ntime.sleep(0.2)\n")
    path = [slow_sglang, stand_in_deep_gemm(tmp_path)]
    r = run_child(code, path=path, env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    assert "WRAPPED=True" in r.stdout, r.stdout + r.stderr
    assert len(_banner_lines(r.stderr)) == 1, r.stderr


@pytest.mark.parametrize("how", ["-c", "-m"])
def test_the_package_beside_the_hook_wins_over_a_checkout_in_the_current_directory(tmp_path, how):
    """Run from a checkout of this repository (its deepseek_v4_kernel has no compiled library), a mounted build
    directory's package is the one imported, also by `python -m deepseek_v4_kernel` (the README's doctor command),
    which puts the current directory first on sys.path."""
    import shutil
    build = tmp_path / "dsv4"
    _copy_of_the_hook(build)
    shutil.copytree(os.path.join(ROOT, "deepseek_v4_kernel"), build / "deepseek_v4_kernel",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (build / "deepseek_v4_kernel" / "__main__.py").write_text("import deepseek_v4_kernel\nprint('PKG=' + "
                                                             "deepseek_v4_kernel.__file__)\n")
    e = {k: v for k, v in os.environ.items() if not k.startswith("DSV4_")}
    e.update({"PYTHONPATH": str(build), "PYTHONUNBUFFERED": "1"})
    cmd = ([sys.executable, "-c", "import deepseek_v4_kernel; print('PKG=' + deepseek_v4_kernel.__file__)"]
           if how == "-c" else [sys.executable, "-m", "deepseek_v4_kernel"])
    r = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    pkg = next(l for l in r.stdout.splitlines() if l.startswith("PKG="))[4:]
    assert pkg == str(build / "deepseek_v4_kernel" / "__init__.py"), pkg
