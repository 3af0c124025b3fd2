"""kvpool.Error and its subclasses: generated from the one status list
(include/kvpool/status.h), current, and named as the library names them."""
import os
import subprocess
import sys
import tempfile
import unittest

import support
import kvpool
from kvpool import _lib, _status

GEN = os.path.join(support.REPO, "python", "gen_status.py")
STATUS_H = os.path.join(support.REPO, "include", "kvpool", "status.h")


class ErrorsTest(unittest.TestCase):
    def test_generated_table_is_current_with_status_h(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "_status.py")
            subprocess.run([sys.executable, GEN, STATUS_H, out], check=True)
            with open(out) as f:
                fresh = f.read()
        with open(os.path.join(support.REPO, "python", "kvpool", "_status.py")) as f:
            self.assertEqual(f.read(), fresh, "rerun python3 python/gen_status.py")

    def test_every_code_has_the_librarys_name_and_message(self):
        self.assertGreaterEqual(len(_status.STATUSES), 30)
        for name, value, msg, _cls in _status.STATUSES:
            with self.subTest(name=name):
                self.assertEqual(_lib.status_name(value), name)
                self.assertEqual(_lib.status_str(value), msg)
        self.assertNotIn(_lib.status_name(-1000), [s[0] for s in _status.STATUSES])

    def test_one_subclass_per_error_code(self):
        errors = [s for s in _status.STATUSES if s[1] < 0]
        classes = set()
        for name, value, msg, pyname in errors:
            with self.subTest(name=name):
                cls = getattr(kvpool, pyname)
                self.assertTrue(issubclass(cls, kvpool.Error))
                self.assertIsNot(cls, kvpool.Error)
                self.assertEqual((cls.status, cls.name), (value, name))
                self.assertIs(kvpool.error_for(value), cls)
                e = cls()
                self.assertEqual((e.status, e.name, str(e)), (value, name, msg))
                self.assertIn(pyname, kvpool.__all__)
                classes.add(cls)
        self.assertEqual(len(classes), len(errors))
        for pyname in ("NotFound", "NoSpace", "Timeout", "ConnLost", "BadUri", "KeyLength",
                       "ValueEmpty", "ValueTooLarge", "BufferTooSmall", "Closed"):
            self.assertTrue(issubclass(getattr(kvpool, pyname), kvpool.Error), pyname)

    def test_error_for_unknown_and_non_error_codes(self):
        self.assertIs(kvpool.error_for(-1000), kvpool.Error)
        e = kvpool.error_for(-1000)(status=-1000)
        self.assertEqual(e.status, -1000)
        for ok in (0, 1, 7):
            with self.assertRaises(ValueError):
                kvpool.error_for(ok)
        with self.assertRaises(kvpool.NoSpace):
            kvpool.errors.raise_for(-21)
        self.assertIsNone(kvpool.errors.raise_for(0))

    def import_error(self, **env):
        env = dict(os.environ, LD_LIBRARY_PATH="", PYTHONPATH=os.path.join(support.REPO, "python"),
                   **env)
        env = {k: v for k, v in env.items() if v is not None}
        r = subprocess.run([sys.executable, "-c", "import kvpool"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
        self.assertNotEqual(r.returncode, 0)
        err = r.stderr.decode()
        self.assertIn("ImportError: kvpool: cannot load libkvpool.so", err)
        return err

    def test_a_bad_kvpool_lib_is_an_import_error_naming_it(self):
        err = self.import_error(KVPOOL_LIB="/nonexistent/libkvpool.so")
        self.assertIn("$KVPOOL_LIB /nonexistent/libkvpool.so", err)
        self.assertNotIn("system loader", err)  # an explicit path is the only one tried

    def test_no_library_anywhere_is_an_import_error_naming_each_place(self):
        pkg = os.path.join(support.REPO, "python", "kvpool")
        if any(os.path.exists(os.path.join(pkg, n)) for n in ("libkvpool.so", "libkvpool.so.0")):
            self.skipTest("a libkvpool.so copy sits in %s, so the import finds one" % pkg)
        probe = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libkvpool.so.0')"],
                               env=dict(os.environ, LD_LIBRARY_PATH=""), stderr=subprocess.DEVNULL)
        if probe.returncode == 0:  # (asked in a fresh process: this one has it loaded)
            self.skipTest("the system loader finds an installed libkvpool.so.0")
        err = self.import_error(KVPOOL_LIB=None)
        self.assertIn("package copy %s/libkvpool.so.0: not installed" % pkg, err)
        self.assertIn("system loader libkvpool.so.0", err)
        self.assertIn("KVPOOL_LIB=", err)  # how to fix it

if __name__ == "__main__":
    unittest.main()
