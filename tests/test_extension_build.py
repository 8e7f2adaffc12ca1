"""CPU-only: compile the extension's CUDA sources (sparse decode, fp4_moe decode, hc_prenorm, fp8_linear) for sm_120a with
nvcc --resource-usage and check shared memory (<= 101376 B per block on SM120), no register spills,
and report registers."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMEM_LIMIT = 101376


def _nvcc():
    n = os.environ.get("NVCC") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
    return n if os.path.exists(n) or shutil.which(n) else None


def _named_constants(*files):
    """The `constexpr int` constants of csrc/ headers, evaluated in order (sizes in bytes / elements)."""
    env = {}
    for f in files:
        src = open(os.path.join(ROOT, "csrc", f)).read()
        for name, expr in re.findall(r"constexpr int (\w+) =\s*([^;]+);", src):
            try:
                env[name] = eval(expr.split("//")[0].strip(), {}, dict(env))
            except (NameError, SyntaxError):  # uses a template parameter or a macro: not a size we need
                pass
    return env


def _kernel_smem_constant():
    """kSmemBytes from kernel.cuh, evaluated from its named constants (dynamic smem per block)."""
    env = _named_constants("sparse_decode/kernel.cuh", "sparse_decode/kernel_mma.cuh",
                           "sparse_decode/kernel_mma64.cuh", "sparse_decode/kernel_ws.cuh")
    return {"sparse_decode_kernel": env["kSmemBytes"], "sparse_decode_mma_kernel": env["kMmaSmemBytes"],
            "sparse_decode_mma64_kernel": env["kM64SmemBytes"], "sparse_decode_ws_kernel": env["kWsSmemBytes"]}


def _compile_sm120a(tmp_path, unit, flags=()):
    """{kernel name: (registers, static smem)} of one translation unit built for sm_120a (extra nvcc
    `flags`, e.g. -D switches); asserts no spills and <= 255 registers for every kernel."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC)")
    cmd = [nvcc, "--resource-usage", "-O3", "-std=c++17", "-gencode", "arch=compute_120a,code=sm_120a",
           *flags, "-I", os.path.join(ROOT, "csrc"), "-c", os.path.join(ROOT, "csrc", unit),
           "-o", str(tmp_path / "unit.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    log = r.stdout + r.stderr
    blocks = re.split(r"Compiling entry function '", log)[1:]
    assert blocks, log
    seen = {}
    for blk in blocks:
        name = blk.split("'")[0]
        assert "for 'sm_120a'" in blk.split("\n")[0], blk
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", blk)
        assert spill and spill.group(1) == "0" and spill.group(2) == "0", f"{name}: spills\n{blk}"
        regs = re.search(r"Used (\d+) registers", blk)
        assert regs, blk
        smem = re.search(r"(\d+) bytes smem", blk)
        seen[name] = (int(regs.group(1)), int(smem.group(1)) if smem else 0)
        assert int(regs.group(1)) <= 255
    return seen


def test_sparse_decode_resources_sm120a(tmp_path):
    seen = _compile_sm120a(tmp_path, "sparse_decode/sparse_decode.cu")
    dyn = _kernel_smem_constant()
    for name, (regs, static_smem) in seen.items():
        extra = max([v for k, v in dyn.items() if k in name] or [0])
        assert "combine" in name or extra > 0, name
        assert static_smem + extra <= SMEM_LIMIT, (name, static_smem, extra)
    print({k: {"registers": v[0], "static_smem": v[1]} for k, v in seen.items()}, "dynamic smem", dyn)
    assert any("sparse_decode_kernel" in n for n in seen) and any("combine" in n for n in seen)
    assert any("sparse_decode_mma64_kernel" in n for n in seen)
    # the warp-specialised kernel (64 / 32 / 16 heads per block, and 16 with the deep gather): 384 threads, so at most
    # 168 registers at launch (with 64 heads setmaxnreg moves 8 per PV thread to the S warps inside; ptxas reports the
    # launch count), 0 spills as every kernel
    ws = [v for k, v in seen.items() if "sparse_decode_ws_kernel" in k]
    assert len(ws) == 4 and all(regs <= 168 for regs, _ in ws), ws
    # the combine's instances (sparse_decode.cu's launcher): kChunk 4 / 16 / 24 x one or two blocks per head row
    # (kZ), each with registers for at least two of its blocks (128 / kZ threads) per SM
    combine = {k: v for k, v in seen.items() if "combine" in k}
    assert len(combine) == 5, list(combine)
    assert all(regs * 128 * 2 <= 65536 for regs, _ in combine.values()), combine


@pytest.mark.parametrize("flags", [(), ("-DDSV4_FP4_MOE_EARLY_WEIGHTS=0",)], ids=["default", "no_early_weights"])
def test_fp4_moe_decode_resources_sm120a(tmp_path, flags):
    """Both decode kernels, each for uint8 and float32 scales; static shared memory only. Three
    128-thread blocks per SM need <= 170 registers (65536 / 384). Also the build without early weights.
    (The same unit holds the streaming kernels, checked by test_fp4_moe_stream_resources_sm120a.)"""
    seen = _compile_sm120a(tmp_path, "fp4_moe/fp4_moe.cu", flags)
    print({k: {"registers": v[0], "static_smem": v[1]} for k, v in seen.items()})
    assert sum("fp4_moe_gemm1_kernel" in n for n in seen) == 2 and sum("fp4_moe_gemm2_kernel" in n for n in seen) == 2
    for name, (regs, static_smem) in seen.items():
        assert 0 < static_smem <= SMEM_LIMIT, (name, static_smem)
        assert regs <= 170, (name, regs)


def test_fp4_moe_stream_resources_sm120a(tmp_path):
    """The streaming decode kernels (kernel_stream.cuh), as fp4_moe.cu instantiates them: gemm1 and gemm2 x uint8 /
    float32 scales x the six variants <ring steps, blocks per SM, weight source, MMA chains> (0 <3,3,regs,1>, 1
    <2,4,regs,1>, 2 <4,3,smem,1>, 3 <3,4,smem,1>, 4 <3,3,regs,2>, 5 <3,4,smem,2>) = 24, plus the bench-only
    diagnostics (uint8 scales: loads only of variants 0, 1, 3; compute only of 0, 1) = 10; no spills; registers for
    the blocks per SM each is launched for (65536 / (128 x blocks)); static + dynamic shared memory (the cp.async
    ring: kWarps x steps x kStageBytes) <= 101376 B per block; the register-ring variants also fit their blocks in
    SM120's 100 KB per SM (1 KB reserved per block; the shared-memory rings get 1 block there)."""
    seen = _compile_sm120a(tmp_path, "fp4_moe/fp4_moe.cu")
    env = _named_constants("fp4_moe/kernel.cuh", "fp4_moe/kernel_stream_src.cuh")
    stage = env["kStageBytes"]
    assert stage == 2560, stage
    stream = {k: v for k, v in seen.items() if "fp4_moe_stream_kernel" in k}
    assert len(stream) == 34, list(stream)
    found = set()
    for name, (regs, static_smem) in stream.items():
        f32, gemm, kst, kmin, src, acc, diag = map(int, re.search(
            r"fp4_moe_stream_kernelILb([01])ELi([12])ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E", name).groups())
        found.add((kst, kmin, src, acc, diag))
        assert not (diag and f32), name
        assert regs * 128 * kmin <= 65536, (name, regs)
        dyn = 4 * kst * stage if src == 1 else 0
        assert 0 < static_smem and static_smem + dyn <= SMEM_LIMIT, (name, static_smem, dyn)
        if src == 0:
            assert kmin * (static_smem + 1024) <= 102400, (name, static_smem)
    assert found == {(3, 3, 0, 1, 0), (2, 4, 0, 1, 0), (4, 3, 1, 1, 0), (3, 4, 1, 1, 0), (3, 3, 0, 2, 0),
                     (3, 4, 1, 2, 0), (3, 3, 0, 1, 1), (2, 4, 0, 1, 1), (3, 4, 1, 1, 1), (3, 3, 0, 1, 2),
                     (2, 4, 0, 1, 2)}, found
    print({k: {"registers": v[0], "static_smem": v[1]} for k, v in stream.items()})


def test_hc_prenorm_resources_sm120a(tmp_path):
    """The compiled hc_prenorm GEMM, its three 64-row instances (the general kernel, kFast, kFast with the atomic sum)
    and four kFast instances of 16 / 32 rows (plain and atomic: two blocks per SM, <= 128 registers, as
    hc_prenorm.mma_rows_pick assumes; 4 warp partials of kR x kPitch + kR floats), the
    twenty-one instances of the few-rows FMA kernel (five rows-per-block, plain, with the exchange and with the atomic
    sum, and six plain ones with the fn rows over three or six blocks; no spills, two 256-thread blocks per SM: <= 128 registers, as the launch rule in hc_prenorm.py assumes) and
    the two of the whole-K kernel. The GEMM: one 256-thread block per SM (<= 255 registers), static shared memory
    only (the warp partials' hand-over, kSmemBytes from the named constants, + the last-block flag) within the SM120
    limit, no spills (checked in _compile_sm120a).
    The reduce kernel of kFast's P > 1 partials: its warp sums' hand-over (kRedWarps x 32 float4) as static
    shared memory, registers for at least 2 blocks of 32 kRedWarps threads per SM. The atomic sum's zero kernel:
    no shared memory, registers for 8 of its blocks per SM."""
    seen = _compile_sm120a(tmp_path, "hc_prenorm/hc_prenorm.cu")
    consts = _named_constants("hc_prenorm/kernel.cuh")
    want = consts["kSmemBytes"]
    print({k: {"registers": v[0], "static_smem": v[1]} for k, v in seen.items()}, "kSmemBytes", want)
    gemm = {k: v for k, v in seen.items() if "hc_prenorm_kernel" in k}
    reduce = {k: v for k, v in seen.items() if "hc_prenorm_reduce_kernel" in k}
    small = {k: v for k, v in seen.items() if "hc_prenorm_small_kernel" in k}
    fnrow = {k: v for k, v in seen.items() if "hc_prenorm_fnrow_kernel" in k}
    zero = {k: v for k, v in seen.items() if "hc_prenorm_zero_kernel" in k}
    assert (len(gemm) == 7 and len(reduce) == 1 and len(small) == 21 and len(fnrow) == 2 and len(zero) == 1
            and len(seen) == 32), list(seen)
    (regs, static_smem), = zero.values()
    assert static_smem == 0 and regs * consts["kZeroThreads"] * 8 <= 65536, (regs, static_smem)
    # the whole-K kernel, one instance per x-row count kM = 1, 2: one 1024-thread block (<= 64 registers), the 32 warp
    # sums of kM dot products and kM square-sums as static shared memory
    assert _named_constants("hc_prenorm/kernel_small.cuh")["kRowThreads"] == 1024
    for name, (regs, static_smem) in fnrow.items():
        km = int(re.search(r"fnrow_kernelILi(\d+)E", name).group(1))
        assert regs <= 64 and static_smem == 32 * 2 * km * 4, (name, regs, static_smem)
    assert sorted(int(re.search(r"fnrow_kernelILi(\d+)E", k).group(1)) for k in fnrow) == [1, 2]
    # the few-rows kernel (kernel_small.cuh), one instance per rows-per-block R, plain, with the exchange and with the
    # atomic sum (template flags kXchg, kAtomic, mangled "Lb0ELb0" / "Lb1ELb0" / "Lb0ELb1"): the registers of
    # kMinBlocksPerSm 256-thread blocks per SM (the launch rule, hc_prenorm.small_rows, counts on it); no shared
    # memory when plain, with the exchange the summing block's chain sums (kXChains x R x kXVals floats) + the
    # last-ticket flag, with the atomic sum the block's R x 24 sums and R square-sums
    small_consts = _named_constants("hc_prenorm/kernel_small.cuh")
    per_sm = small_consts["kMinBlocksPerSm"]
    mirror = re.search(r"^_SMALL_BLOCKS_PER_SM = (\d+)", open(os.path.join(ROOT, "deepseek_v4_kernel", "ops",
                                                                          "hc_prenorm", "dispatch.py")).read(), re.M)
    assert per_sm == 2 and mirror and int(mirror.group(1)) == per_sm, (per_sm, mirror)
    assert all(regs * 256 * per_sm <= 65536 for regs, _ in small.values()), small
    # (template flags kXchg, kAtomic, kFG: mangled "Lb0ELb0ELi1E" plain, "Lb1ELb0ELi1E" exchange, "Lb0ELb1ELi1E" atomic,
    # "Lb0ELb0ELi3E" / "Lb0ELb0ELi6E" plain with fn groups)
    plain = {k: v for k, v in small.items() if k.endswith("Lb0ELb0ELi1EEEv15HcPrenormParams")}
    xchg = {k: v for k, v in small.items() if k.endswith("Lb1ELb0ELi1EEEv15HcPrenormParams")}
    atomic = {k: v for k, v in small.items() if k.endswith("Lb0ELb1ELi1EEEv15HcPrenormParams")}
    grouped = {k: v for k, v in small.items() if re.search(r"Lb0ELb0ELi[36]EEEv15HcPrenormParams$", k)}
    assert len(plain) == len(xchg) == len(atomic) == 5 and len(grouped) == 6, list(small)
    assert all(static_smem == 0 for _, static_smem in list(plain.values()) + list(grouped.values())), plain
    # the fn-group rule (dispatch.fn_groups_pick) counts on FN_GROUPS_MAX_BLOCKS_PER_SM blocks per SM of the
    # instances its rows launch (<kRT, kJ, kTR, kU, ..., kFG>: R = kRT kTR rows, kFG groups)
    from deepseek_v4_kernel.ops.hc_prenorm import dispatch

    used = {(r, g) for _, r, g in dispatch.FN_GROUPS_RULE}
    for name, (regs, _) in grouped.items():
        krt, ktr, fg = map(int, re.search(r"kernelILi(\d+)ELi\d+ELi(\d+)ELi\d+ELb0ELb0ELi(\d+)E", name).groups())
        if (krt * ktr, fg) in used:
            used.discard((krt * ktr, fg))
            assert regs * 256 * dispatch.FN_GROUPS_MAX_BLOCKS_PER_SM <= 65536, (name, regs)
    assert not used, f"rows of FN_GROUPS_RULE without an instance: {used}"
    rows_of = {(1, 1): 1, (1, 2): 2, (1, 4): 4, (2, 4): 8, (4, 4): 16}   # <kRT, kJ, kTR, ...>: R = kRT kTR
    for name, (_, static_smem) in list(xchg.items()) + list(atomic.items()):
        krt, ktr = map(int, re.search(r"kernelILi(\d+)ELi\d+ELi(\d+)E", name).groups())
        R = rows_of[(krt, ktr)]
        want_smem = small_consts["kXChains"] * R * 25 * 4 + 4 if name in xchg else R * 25 * 4
        assert static_smem == want_smem, (name, static_smem)
    rows = sorted(int(re.search(r"hc_prenorm_kernelILb[01]ELb[01]ELi(\d+)E", k).group(1)) for k in gemm)
    assert rows == [16, 16, 32, 32, 64, 64, 64], list(gemm)
    for name, (regs, static_smem) in gemm.items():
        kr = int(re.search(r"hc_prenorm_kernelILb[01]ELb[01]ELi(\d+)E", name).group(1))
        if kr == consts["kRows"]:
            assert want <= static_smem <= want + 16 and static_smem <= SMEM_LIMIT and regs <= 255, (name, regs,
                                                                                                   static_smem)
        else:
            part = (consts["kWarps"] // 2) * (kr * consts["kPitch"] + kr) * 4
            assert static_smem == part and regs * consts["kThreads"] * 2 <= 65536, (name, regs, static_smem)
    (regs, static_smem), = reduce.values()
    threads = 32 * consts["kRedWarps"]
    assert static_smem == 16 * threads and regs * threads * 2 <= 65536, (regs, static_smem)


def test_fp4_moe_e2m1_decode_on_host(tmp_path):
    """The cuda_decode kernels' e2m1 -> bf16 bit trick, compiled from kernel.cuh and run on the CPU:
    every byte pair in every position decodes to exactly e2m1 * 2^-126, and a model of one step's K
    permutation (A halves vs the B halves the kernel selects with prmt) gives the exact dot product
    (tests/host/fp4_decode_check.cu); and the streaming kernels' division-free item cursor. The GPU tests of
    test_fp4_moe_gpu.py check the kernels end to end."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC)")
    exe = tmp_path / "fp4_decode_check"
    r = subprocess.run([nvcc, "-O2", "-std=c++17", "-I", os.path.join(ROOT, "csrc"),
                        os.path.join(ROOT, "tests", "host", "fp4_decode_check.cu"), "-o", str(exe)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("OK "), r.stdout + r.stderr
    assert int(r.stdout.split()[1]) == 8 * 65536 + 2000 + 1000


def test_fp8_linear_resources_sm120a(tmp_path):
    """The FP8 linear decode kernels: 6 token-tile counts x 3 scale forms x 2 weight decodes = 36 instances of each of
    the two kernels (register ring, shared-memory ring) + the ring kernel's x prep kernel, no spills
    (checked in _compile_sm120a), 16 B of static shared memory (the last-block flag) beside the dynamic x pieces
    (kernel.cuh Cfg: 3 buffers x piece steps x MT x 2 KB + the scales, <= 101376 B), and the registers and shared memory of
    the blocks per SM the split rule assumes (ops/fp8_linear/dispatch.blocks_per_sm: 2 x 256 threads -> <= 128
    registers, and within an SM120 SM's 100 KB)."""
    seen = _compile_sm120a(tmp_path, "fp8_linear/fp8_linear.cu")
    print({k: {"registers": v[0], "static_smem": v[1]} for k, v in seen.items()})
    from deepseek_v4_kernel.ops.fp8_linear import dispatch
    kern = {k: v for k, v in seen.items() if "fp8_linear_kernel" in k}
    ring = {k: v for k, v in seen.items() if "fp8_linear_ring_kernel" in k}
    prep = {k: v for k, v in seen.items() if "fp8_linear_prep_x" in k}
    assert len(kern) == 36 and len(ring) == 36 and len(prep) == 1 and len(seen) == 73, list(seen)
    # the ring kernel (kernel_ring.cuh): one block of 256 threads per SM (<= 255 registers: checked above), 16 B of
    # static shared memory (the last-block flag) beside its ring (dispatch.ring_smem_bytes), within an SM120 SM
    got_ring = set()
    for name, (regs, static_smem) in ring.items():
        mt, mode, cvt = re.search(r"fp8_linear_ring_kernelILi(\d+)ELi(\d)ELb([01])E", name).groups()
        got_ring.add((int(mt), int(mode), cvt))
        dyn = dispatch.ring_smem_bytes(int(mt))
        assert static_smem <= 16 and static_smem + dyn <= SMEM_LIMIT, (name, static_smem, dyn)
        assert static_smem + dyn + 1024 <= 100 * 1024, (name, dyn)
    assert got_ring == {(m, s, c) for m in dispatch.TILE_COUNTS for s in range(3) for c in "01"}, got_ring
    (regs, static_smem), = prep.values()
    assert static_smem == 0 and regs * 256 <= 65536, (regs, static_smem)
    got = set()
    for name, (regs, static_smem) in kern.items():
        mt, mode, cvt = re.search(r"fp8_linear_kernelILi(\d+)ELi(\d)ELb([01])E", name).groups()
        mt, mode = int(mt), int(mode)
        got.add((mt, mode, cvt))
        piece = dispatch.piece_steps(mt)
        dyn = 3 * piece * mt * 4 * 32 * 16 + 2 * piece * mt * 8 * 4
        per_sm = dispatch.blocks_per_sm(mt, mode)
        assert static_smem <= 16 and static_smem + dyn <= SMEM_LIMIT, (name, static_smem, dyn)
        assert regs * 256 * per_sm <= 65536, (name, regs)
        # SM120: 100 KB of shared memory per SM, 1 KB reserved per block
        assert per_sm * (static_smem + dyn + 1024) <= 100 * 1024, (name, per_sm, dyn)
    assert got == {(m, s, c) for m in dispatch.TILE_COUNTS for s in range(3) for c in "01"}, got


def test_fp8_linear_bit_tricks_on_host(tmp_path):
    """The FP8 linear kernel's bit-level pieces (csrc/fp8_linear/fragments.cuh), compiled and run on the CPU
    (tests/host/fp8_linear_check.cu): the integer e4m3 -> f16 decode on every byte pair, the power-of-two bf16 -> f16
    rescale of x on every bf16 value under group maxima of every exponent (exact within 2^28 of the max), and a model
    of one warp step (fragment layouts of m16n8k16, the K permutation, both decodes) against a direct dot product.
    The GPU tests of tests/test_fp8_linear.py check the kernel end to end."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC)")
    exe = tmp_path / "fp8_linear_check"
    r = subprocess.run([nvcc, "-O2", "-std=c++17", "-I", os.path.join(ROOT, "csrc"),
                        os.path.join(ROOT, "tests", "host", "fp8_linear_check.cu"), "-o", str(exe)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.startswith("OK "), r.stdout + r.stderr
    assert int(r.stdout.split()[1]) > 8_000_000


def test_hc_stream_probe_builds_for_sm120a(tmp_path):
    """tools/hc_stream_probe.cu (docs/hc_prenorm.md) launches both instances of the compiled hc_prenorm
    kernel from csrc/hc_prenorm/kernel.cuh beside its streaming probes: it must keep compiling against that header."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC)")
    r = subprocess.run([nvcc, "-O3", "-std=c++17", "-gencode", "arch=compute_120a,code=sm_120a", "-I",
                        os.path.join(ROOT, "csrc"), os.path.join(ROOT, "tools", "hc_stream_probe.cu"), "-o",
                        str(tmp_path / "hc_probe")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]


def test_mma_peak_tool_builds_for_sm120a_and_times_what_it_claims(tmp_path):
    """benchmarks/mma_peak.cu gives the benches their mma.sync ceiling (bench_common.mma_sync_flops). Built for
    sm_120a, its two loops must be what the table says: bf16 HMMA (m16n8k16) only, no other tensor-core
    instruction, and in the S-shaped loop one LDSM per two HMMA (the compiler once hoisted / CSE'd those
    loads out of the loop, which timed a register-only loop under the ldmatrix label)."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC)")
    import triton  # the cuobjdump shipped with Triton's NVIDIA backend (as tools/aot_common.py uses)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(cuobjdump):
        pytest.skip(f"no cuobjdump at {cuobjdump}")
    exe = tmp_path / "mma_peak"
    r = subprocess.run([nvcc, "-O3", "-gencode", "arch=compute_120a,code=sm_120a",
                        os.path.join(ROOT, "benchmarks", "mma_peak.cu"), "-o", str(exe)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    for feed, fun in ((0, "_Z8mma_loopILi0EEvPfPxj"), (1, "_Z8mma_loopILi1EEvPfPxj")):
        sass = subprocess.run([cuobjdump, "-sass", "-fun", fun, str(exe)], capture_output=True, text=True,
                              check=True).stdout
        assert "arch = sm_120a" in sass, sass[:400]
        hmma = len(re.findall(r"\bHMMA\.16816\.F32\.BF16\b", sass))
        ldsm = len(re.findall(r"\bLDSM\.16\.M88\.4\b", sass))
        assert hmma >= 64, f"mma_loop<{feed}>: {hmma} HMMA"
        assert not re.search(r"\b(HGMMA|UTC\w*MMA|QMMA|OMMA)\b", sass), f"mma_loop<{feed}>: other tensor ops"
        assert ldsm == (hmma // 2 if feed else 0), f"mma_loop<{feed}>: {ldsm} LDSM for {hmma} HMMA"


def test_trace_tool_instruments_the_kernels_auto_runs_and_builds_for_sm120a(tmp_path):
    """tools/trace_sparse_decode.py inserts its trace points at asserted source anchors; a kernel edit that moves one
    must fail here, not on the first GPU that runs the tool (the first SM120 measurement, docs/sparse_decode.md). Every
    point its reader uses must be written by the instrumented source: the warp-specialised kernels ("auto" at every
    default shape), the 8-warp mma64 kernel and the combine. The instrumented sparse_decode.cu and api.cu compile for
    sm_120a (spills are allowed there: traced builds take registers, which the tool's output says)."""
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import trace_sparse_decode as tr
    with pytest.raises(SystemExit, match="unknown"):
        tr.instrument(str(tmp_path / "unused"), ablate=("nodeq", "nothing"))
    for cycles in (False, True):
        dst = tmp_path / f"csrc_{int(cycles)}"
        tr.copy_csrc(str(dst))
        tr.instrument(str(dst), ablate=("nodeq",) if cycles else (), cycles=cycles)
        kernel = open(dst / "sparse_decode" / "kernel.cuh").read()
        assert f"#define DSV4_TRACE_CYCLES {int(cycles)}" in kernel
        assert f"#define ABL_NODEQ {int(cycles)}" in kernel and "#define ABL_NOPV 0" in kernel
        written = set()
        for f in ("kernel.cuh", "kernel_mma64.cuh", "kernel_ws.cuh"):
            src = open(dst / "sparse_decode" / f).read()
            for m in re.finditer(r"\bTR\(([^,]+),", src):
                if m.group(1) == "pt":   # the macro's definition
                    continue
                if m.group(1).startswith("tb + "):   # S warps 0 and last: tb = WS0 + WS_S0 / WS_S3
                    assert f"const int tb = {tr.WS0} + (sw == 0 ? {tr.WS_S0} : {tr.WS_S3});" in src
                    k = int(m.group(1)[5:])
                    written |= {tr.WS0 + tr.WS_S0 + k, tr.WS0 + tr.WS_S3 + k}
                    continue
                written.add(eval(m.group(1), {}))
        ws = {tr.WS0 + v for k, v in vars(tr).items() if k.startswith("WS_") and k not in ("WS_S0", "WS_S3")}
        need = set(range(16)) | ws
        assert need <= written, f"trace points the reader uses but no kernel writes: {sorted(need - written)}"
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found (set NVCC)")
    for unit in ("sparse_decode/sparse_decode.cu", "api.cu"):
        r = subprocess.run([nvcc, "-O3", "-std=c++17", "-gencode", "arch=compute_120a,code=sm_120a", "-I", str(dst),
                            "-c", str(dst / unit), "-o", str(tmp_path / "unit.o")],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]


def test_aot_failures_skip_only_without_an_sm120_target():
    """tests/aot_errors.skip_or_fail, which the Triton ops' sm_120a compile tests use: a toolchain without sm_120 skips,
    a kernel over SM120's resources fails, whatever else the message says (ptxas names itself in both)."""
    import pytest as _pytest
    from aot_errors import skip_or_fail
    for no_target in ("ptxas fatal   : Value 'sm_120a' is not defined for option 'gpu-name'",
                      "RuntimeError: ptxas: /usr/bin/ptxas: No such file or directory"):
        with _pytest.raises(_pytest.skip.Exception):
            skip_or_fail(no_target, "x")
    for real in ("ptxas error   : Entry function '_gemm1_kernel' uses too much shared data (0x19000 bytes, 0x18c00 max)",
                 "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 110592, Hardware limit: "
                 "101376. Reducing block sizes or `num_stages` may help. (ptxas)",
                 "ptxas fatal : Value 'sm_120a' is not defined for option 'gpu-name'; too many resources requested",
                 "AssertionError: something else entirely"):
        with _pytest.raises(AssertionError):
            skip_or_fail(real, "x")
