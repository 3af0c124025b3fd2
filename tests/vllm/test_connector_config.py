"""KvpoolConnector's checks that need no engine: kv_connector_extra_config
parsing (defaults, wrong types, unknown keys), the vLLM version guard, the
metadata's pickling (multi-process mode ships it), the stats class."""
import importlib
import logging
import pickle
import sys
import unittest

import vllm

from kvpool.vllm import connector as kc


class TestExtraConfig(unittest.TestCase):
    def test_defaults(self):
        for empty in (None, {}):
            c = kc.parse_extra_config(empty)
            self.assertEqual(c["pool"], "embedded://")
            self.assertEqual((c["load_async"], c["lookup_async"], c["enable_lookup"]),
                             (True, False, True))
            self.assertEqual((c["lookup_rpc_port"], c["load_threads"]), (0, 2))

    def test_values_taken(self):
        c = kc.parse_extra_config({"pool": "kvpool://127.0.0.1:1", "load_async": False,
                                   "cache_prefix": "tenant-a", "load_threads": 1,
                                   "drain_timeout_s": 5})
        self.assertEqual((c["pool"], c["load_async"], c["cache_prefix"], c["load_threads"],
                          c["drain_timeout_s"]),
                         ("kvpool://127.0.0.1:1", False, "tenant-a", 1, 5))

    def test_malformed_is_a_clear_error(self):
        for bad, key in (({"load_async": "yes"}, "load_async"), ({"pool": 7}, "pool"),
                         ({"lookup_rpc_port": -1}, "lookup_rpc_port"),
                         ({"load_threads": True}, "load_threads"),
                         ({"drain_timeout_s": "10"}, "drain_timeout_s")):
            with self.assertRaises(ValueError) as cm:
                kc.parse_extra_config(bad)
            self.assertIn(key, str(cm.exception))
        with self.assertRaises(ValueError):
            kc.parse_extra_config(["pool"])

    def test_unknown_keys_logged_once(self):
        with self.assertLogs("kvpool.vllm", logging.WARNING) as cm:
            kc.parse_extra_config({"mooncake_protocol": "tcp"})
            kc.parse_extra_config({"mooncake_protocol": "tcp"})
        self.assertEqual(len(cm.records), 1)
        self.assertIn("mooncake_protocol", cm.output[0])


class TestVersionGuard(unittest.TestCase):
    def test_unsupported_vllm_refused_at_import(self):
        real = vllm.__version__
        saved = {k: v for k, v in sys.modules.items() if k.startswith("kvpool.vllm")}
        try:
            vllm.__version__ = "0.31.2"
            for k in saved:
                del sys.modules[k]
            with self.assertRaises(ImportError) as cm:
                importlib.import_module("kvpool.vllm")
            self.assertIn("0.32", str(cm.exception))
            self.assertIn("0.31.2", str(cm.exception))
        finally:
            vllm.__version__ = real
            sys.modules.update(saved)


class TestMetadataAndStats(unittest.TestCase):
    def test_metadata_pickles(self):
        m = kc.KvpoolConnectorMetadata(b"\x95\x01abc")
        self.assertEqual(pickle.loads(pickle.dumps(m)).data, b"\x95\x01abc")

    def test_stats_aggregate(self):
        a = kc.KvpoolConnector.build_kv_connector_stats({"blocks_loaded": 3, "bytes_loaded": 30})
        b = kc.KvpoolConnector.build_kv_connector_stats({"blocks_loaded": 2})
        r = a.aggregate(b).reduce()
        self.assertEqual((r["blocks_loaded"], r["bytes_loaded"], r["blocks_saved"]), (5, 30, 0))
        e = kc.KvpoolConnector.build_kv_connector_stats()
        self.assertTrue(e.is_empty())
        a.reset()
        self.assertTrue(a.is_empty())


class TestPromMetrics(unittest.TestCase):
    def test_counters_per_engine(self):
        import prometheus_client as pc
        reg = pc.CollectorRegistry()

        def bound(cls):
            return lambda *a, **kw: cls(*a, registry=reg, **kw)
        types = {pc.Gauge: bound(pc.Gauge), pc.Counter: bound(pc.Counter),
                 pc.Histogram: bound(pc.Histogram)}
        m = kc.KvpoolConnector.build_prom_metrics(
            type("C", (), {"kv_transfer_config": None})(), types, ["engine"], {0: ["0"], 1: ["1"]})
        m.observe({"blocks_loaded": 4, "bytes_loaded": 4096}, 0)
        m.observe({"blocks_loaded": 1}, 0)
        m.observe({"blocks_saved": 2}, 1)
        self.assertEqual(reg.get_sample_value("vllm:kvpool_blocks_loaded_total", {"engine": "0"}), 5)
        self.assertEqual(reg.get_sample_value("vllm:kvpool_bytes_loaded_total", {"engine": "0"}),
                         4096)
        self.assertEqual(reg.get_sample_value("vllm:kvpool_blocks_saved_total", {"engine": "1"}), 2)


class TestPoolBuffers(unittest.TestCase):
    """kvpool.Pool with the buffer kinds of this venv (torch, numpy)."""

    def test_torch_and_numpy_without_copies(self):
        import numpy
        import torch
        import kvpool
        with kvpool.Pool("embedded://?capacity=16MiB") as p:
            t = torch.arange(1 << 16, dtype=torch.int32)
            p.put("t", t)
            back = torch.empty_like(t)
            self.assertEqual(p.get_into("t", back), t.numel() * 4)
            self.assertTrue(torch.equal(back, t))
            a = numpy.zeros(t.numel(), numpy.int32)
            p.get_into("t", a)
            self.assertTrue((a == t.numpy()).all())
            with self.assertRaises(TypeError):
                p.get_into("t", torch.empty(10, 2)[:, 0])  # not contiguous
            with self.assertRaises(kvpool.BufferTooSmall):
                p.get_into("t", torch.empty(8, dtype=torch.int32))


if __name__ == "__main__":
    unittest.main(verbosity=2)
