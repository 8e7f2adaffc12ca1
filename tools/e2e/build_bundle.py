"""Build the end-to-end bundle from the package index, reproducibly, and write its manifest.

    python3 tools/e2e/build_bundle.py                 # download (cached), pack, split, write .e2e/ + the manifest
    python3 tools/e2e/build_bundle.py --check         # rebuild into .e2e/ and fail if the committed manifest differs

Steps: ``pip download --no-deps`` of each wheel pinned in ``bundle_spec.WHEELS`` (file name and sha256: a hashed
requirement, checked after download) for CPython 3.12 / manylinux x86_64 into ``.e2e/wheels/`` (kept: a second run
downloads nothing); one tar per group, built straight from the wheels
with the slimming rules applied (sorted members, fixed mtime / owner / modes, so equal wheels give equal bytes),
compressed with xz preset 9 (Python's lzma, single-threaded, deterministic) and split into parts of at most
``bundle_spec.PART_LIMIT`` bytes in ``.e2e/parts/``; then ``tools/e2e/bundle_manifest.json``: per package its wheel,
sha256 and sizes, per group its parts with sha256, and the transfers (which parts one device call carries).

``.e2e/`` must be git-ignored (it is carried to the GPU machine with the device tool's ``carry``).
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from typing import Dict, Iterator, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import bundle_spec as spec  # noqa: E402

MANIFEST = os.path.join(HERE, "bundle_manifest.json")
DEFAULT_WORK = os.path.join(ROOT, ".e2e")
FIXED_MTIME = 1700000000  # any constant: members carry no build time


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def find_wheel(wheels_dir: str, package: spec.Package) -> str:
    """The pinned wheel of ``package`` in ``wheels_dir`` (bundle_spec.WHEELS: that file name, that sha256), or ""."""
    name, sha = spec.WHEELS[package.name]
    path = os.path.join(wheels_dir, name)
    return path if os.path.isfile(path) and sha256_file(path) == sha else ""


def download(wheels_dir: str, packages, python: str = sys.executable) -> Dict[str, str]:
    """pip download --no-deps exactly the pinned wheel (bundle_spec.WHEELS) of every package not yet in
    ``wheels_dir``: a hashed requirement, so pip takes the file with that sha256 among the version's builds (and
    refuses any other); then each file is checked by name and sha256. Returns name -> wheel path."""
    os.makedirs(wheels_dir, exist_ok=True)
    missing = [p for p in packages if not find_wheel(wheels_dir, p)]
    if missing:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
            for p in missing:
                req.write(f"{p.requirement} --hash=sha256:{spec.WHEELS[p.name][1]}\n")
        cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--require-hashes",
               "--python-version", spec.PYTHON_TAG, "--implementation", "cp", "--abi", spec.ABI,
               "-d", wheels_dir, "-r", req.name]
        for plat in spec.PLATFORMS:
            cmd += ["--platform", plat]
        print(f"pip download {len(missing)} pinned wheels -> {wheels_dir}", flush=True)
        try:
            subprocess.run(cmd, check=True)
        finally:
            os.unlink(req.name)
    out, wrong = {}, []
    for p in packages:
        path = find_wheel(wheels_dir, p)
        if not path:
            name, sha = spec.WHEELS[p.name]
            there = os.path.join(wheels_dir, name)
            got = f"sha256 {sha256_file(there)}" if os.path.isfile(there) else "no such file"
            wrong.append(f"{p.requirement}: want {name} sha256 {sha}, got {got}")
        out[p.name] = path
    if wrong:
        raise SystemExit("build_bundle: not the pinned wheels (bundle_spec.WHEELS) in " + wheels_dir + ": "
                         + "; ".join(wrong))
    return out


def kept(package: spec.Package, member: str) -> bool:
    if member.endswith("/"):
        return False
    if package.only:
        return any(fnmatch.fnmatch(member, pat) for pat in package.only)
    return not any(fnmatch.fnmatch(member, pat) for pat in package.exclude)


def strip_debug(data: bytes) -> bytes:
    """`strip --strip-debug` of a shared library's bytes (deterministic for equal input and binutils)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "lib.so")
        with open(path, "wb") as f:
            f.write(data)
        subprocess.run(["strip", "--strip-debug", path], check=True)
        with open(path, "rb") as f:
            return f.read()


def wheel_members(package: spec.Package, wheel: str) -> Iterator[Tuple[str, bytes, bool, str]]:
    """(name, bytes, executable, action) for every member the bundle keeps, in sorted order;
    action is "", "stripped" or "excluded" (excluded members come with empty bytes)."""
    with zipfile.ZipFile(wheel) as z:
        for info in sorted(z.infolist(), key=lambda i: i.filename):
            name = info.filename
            if name.endswith("/"):
                continue
            if not kept(package, name):
                yield name, b"", False, "excluded"
                continue
            data = z.read(info)
            action = ""
            if any(fnmatch.fnmatch(name, pat) for pat in package.strip_debug):
                data, action = strip_debug(data), "stripped"
            executable = bool((info.external_attr >> 16) & 0o111)
            yield name, data, executable, action


class _PartWriter(io.RawIOBase):
    """A write-only stream that cuts what it gets into files of at most ``limit`` bytes."""

    def __init__(self, prefix: str, limit: int):
        self.prefix, self.limit = prefix, limit
        self.paths: List[str] = []
        self._f = None
        self._in_part = 0

    def writable(self):
        return True

    def write(self, data) -> int:
        data = memoryview(data)
        n = len(data)
        while len(data):
            if self._f is None or self._in_part == self.limit:
                self._next()
            take = min(len(data), self.limit - self._in_part)
            self._f.write(data[:take])
            self._in_part += take
            data = data[take:]
        return n

    def _next(self):
        if self._f is not None:
            self._f.close()
        path = f"{self.prefix}.{len(self.paths):02d}"
        self.paths.append(path)
        self._f = open(path, "wb")
        self._in_part = 0

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None
        super().close()


