"""Build hook: `pip install ./python` carries libkvpool.so into the package.

The package is ctypes over libkvpool.so, plus two small CPython extensions,
kvpool._kvsched (the scheduler hooks read vLLM's objects in C) and
kvpool._kvio (Pool's single-key get_into/put without ctypes); they take the
library's symbols from the libkvpool.so that kvpool/_lib.py loads, so they
are compiled against ../include only and never linked to a library path.  At
build time this also copies one
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

from setuptools import Extension, setup
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


# The C headers: $KVPOOL_INCLUDE (a copy of the repository's include/), else
# ../include next to this directory (`pip install ./python` in a clone).
INCLUDE = os.environ.get("KVPOOL_INCLUDE") or os.path.join(HERE, "..", "include")
if not os.path.isfile(os.path.join(INCLUDE, "kvpool", "kv_connector.h")):
    raise SystemExit("kvpool: no kvpool/kv_connector.h under %s; build from the repository "
                     "(pip install ./python) or set KVPOOL_INCLUDE to its include/ directory"
                     % INCLUDE)
FLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-missing-field-initializers",
         "-Wno-cast-function-type"]
EXTENSIONS = [Extension("kvpool." + name, sources=["kvpool/%s.c" % name], include_dirs=[INCLUDE],
                        extra_compile_args=FLAGS)
              for name in ("_kvsched", "_kvio")]  # the scheduler hooks; Pool's fast path

setup(cmdclass={"build_py": BuildPyWithLib}, ext_modules=EXTENSIONS)
