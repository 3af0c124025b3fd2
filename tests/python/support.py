"""Shared by the kvpool Python tests: where things are, and a kvpool server.

Run by tests/integration/test_python_core.sh, which sets PYTHONPATH to the
repository's python/ and KVPOOL_LIB to the build's libkvpool.so; run by hand
as `KVPOOL_LIB=build/libkvpool.so python3 -m unittest discover tests/python`
(the repository's python/ is put on sys.path here when PYTHONPATH is unset).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.environ.get("KVP_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("KVP_BUILD_DIR") or os.path.join(REPO, "build")
KVP_BIN = os.environ.get("KVP_BIN") or os.path.join(BUILD, "kvpool")
os.environ.setdefault("KVPOOL_LIB", os.path.join(BUILD, "libkvpool.so"))
if os.path.join(REPO, "python") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))  # hash_ref.py


def c_compiler():
    """The C compiler the build used ($KVP_CC), else cc; None if neither runs."""
    for cc in (os.environ.get("KVP_CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


class Server:
    """`kvpool server` on 127.0.0.1 with a port the kernel picks; stop() ends
    it by its PID."""

    def __init__(self, memory="64MiB"):
        self.dir = tempfile.mkdtemp(prefix="kvp-pytest.")
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen(
            [KVP_BIN, "server", "--listen", "127.0.0.1:0", "--port-file", port_file,
             "--memory", memory, "--log-level", "error"],
            stdout=self.log, stderr=subprocess.STDOUT)
        port = ""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with open(port_file) as f:
                    port = "".join(c for c in f.read() if c.isdigit())
            except FileNotFoundError:
                pass
            if port:
                break
            time.sleep(0.05)
        if not port:
            self.stop()
            raise RuntimeError("kvpool server did not start (%s)" % self.log_tail())
        self.uri = "kvpool://127.0.0.1:%s" % port

    def log_tail(self):
        with open(self.log.name, "rb") as f:
            return f.read()[-400:].decode("utf-8", "replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
