"""kvpool.Pool against the real library: one contract suite run against an
embedded:// pool and a kvpool:// server, plus what only one backend has.
Every buffer kind in and out, zero copies in Python, bad arguments, batch
results, closed pools, and the ctypes mirrors' layout against the C compiler.
"""
import array
import ctypes
import gc
import mmap
import os
import subprocess
import tempfile
import threading
import tracemalloc
import unittest

import support  # noqa: F401  (sets sys.path and KVPOOL_LIB)
import kvpool
from kvpool import _lib

try:
    import numpy
except ImportError:
    numpy = None
try:
    import torch
except ImportError:
    torch = None

MiB = 1 << 20


def pattern(n, seed=1):
    """n bytes that differ per seed and per position."""
    block = bytes((seed * 131 + i * 7) & 0xFF for i in range(251))
    return (block * (n // 251 + 1))[:n]


class StructLayoutTest(unittest.TestCase):
    def test_struct_layout_matches_c(self):
        cc = support.c_compiler()
        if cc is None:
            self.skipTest("no C compiler ($KVP_CC, cc) to compare the struct layouts with")
        lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "kvpool/pool.h"',
                 '#include "kvpool/hash.h"', '#include "kvpool/kv_connector.h"',
                 'int main(void) {']
        want = {}
        for cname, py in _lib.STRUCTS.items():
            lines.append('printf("%s %%zu\\n", sizeof(%s));' % (cname, cname))
            want[cname] = ctypes.sizeof(py)
            for f, _t in py._fields_:
                lines.append('printf("%s.%s %%zu\\n", offsetof(%s, %s));' % (cname, f, cname, f))
                want["%s.%s" % (cname, f)] = getattr(py, f).offset
        lines.append("return 0; }")
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(src, "w") as f:
                f.write("\n".join(lines))
            subprocess.run([cc, "-std=c11", "-I", os.path.join(support.REPO, "include"), src,
                            "-o", exe], check=True)
            out = subprocess.run([exe], check=True, stdout=subprocess.PIPE).stdout.decode()
        got = dict(line.split() for line in out.splitlines())
        self.assertEqual(len(got), len(want))
        for k, v in want.items():
            self.assertEqual(int(got[k]), v, k)


class PoolContract:
    """The Pool API; subclasses set URI (and may start a server)."""

    URI = None
    CAPACITY = None  # bytes the pool holds

    def setUp(self):
        self.pool = kvpool.Pool(self.URI)
        self.pool.remove_all()

    def tearDown(self):
        self.pool.close()

    # ------------------------------------------------------------ round trips
    def test_put_then_get_returns_the_same_bytes(self):
        v = pattern(3000)
        r = self.pool.put(b"k1", v)
        self.assertEqual((r.status, r.existed, r.size), (0, False, 3000))
        self.assertTrue(r.ok)
        self.assertIsNone(r.error)
        self.assertEqual(self.pool.get(b"k1"), v)

    def test_str_key_is_its_utf8_bytes(self):
        self.pool.put("ключ-🔑", b"v")
        self.assertEqual(self.pool.get("ключ-🔑".encode()), b"v")
        self.assertTrue(self.pool.exists("ключ-🔑".encode()))

    def test_put_of_an_existing_key_succeeds_existed_and_keeps_the_value(self):
        self.pool.put("k", b"first")
        r = self.pool.put("k", b"second value")
        self.assertTrue(r.ok)
        self.assertTrue(r.existed)
        self.assertEqual(self.pool.get("k"), b"first")

    def test_get_of_a_value_larger_than_the_first_guess(self):
        v = pattern(200 * 1024 + 3, seed=5)
        self.pool.put("big", v)
        self.assertEqual(self.pool.get("big"), v)

    def test_put_accepts_every_buffer_kind(self):
        v = pattern(4096, seed=9)
        kinds = {
            "bytes": v,
            "bytearray": bytearray(v),
            "memoryview": memoryview(v),
            "memoryview_slice": memoryview(b"xx" + v + b"yy")[2:-2],
            "array": array.array("B", v),
            "array_i32": array.array("i", v),  # read as its raw bytes
            "ctypes": (ctypes.c_char * len(v)).from_buffer_copy(v),
        }
        m = mmap.mmap(-1, len(v))
        m.write(v)
        kinds["mmap"] = m
        for name, obj in kinds.items():
            with self.subTest(kind=name):
                self.pool.put("put-" + name, obj)
                self.assertEqual(self.pool.get("put-" + name), v)
        m.close()

    def test_get_into_writes_every_writable_buffer_kind(self):
        v = pattern(4096, seed=3)
        self.pool.put("k", v)
        kinds = {
            "bytearray": bytearray(4096),
            "memoryview": memoryview(bytearray(4096)),
            "array": array.array("B", bytes(4096)),
            "array_i64": array.array("q", bytes(4096)),
            "ctypes": (ctypes.c_char * 4096)(),
            "mmap": mmap.mmap(-1, 4096),
        }
        for name, obj in kinds.items():
            with self.subTest(kind=name):
                self.assertEqual(self.pool.get_into("k", obj), 4096)
                self.assertEqual(memoryview(obj).tobytes(), v)
        kinds["mmap"].close()

    @unittest.skipIf(numpy is None, "numpy is not installed for this python3")
    def test_numpy_arrays_in_and_out(self):
        v = pattern(4096, seed=8)
        a = numpy.frombuffer(v, dtype=numpy.float32).reshape(32, 32).copy()
        self.pool.put("np", a)
        self.pool.put("np-ro", numpy.frombuffer(v, dtype=numpy.uint8))  # read-only is fine for put
        out = numpy.zeros((32, 32), dtype=numpy.float32)
        self.assertEqual(self.pool.get_into("np", out), 4096)
        self.assertEqual(out.tobytes(), a.tobytes())  # (the pattern holds NaNs)
        out16 = numpy.zeros((64, 32), dtype=numpy.float16)
        self.pool.get_into("np-ro", out16)
        self.assertEqual(out16.tobytes(), v)
        ro = numpy.zeros(4096, dtype=numpy.uint8)
        ro.flags.writeable = False
        with self.assertRaisesRegex(TypeError, "writable"):
            self.pool.get_into("np", ro)
        with self.assertRaisesRegex(TypeError, "contiguous"):
            self.pool.put("np-col", numpy.zeros((8, 8), dtype=numpy.uint8)[:, 1])
        with self.assertRaisesRegex(TypeError, "contiguous"):
            self.pool.get_into("np", numpy.zeros((64, 128), dtype=numpy.uint8)[:, ::2])
        self.assertFalse(self.pool.exists("np-col"))

    @unittest.skipIf(torch is None, "torch is not installed for this python3")
    def test_torch_cpu_tensors_in_and_out(self):
        v = pattern(4096, seed=12)
        t = torch.frombuffer(bytearray(v), dtype=torch.uint8).view(torch.float16)
        self.pool.put("torch", t)
        out = torch.zeros(2048, dtype=torch.float16)
        self.assertEqual(self.pool.get_into("torch", out), 4096)
        self.assertEqual(bytes(out.view(torch.uint8).numpy()), v)
        with self.assertRaisesRegex(TypeError, "contiguous"):
            self.pool.get_into("torch", torch.zeros(64, 128, dtype=torch.uint8)[:, ::2])

    def test_get_into_writes_the_callers_memory_in_place(self):
        """The bytes land in the object passed (a window of a larger buffer), not a copy."""
        v = pattern(1000, seed=4)
        self.pool.put("k", v)
        big = bytearray(b"\xee" * 3000)
        n = self.pool.get_into("k", memoryview(big)[1000:2000])
        self.assertEqual(n, 1000)
        self.assertEqual(bytes(big[1000:2000]), v)
        self.assertEqual(big[:1000], b"\xee" * 1000)
        self.assertEqual(big[2000:], b"\xee" * 1000)

    def test_put_and_get_into_copy_nothing_in_python(self):
        size = 4 * MiB
        v = bytearray(pattern(size, seed=6))  # (bytes(v) would copy a bytearray)
        dst = bytearray(size)
        gc.collect()
        tracemalloc.start()
        try:
            self.pool.put("big", v)
            self.pool.put_many(["big2"], [v])
            self.pool.get_into("big", dst)
            self.pool.get_many_into(["big2"], [dst])
            _cur, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertEqual(dst, v)
        self.assertLess(peak, size // 8, "Python allocated %d bytes for a %d-byte value" % (peak, size))

    def test_get_into_a_short_buffer_raises_buffer_too_small_with_the_size(self):
        self.pool.put("k", pattern(100))
        buf = bytearray(b"\x01" * 99)
        with self.assertRaises(kvpool.BufferTooSmall) as cm:
            self.pool.get_into("k", buf)
        self.assertEqual(cm.exception.size, 100)
        self.assertEqual(cm.exception.status, -6)
        self.assertIn("100", str(cm.exception))
        self.assertEqual(buf, b"\x01" * 99)  # nothing copied

    def test_get_of_a_missing_key_raises_not_found(self):
        with self.assertRaises(kvpool.NotFound) as cm:
            self.pool.get("nope")
        self.assertIsInstance(cm.exception, kvpool.Error)
        self.assertEqual((cm.exception.status, cm.exception.name), (-40, "KVP_ERR_NOT_FOUND"))
        with self.assertRaises(kvpool.NotFound):
            self.pool.get_into("nope", bytearray(10))

    # ------------------------------------------------------------ bad arguments
    def test_read_only_buffer_to_get_into_is_a_type_error(self):
        self.pool.put("k", b"abc")
        ro = mmap.mmap(-1, 16, prot=mmap.PROT_READ)
        for obj in (b"xxxxxxxx", memoryview(bytearray(8)).toreadonly(), ro):
            with self.subTest(obj=type(obj).__name__):
                with self.assertRaisesRegex(TypeError, "writable"):
                    self.pool.get_into("k", obj)
                with self.assertRaisesRegex(TypeError, "writable"):
                    self.pool.get_many_into(["k"], [obj])
        ro.close()

    def test_non_contiguous_buffers_are_type_errors(self):
        strided = memoryview(bytearray(64))[::2]
        with self.assertRaisesRegex(TypeError, "contiguous"):
            self.pool.put("k", strided)
        with self.assertRaisesRegex(TypeError, "contiguous"):
            self.pool.get_into("k", strided)
        self.assertFalse(self.pool.exists("k"))

    def test_wrong_types_are_type_errors(self):
        for key in (1, None, 2.5, ["k"], object()):
            with self.subTest(key=key):
                with self.assertRaises(TypeError):
                    self.pool.put(key, b"v")
                with self.assertRaises(TypeError):
                    self.pool.exists(key)
        for value in (1, None, "a str is not bytes", ["v"], object()):
            with self.subTest(value=value):
                with self.assertRaises(TypeError):
                    self.pool.put("k", value)
                with self.assertRaises(TypeError):
                    self.pool.get_into("k", value)
        with self.assertRaises(TypeError):
            self.pool.put_many("ab", [b"1", b"2"])  # one str is not a list of keys
        with self.assertRaises(TypeError):
            self.pool.exists_many(b"ab")
        with self.assertRaises(TypeError):
            kvpool.Pool(b"embedded://")
        self.assertEqual(self.pool.stats()["live"], 0)

    def test_batch_length_mismatch_is_a_value_error(self):
        with self.assertRaises(ValueError):
            self.pool.put_many(["a", "b"], [b"1"])
        with self.assertRaises(ValueError):
            self.pool.get_many_into(["a"], [bytearray(1), bytearray(1)])
        self.assertFalse(self.pool.exists("a"))

    def test_key_lengths_outside_1_to_512_raise_key_length(self):
        self.pool.put(b"k" * 512, b"v")
        self.assertEqual(self.pool.get(b"k" * 512), b"v")
        for key in (b"", "", b"k" * 513, b"k" * 100000):
            with self.subTest(n=len(key)):
                with self.assertRaises(kvpool.KeyLength):
                    self.pool.put(key, b"v")
                with self.assertRaises(kvpool.KeyLength):
                    self.pool.exists(key)
        with self.assertRaises(kvpool.KeyLength):  # fails the whole batch
            self.pool.put_many(["ok", b""], [b"1", b"2"])
        self.assertFalse(self.pool.exists("ok"))

    def test_empty_value_raises_value_empty(self):
        for v in (b"", bytearray(), memoryview(b"abc")[1:1]):
            with self.assertRaises(kvpool.ValueEmpty):
                self.pool.put("k", v)
        self.assertFalse(self.pool.exists("k"))

    def test_values_over_the_pool_or_256_mib_raise_value_too_large(self):
        over_pool = mmap.mmap(-1, self.CAPACITY + MiB)  # untouched pages: cheap
        over_max = mmap.mmap(-1, _lib.KVP_VALUE_MAX + 1)
        for m in (over_pool, over_max):
            with self.subTest(size=len(m)):
                with self.assertRaises(kvpool.ValueTooLarge):
                    self.pool.put("k", m)
        over_pool.close()
        over_max.close()
        self.assertFalse(self.pool.exists("k"))

    # ------------------------------------------------------------ batches
    def test_put_many_reports_existed_per_key(self):
        self.pool.put("b", b"old")
        res = self.pool.put_many(["a", "b", "c"], [b"1", b"new", bytearray(b"333")])
        self.assertEqual([(r.status, r.existed) for r in res], [(0, False), (0, True), (0, False)])
        self.assertEqual([r.size for r in res][0], 1)
        self.assertEqual(self.pool.get("b"), b"old")
        self.assertEqual(self.pool.get("c"), b"333")

    def test_duplicate_key_in_a_batch_fails_the_whole_batch(self):
        with self.assertRaises(kvpool.DuplicateKey):
            self.pool.put_many(["x", "y", "x"], [b"1", b"2", b"3"])
        self.assertEqual(self.pool.exists_many(["x", "y"]), [False, False])

    def test_get_many_into_gives_per_key_results(self):
        self.pool.put_many(["a", "b"], [pattern(10), pattern(50)])
        bufs = [bytearray(10), bytearray(10), bytearray(10)]
        res = self.pool.get_many_into(["a", "b", "missing"], bufs)
        self.assertEqual([r.status for r in res], [0, -6, -40])
        self.assertEqual(res[0].size, 10)
        self.assertEqual(res[1].size, 50)  # the size needed
        self.assertIsInstance(res[1].error, kvpool.BufferTooSmall)
        self.assertIsInstance(res[2].error, kvpool.NotFound)
        self.assertEqual(bytes(bufs[0]), pattern(10))
        self.assertEqual(bufs[1], bytearray(10))

    def test_exists_many_and_prefix(self):
        self.pool.put_many(["k0", "k1", "k3"], [b"0", b"1", b"3"])
        self.assertEqual(self.pool.exists_many(["k0", "k2", "k0", "k3"]), [True, False, True, True])
        self.assertEqual(self.pool.prefix(["k0", "k1", "k2", "k3"]), 2)
        self.assertEqual(self.pool.prefix(["k2", "k0"]), 0)
        self.assertEqual(self.pool.prefix(["k0", "k1"]), 2)
        self.assertEqual(self.pool.prefix([]), 0)
        self.assertEqual(self.pool.exists_many([]), [])
        self.assertTrue(self.pool.exists("k1"))
        self.assertFalse(self.pool.exists("k2"))

    def test_batch_over_65536_keys_raises_batch_too_large(self):
        keys = ["k%d" % i for i in range(_lib.KVP_BATCH_MAX + 1)]
        with self.assertRaises(kvpool.BatchTooLarge):
            self.pool.exists_many(keys)

    def test_remove_and_remove_all(self):
        self.pool.put_many(["a", "b", "c"], [b"1", b"2", b"3"])
        self.pool.remove("a")
        with self.assertRaises(kvpool.NotFound):
            self.pool.remove("a")
        res = self.pool.remove_many(["b", "zz"])
        self.assertEqual([r.status for r in res], [0, -40])
        self.assertEqual(self.pool.exists_many(["a", "b", "c"]), [False, False, True])
        self.assertEqual(self.pool.remove_all(), 1)
        self.assertEqual(self.pool.remove_all(), 0)

    def test_stats_count_what_happened(self):
        s0 = self.pool.stats()
        self.assertEqual(set(s0), set(_lib.STATS_FIELDS))
        self.assertLessEqual(s0["capacity_bytes"], self.CAPACITY)  # the arena, less a header
        self.assertGreater(s0["capacity_bytes"], self.CAPACITY - 4096)
        self.pool.put_many(["a", "b"], [b"12", b"345"])
        self.pool.put("a", b"x")
        self.pool.get("a")
        with self.assertRaises(kvpool.NotFound):
            self.pool.get("none")
        s = self.pool.stats()
        self.assertEqual(s["live"], 2)
        self.assertEqual(s["live_bytes"], 5)
        self.assertEqual(s["put_existed"] - s0["put_existed"], 1)
        self.assertGreaterEqual(s["get_hits"] - s0["get_hits"], 1)
        self.assertGreaterEqual(s["get_misses"] - s0["get_misses"], 1)

    def test_threads_share_one_pool(self):
        vals = {"t%d" % i: pattern(20000, seed=i) for i in range(8)}
        self.pool.put_many(list(vals), list(vals.values()))
        errors = []

        def reader(key):
            buf = bytearray(20000)
            for _ in range(50):
                self.pool.get_into(key, buf)
                if buf != vals[key]:
                    errors.append(key)

        ts = [threading.Thread(target=reader, args=(k,)) for k in vals]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])

    # ------------------------------------------------------------ closed pools
    def test_every_call_on_a_closed_pool_raises_closed(self):
        p = kvpool.Pool(self.URI)
        p.close()
        p.close()  # a second close is a no-op
        self.assertTrue(p.closed)
        calls = [
            lambda: p.put("k", b"v"), lambda: p.put_many(["k"], [b"v"]),
            lambda: p.get("k"), lambda: p.get_into("k", bytearray(1)),
            lambda: p.get_many_into(["k"], [bytearray(1)]), lambda: p.exists("k"),
            lambda: p.exists_many(["k"]), lambda: p.prefix(["k"]), lambda: p.remove("k"),
            lambda: p.remove_many(["k"]), lambda: p.remove_all(), lambda: p.stats(),
        ]
        for i, call in enumerate(calls):
            with self.subTest(call=i):
                with self.assertRaisesRegex(kvpool.Closed, "closed") as cm:
                    call()
                self.assertEqual(cm.exception.status, -43)
        with self.assertRaises(kvpool.Closed):
            with p:
                pass

    def test_context_manager_closes(self):
        with kvpool.Pool(self.URI) as p:
            p.put("cm", b"v")
            self.assertFalse(p.closed)
        self.assertTrue(p.closed)
        self.assertIn("closed", repr(p))
        with self.assertRaises(kvpool.Closed):
            p.exists("cm")


