"""Build hook: `pip install ./python` carries libkvpool.so into the package.

The package itself is pure Python (ctypes).  At build time this copies one
libkvpool.so into kvpool/ inside the build (never into the source tree), so
the installed package finds it without KVPOOL_LIB.  Which one:
  $KVPOOL_LIB if set at install time, else ../build/libkvpool.so.0 (or .so)
  next to this directory (the repository's release build), else none: the
  installed package then looks at $KVPOOL_LIB and the system loader at
  import (kvpool/_lib.py).  KVPOOL_CARRY_LIB=0 carries none (the vLLM test
  venv: scripts/vllm-env.sh installs the package while C may still be
  building, and its tests name the library with $KVPOOL_LIB).
"""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _find_lib():
    if os.environ.get("KVPOOL_CARRY_LIB") == "0":
        return None
    env = os.environ.get("KVPOOL_LIB")
    if env:
        return env if os.path.isfile(env) else None
    for name in ("libkvpool.so.0", "libkvpool.so"):
        p = os.path.join(HERE, "..", "build", name)
        if os.path.isfile(p):
            return p
    return None


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        lib = _find_lib()
        if lib is None:
            print("kvpool: no libkvpool.so found to carry (set KVPOOL_LIB or build ../build); "
                  "the package will look for it at import")
            return
        dst = os.path.join(self.build_lib, "kvpool", "libkvpool.so.0")
        shutil.copyfile(os.path.realpath(lib), dst)
        print("kvpool: carrying %s as %s" % (lib, dst))


setup(cmdclass={"build_py": BuildPyWithLib})
