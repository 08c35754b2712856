"""Builds libhyperpar_c.so (the C library without MPI, CMake target hyperpar_c) and ships it inside the package.

The C sources are the repository's (this folder's parent); `pip install ./python` from a checkout builds them.
HYPERPAR_BUILD_DIR reuses a CMake build folder instead of making a new one.
"""
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        build = os.environ.get("HYPERPAR_BUILD_DIR") or os.path.join(ROOT, "build-python")
        subprocess.check_call(["cmake", "-S", ROOT, "-B", build, "-DCMAKE_BUILD_TYPE=Release"])
        subprocess.check_call(["cmake", "--build", build, "--target", "hyperpar_c", "-j", str(os.cpu_count() or 2)])
        dest = os.path.join(self.build_lib, "hyperpar")
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(os.path.join(build, "libhyperpar_c.so"), os.path.join(dest, "libhyperpar_c.so"))


setup(cmdclass={"build_py": BuildWithLibrary})
