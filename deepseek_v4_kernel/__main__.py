"""Command line: ``python -m deepseek_v4_kernel doctor [--json] [--no-selftest] [--devices N,...]``, or
``python -m deepseek_v4_kernel bench [--tp N] [--ops a,b] [--out PATH] [--quick] [--mma-sync]`` (bench/cli.py), or
``python -m deepseek_v4_kernel cache show [--json] | clear | measure ...`` (cache_cli.py: measured dispatch's cache)."""

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m deepseek_v4_kernel doctor [--json] [--no-selftest] [--devices N,...]\n"
              "       python -m deepseek_v4_kernel bench [--tp N] [--ops a,b] [--out PATH] [--quick] [--mma-sync]\n"
              "       python -m deepseek_v4_kernel cache show [--json] | clear | measure --op OP --tp N")
        return 0 if argv else 2
    if argv[0] == "doctor":
        from .doctor import main as doctor

        return doctor(argv[1:])
    if argv[0] == "bench":   # ours against SGLang's installed paths on this GPU (deepseek_v4_kernel/bench/cli.py)
        from .bench.cli import main as bench

        return bench(argv[1:])
    if argv[0] == "cache":   # measured dispatch's cached decisions (patch/decisions.py)
        from .cache_cli import main as cache

        return cache(argv[1:])
    print(f"unknown command {argv[0]!r}; usage: python -m deepseek_v4_kernel doctor [--json] | bench [--tp N] "
          f"| cache show", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
