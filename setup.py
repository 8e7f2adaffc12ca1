"""pip install . : the package plus the CUDA extension (deepseek_v4_kernel/_C.so, built by
scripts/build_ext.sh with nvcc for sm_120a; DSV4_KERNEL_EXTRA_ARCHS adds more).

Users of the docker recipe do not need this: scripts/build.sh assembles the directory they
mount. DSV4_KERNEL_NO_EXT=1 installs the Python package only.
"""

import os
import subprocess

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


class build_py_with_kernel(build_py):
    def run(self):
        super().run()
        if os.environ.get("DSV4_KERNEL_NO_EXT", "") in ("1", "true", "yes"):
            return
        target = os.path.join(self.build_lib, "deepseek_v4_kernel", "_C.so")
        subprocess.check_call(["bash", os.path.join(ROOT, "scripts", "build_ext.sh"), target])


setup(
    name="deepseek-v4-kernel",
    version="0.1.0",
    description="DeepSeek-V4 (Flash) kernels for SM120 GPUs, patched into an unmodified SGLang",
    packages=find_packages(include=["deepseek_v4_kernel", "deepseek_v4_kernel.*"]),
    py_modules=[],  # sitecustomize.py ships in the build directory (scripts/build.sh), not site-packages
    python_requires=">=3.10",
    cmdclass={"build_py": build_py_with_kernel},
)
