"""Which failures of an sm_120a ahead-of-time compile may skip a test: only a toolchain that cannot target sm_120 at
all (an old ptxas, or none). Every other failure, a kernel over SM120's resources above all, fails the test."""

import re

import pytest

# ptxas / Triton's compile errors meaning "this toolchain has no sm_120 target"
NO_SM120_TARGET = re.compile(r"Value 'sm_120a?' is not defined for option|Unsupported (?:gpu )?architecture 'sm_120"
                             r"|ptxas[^\n]*(?:No such file or directory|not found)|PTXAS_PATH[^\n]*not found", re.I)
# what a kernel beyond SM120's limits looks like: never a skip
OVER_RESOURCES = re.compile(r"too many resources|too much shared|uses too much|out of resources|exceeds", re.I)


def skip_or_fail(stderr: str, what: str) -> None:
    """Skip when ``stderr`` says the toolchain cannot target sm_120; raise AssertionError with the tail otherwise."""
    if NO_SM120_TARGET.search(stderr) and not OVER_RESOURCES.search(stderr):
        pytest.skip(f"{what}: this toolchain cannot target sm_120: " + stderr.strip()[-200:])
    raise AssertionError(f"{what} failed:\n" + stderr[-3000:])
