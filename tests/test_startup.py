"""Start-up survives every fault, in a fresh interpreter started the way users start SGLang
(our directory on PYTHONPATH, so our sitecustomize.py runs first)."""

import os
import textwrap

from sglang_env import REPORT_JSON, parse_report, run_child, sglang_dir, stand_in_deep_gemm

BANNER = "[deepseek_v4_kernel"


def _banner_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith(BANNER)]


def test_no_sglang_no_gpu_survives_and_imports_nothing_heavy():
    r = run_child("import sys; print('HEAVY=' + ','.join(m for m in ('torch', 'sglang', 'triton') if m in sys.modules))")
    assert r.returncode == 0, r.stderr
    assert "HEAVY=\n" in r.stdout or r.stdout.strip().endswith("HEAVY=")
    lines = _banner_lines(r.stderr)
    assert len(lines) == 1 and "inactive" in lines[0], r.stderr


def test_forced_without_sglang_says_so():
    r = run_child(REPORT_JSON, env={"DSV4_KERNEL_FORCE": "1"})
    assert r.returncode == 0, r.stderr
    lines = _banner_lines(r.stderr)
    assert len(lines) == 1 and "active" in lines[0] and "SGLang not installed" in lines[0]
    assert all(x["status"] == "inactive" and "not installed" in x["reason"] for x in parse_report(r.stdout))


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
    """, path=[src], env={"DSV4_KERNEL_DISABLE": "1", "DSV4_KERNEL_FORCE": "1", "DSV4_KERNEL_PREFER": "ours"})
    assert r.returncode == 0, r.stderr
    assert "WRAPPED=False" in r.stdout and "LOADED=False" in r.stdout
    assert not _banner_lines(r.stderr)


def test_previous_sitecustomize_still_runs(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    marker = tmp_path / "marker"
    (other / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    r = run_child("print('alive')", path=[str(other)])
    assert r.returncode == 0, r.stderr
    assert marker.read_text() == "ran"
    assert len(_banner_lines(r.stderr)) == 1


def test_failing_previous_sitecustomize_is_reported_not_fatal(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise RuntimeError('image hook broke')\n")
    r = run_child("print('alive')", path=[str(other)])
    assert r.returncode == 0 and "alive" in r.stdout
    assert "image hook broke" in r.stderr


def test_broken_package_does_not_break_startup(tmp_path):
    """A damaged install (our package unimportable) still lets the program run."""
    fake = tmp_path / "deepseek_v4_kernel"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SyntaxError('damaged install')\n")
    site = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sitecustomize.py")
    shim = tmp_path / "sitecustomize.py"
    shim.write_text(open(site).read())
    r = run_child("print('alive')", path=[str(tmp_path)], with_root=False)
    assert r.returncode == 0 and "alive" in r.stdout
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
    assert open_row["status"] in ("patched", "skipped", "left"), open_row
    if open_row["status"] == "patched":
        assert "newer than surveyed" in open_row["reason"]


def test_patch_applies_in_spawned_child():
    src = sglang_dir("0.5.23")
    code = textwrap.dedent("""
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
    """)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_spawn_child_tmp.py")
    with open(script, "w") as f:
        f.write(code)
    try:
        r = run_child(f"import runpy; runpy.run_path({script!r}, run_name='__main__')", path=[src],
                      env={"DSV4_KERNEL_FORCE": "1", "DSV4_KERNEL_PREFER": "ours"})
    finally:
        os.remove(script)
    assert r.returncode == 0, r.stderr
    assert "CHILD_PATCHED=True" in r.stdout, r.stdout + r.stderr
    # one line per interpreter: the parent, the child, and multiprocessing's resource tracker
    assert 2 <= len(_banner_lines(r.stderr)) <= 3, r.stderr


def test_hc_prenorm_gate_set_again_in_a_spawned_worker(tmp_path):
    """SGLang 0.5.17 as it launches on SM120: our sitecustomize sets SGLANG_OPT_DEEPGEMM_HC_PRENORM at start-up,
    the launcher's model adjustments then set it False in its own process (EnvBool.set, as server_args.py:5313
    does), and the scheduler it spawns runs our sitecustomize first, which sets the flag again; SGLang's own
    reader then says True there. A deep_gemm stand-in is importable (0.5.17's fused step would import one)."""
    stand_in_deep_gemm(tmp_path)
    code = textwrap.dedent("""
        import multiprocessing as mp, os

        def worker(q):
            from sglang.srt.environ import envs
            q.put((os.environ.get('SGLANG_OPT_DEEPGEMM_HC_PRENORM'), envs.SGLANG_OPT_DEEPGEMM_HC_PRENORM.get()))

        if __name__ == '__main__':
            print('LAUNCHER_START=%s' % os.environ.get('SGLANG_OPT_DEEPGEMM_HC_PRENORM'))
            from sglang.srt.environ import envs
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
