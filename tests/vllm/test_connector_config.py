"""KvpoolConnector's checks that need no engine: kv_connector_extra_config
parsing (defaults, wrong types, unknown keys), load_policy through the
scheduler's config, the vLLM version guard, the
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


class TestLoadPolicy(unittest.TestCase):
    """load_policy (rule F1, kv_sched.c): the extra-config keys, and their way
    into the C scheduler through kvpool.sched.Scheduler's config mapping."""

    def test_keys_taken_and_checked(self):
        c = kc.parse_extra_config({})
        self.assertEqual((c["load_policy"], c["prefill_us_per_token"], c["lookup_rtt_us"]),
                         (None, None, None))  # None: the C defaults (always, 40 us, 100 us)
        c = kc.parse_extra_config({"load_policy": "faster", "prefill_us_per_token": 25,
                                   "lookup_rtt_us": 50.5, "load_bytes_per_token": 131072,
                                   "load_bytes_per_s": 25e9})
        self.assertEqual((c["load_policy"], c["prefill_us_per_token"], c["lookup_rtt_us"],
                          c["load_bytes_per_token"], c["load_bytes_per_s"]),
                         ("faster", 25, 50.5, 131072, 25e9))
        for bad, key in (({"load_policy": "sometimes"}, "load_policy"),
                         ({"load_policy": 1}, "load_policy"),
                         ({"prefill_us_per_token": "40"}, "prefill_us_per_token"),
                         ({"lookup_rtt_us": -1.0}, "lookup_rtt_us"),
                         ({"load_bytes_per_s": float("nan")}, "load_bytes_per_s"),
                         ({"prefill_us_per_token": float("inf")}, "prefill_us_per_token"),
                         ({"load_bytes_per_token": -1}, "load_bytes_per_token")):
            with self.assertRaises(ValueError) as cm:
                kc.parse_extra_config(bad)
            self.assertIn(key, str(cm.exception))

    def test_f1_through_the_scheduler(self):
        from kvpool import kv
        from kvpool.sched import Scheduler

        class Req:  # the attributes of vLLM's Request the extension reads
            def __init__(self, rid):
                self.request_id, self.num_computed_tokens = rid, 0
                self.all_token_ids = list(range(100))
                self.num_tokens = len(self.all_token_ids)
                self.block_hashes = [bytes([i]) * 32 for i in range(6)]

        lookup = kv.CallbackLookup(lambda rid, n, hashes, non_block: 64)
        slow = dict(load_bytes_per_token=131072, load_bytes_per_s=1e9)  # 131 us/token > 40
        s = Scheduler(lookup, **slow)  # always: loads whatever it costs
        self.assertEqual(s.get_num_new_matched_tokens(Req("a"), 0), (64, True))
        self.assertEqual(s.stats()["loads_declined"], 0)
        s.close()
        s = Scheduler(lookup, load_policy="faster", **slow)
        self.assertEqual(s.get_num_new_matched_tokens(Req("b"), 0), (0, False))
        self.assertIsNone(s.load_spec("b"))
        self.assertEqual((s.stats()["loads_declined"], s.stats()["tokens_declined"]), (1, 64))
        s.set_load_bandwidth(50e9)  # 2.6 us/token: the load wins
        self.assertEqual(s.get_num_new_matched_tokens(Req("c"), 0), (64, True))
        with self.assertRaises(ValueError):
            s.set_load_bandwidth(-1.0)
        s.close()
        # the costs reach the C config: a prefill dearer than the slow link loads
        s = Scheduler(lookup, load_policy="faster", prefill_us_per_token=200.0, **slow)
        self.assertEqual(s.get_num_new_matched_tokens(Req("d"), 0), (64, True))
        s.close()
        # and a round trip dearer than the whole prefill declines even a fast load
        s = Scheduler(lookup, load_policy="faster", lookup_rtt_us=1e4,
                      load_bytes_per_token=131072, load_bytes_per_s=50e9)
        self.assertEqual(s.get_num_new_matched_tokens(Req("e"), 0), (0, False))
        s.close()
        with self.assertRaises(ValueError):  # the C validate: faster needs a prefill cost > 0
            Scheduler(lookup, load_policy="faster", prefill_us_per_token=0.0)
        with self.assertRaises(ValueError):
            Scheduler(lookup, load_policy="sometimes")


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