class EmbeddedPoolTest(PoolContract, unittest.TestCase):
    URI = "embedded://?capacity=16MiB"
    CAPACITY = 16 * MiB

    def test_bad_uris_raise_their_status(self):
        cases = {"foo://x": kvpool.BadUri, "embedded://?capacity=0": kvpool.BadOption,
                 "embedded://?bogus=1": kvpool.BadOption,
                 "embedded://?capacity=12XB": kvpool.BadSize}
        for uri, cls in cases.items():
            with self.subTest(uri=uri):
                with self.assertRaises(cls):
                    kvpool.Pool(uri)


class RemotePoolTest(PoolContract, unittest.TestCase):
    """The same contract against a `kvpool server` (a kvpool:// pool)."""

    CAPACITY = 64 * MiB

    @classmethod
    def setUpClass(cls):
        cls.server = support.Server(memory="64MiB")
        cls.URI = cls.server.uri

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_values_cross_to_the_cli_through_the_server(self):
        """Python puts, the `kvpool get` command (another process) reads the same bytes."""
        v = pattern(70000, seed=11)
        self.pool.put("shared", v)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "v")
            subprocess.run([support.KVP_BIN, "get", self.URI, "shared", out], check=True)
            with open(out, "rb") as f:
                self.assertEqual(f.read(), v)

    def test_unreachable_server_raises_conn_refused(self):
        port = int(self.URI.rsplit(":", 1)[1])
        s = support.Server(memory="1MiB")
        dead = s.uri
        s.stop()
        self.assertNotEqual(dead, "kvpool://127.0.0.1:%d" % port)
        with self.assertRaises(kvpool.ConnRefused) as cm:
            kvpool.Pool(dead)
        self.assertEqual(cm.exception.status, -62)


if __name__ == "__main__":
    unittest.main()