def pack_group(group: str, wheels: Dict[str, str], parts_dir: str, part_limit: int) -> Tuple[dict, List[dict]]:
    """Write the group's tar.xz parts; returns (group record, package records)."""
    os.makedirs(parts_dir, exist_ok=True)
    prefix = os.path.join(parts_dir, f"{group}.tar.xz")
    for old in glob.glob(prefix + ".*"):
        os.remove(old)
    writer = _PartWriter(prefix, part_limit)
    xz = lzma.LZMAFile(writer, "wb", format=lzma.FORMAT_XZ, check=lzma.CHECK_CRC64, preset=9)
    records = []
    tar_bytes = 0
    with tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for package in spec.packages_in(group):
            wheel = wheels[package.name]
            rec = {"name": package.name, "version": package.version, "group": group,
                   "wheel": os.path.basename(wheel), "sha256": sha256_file(wheel),
                   "wheel_bytes": os.path.getsize(wheel), "unpacked_bytes": 0, "files": 0,
                   "excluded": [], "stripped": []}
            for name, data, executable, action in wheel_members(package, wheel):
                if action == "excluded":
                    rec["excluded"].append(name)
                    continue
                if action == "stripped":
                    rec["stripped"].append(name)
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), FIXED_MTIME
                info.mode = 0o755 if executable else 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
                rec["unpacked_bytes"] += len(data)
                rec["files"] += 1
            tar_bytes += rec["unpacked_bytes"]
            records.append(rec)
            print(f"  {group}: {package.requirement}: {rec['files']} files, "
                  f"{rec['unpacked_bytes'] / spec.MIB:.1f} MiB kept", flush=True)
    xz.close()
    writer.close()
    parts = [{"file": os.path.basename(p), "bytes": os.path.getsize(p), "sha256": sha256_file(p)}
             for p in writer.paths]
    group_rec = {"dest": spec.GROUP_DEST[group], "unpacked_bytes": tar_bytes,
                 "xz_bytes": sum(p["bytes"] for p in parts), "parts": parts}
    return group_rec, records


def plan_transfers(groups: Dict[str, dict], limit: int = spec.TRANSFER_LIMIT) -> List[List[str]]:
    """Parts in group order, packed into device calls of at most ``limit`` bytes each (first fit, order kept)."""
    transfers: List[List[str]] = []
    sizes: List[int] = []
    for group in spec.GROUP_ORDER:
        for part in groups.get(group, {}).get("parts", []):
            if part["bytes"] > limit:
                raise SystemExit(f"build_bundle: part {part['file']} has {part['bytes']} bytes, over {limit}")
            for i, used in enumerate(sizes):
                if used + part["bytes"] <= limit:
                    transfers[i].append(part["file"])
                    sizes[i] += part["bytes"]
                    break
            else:
                transfers.append([part["file"]])
                sizes.append(part["bytes"])
    return transfers


def build(work: str, part_limit: int, groups=spec.GROUP_ORDER) -> dict:
    wheels = download(os.path.join(work, "wheels"), [p for p in spec.PACKAGES if p.group in groups])
    manifest = {"format": 1, "python": spec.PYTHON_TAG, "abi": spec.ABI, "platforms": list(spec.PLATFORMS),
                "part_limit_bytes": part_limit, "transfer_limit_bytes": spec.TRANSFER_LIMIT,
                "packages": [], "groups": {}}
    for group in groups:
        print(f"packing {group} ...", flush=True)
        group_rec, records = pack_group(group, wheels, os.path.join(work, "parts"), part_limit)
        manifest["groups"][group] = group_rec
        manifest["packages"] += records
        print(f"{group}: {group_rec['unpacked_bytes'] / spec.MIB:.1f} MiB unpacked, "
              f"{group_rec['xz_bytes'] / spec.MIB:.1f} MiB xz in {len(group_rec['parts'])} part(s)", flush=True)
    manifest["transfers"] = plan_transfers(manifest["groups"])
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=DEFAULT_WORK, help="git-ignored output directory (default: .e2e/)")
    ap.add_argument("--part-mib", type=int, default=spec.PART_LIMIT // spec.MIB,
                    help="largest part in MiB (default %(default)s; one device call carries at most 64 MiB)")
    ap.add_argument("--check", action="store_true",
                    help="build, then fail if the result differs from the committed manifest (nothing is written to it)")
    ap.add_argument("--clean", action="store_true", help="delete downloaded wheels first")
    args = ap.parse_args(argv)
    if args.part_mib <= 0 or args.part_mib * spec.MIB > spec.TRANSFER_LIMIT:
        ap.error(f"--part-mib must be in 1..{spec.TRANSFER_LIMIT // spec.MIB}, got {args.part_mib}")
    problems = spec.spec_problems()
    if problems:
        raise SystemExit("build_bundle: bundle_spec.py: " + "; ".join(problems))
    if args.clean:
        shutil.rmtree(os.path.join(args.work, "wheels"), ignore_errors=True)
    manifest = build(args.work, args.part_mib * spec.MIB)
    text = json.dumps(manifest, indent=1, sort_keys=True) + "\n"
    if args.check:
        with open(MANIFEST) as f:
            committed = f.read()
        if committed != text:
            print(f"build_bundle: the bundle built now differs from {MANIFEST}; rerun without --check and commit it",
                  file=sys.stderr)
            return 1
        print("manifest matches")
        return 0
    with open(MANIFEST, "w") as f:
        f.write(text)
    print(f"wrote {MANIFEST}; transfers: " + " | ".join("+".join(t) for t in manifest["transfers"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
