"""kvpool.kv against the real library, over embedded:// pools: the metadata
codec, the pool lookup, the lookup server and ZeroMQ client (ipc and tcp),
and the worker saving and loading a paged KV cache in host memory (ctypes
buffers always; numpy arrays too when numpy is installed).  The struct
mirrors' layout is checked by test_pool.StructLayoutTest (it covers every
entry of _lib.STRUCTS, the kv_connector.h ones included).
"""
import ctypes
import os
import shutil
import tempfile
import time
import unittest

import support  # noqa: F401  (sets sys.path and KVPOOL_LIB)
import kvpool
from kvpool import kv
from kvpool.hash import store_key

try:
    import numpy
except ImportError:
    numpy = None

MODEL = "/models/test-model"
BS = 16  # block_size == hash_block_size: one hash per block


def hashes(seed, n):
    """n distinct 32-byte block hashes of family seed."""
    return [bytes((seed * 31 + i * 7 + k) & 0xFF for k in range(32)) for i in range(n)]


def save_meta(req_id, block_ids, hs, **kw):
    return kv.ReqMeta(req_id, token_len_chunk=BS * len(hs), block_ids=(list(block_ids),),
                      block_hashes=hs, can_save=True, is_last_chunk=True,
                      num_prompt_tokens=BS * len(hs), **kw)


def load_meta(req_id, block_ids, hs):
    n = BS * len(hs)
    return kv.ReqMeta(req_id, token_len_chunk=n, block_ids=(list(block_ids),), block_hashes=hs,
                      load_spec=kv.LoadSpec(0, n, True), num_prompt_tokens=n + 1)


def step(worker, reqs=(), finished=()):
    return worker.get_finished(kv.encode_meta(kv.Meta(requests=list(reqs))) if reqs else None,
                               set(finished))


def step_until(worker, req_id, which, meta=None, timeout=10.0):
    """get_finished until req_id is in done_sending (which=0) or done_recving (1)."""
    deadline = time.monotonic() + timeout
    seen = set()
    while time.monotonic() < deadline:
        out = worker.get_finished(meta, ())
        meta = None
        seen |= out[which]
        if req_id in seen:
            return seen
        time.sleep(0.01)
    raise AssertionError("%s never reported (saw %s)" % (req_id, seen))


class Cache:
    """A float32 C-contiguous paged KV cache of one layer: blocks-first
    [num_blocks, heads, BS, 2 * head_dim] or K/V-first [2, num_blocks, heads,
    BS, head_dim], in a numpy array or a ctypes buffer."""

    def __init__(self, num_blocks, kv_first=False, use_numpy=False, heads=2, head_dim=4):
        self.num_blocks, self.kv_first = num_blocks, kv_first
        self.shape = ((2, num_blocks, heads, BS, head_dim) if kv_first
                      else (num_blocks, heads, BS, 2 * head_dim))
        n = 1
        for d in self.shape:
            n *= d
        self.nbytes = n * 4
        if use_numpy:
            self.mem = numpy.zeros(self.shape, dtype=numpy.float32)
            self.addr = self.mem.ctypes.data
            self.stride = tuple(s // self.mem.itemsize for s in self.mem.strides)
        else:
            self.mem = (ctypes.c_uint8 * self.nbytes)()
            self.addr = ctypes.addressof(self.mem)
            s, st = 1, []
            for d in reversed(self.shape):
                st.append(s)
                s *= d
            self.stride = tuple(reversed(st))
        self.half = self.nbytes // (2 * num_blocks)  # K (or V) bytes of one block

    def desc(self):
        return kv.TensorDesc(self.addr, self.nbytes, 4, self.shape, self.stride)

    def fill(self, seed):
        pat = bytes((seed * 13 + i * 7 + (i >> 8)) & 0xFF for i in range(4093))
        data = (pat * (self.nbytes // len(pat) + 1))[:self.nbytes]
        ctypes.memmove(self.addr, data, self.nbytes)

    def block(self, b):
        """Block b's value bytes (K then V), by this file's own arithmetic."""
        if not self.kv_first:
            return ctypes.string_at(self.addr + b * 2 * self.half, 2 * self.half)
        return b"".join(ctypes.string_at(self.addr + (k * self.num_blocks + b) * self.half,
                                         self.half) for k in range(2))


class MetaCodecTest(unittest.TestCase):
    FULL = kv.Meta(
        unfinished_req_ids={"a", "b", "ключ"}, preempted_req_ids={"p"},
        requests=[
            kv.ReqMeta("r1", 48, ([1, 2, 3], [9]), hashes(1, 3), True, False,
                       kv.LoadSpec(16, 48, True), 50, [5, 6, 7], [(0, 3, 17), (1, 9, 33)]),
            kv.ReqMeta("r2", 0, (), [], False, True, None, 0, [], []),
            kv.ReqMeta("r3"),
        ])

    def test_encode_then_decode_gives_the_same_meta(self):
        self.assertEqual(kv.decode_meta(kv.encode_meta(self.FULL)), self.FULL)

    def test_none_and_empty_fields_round_trip_as_themselves(self):
        got = kv.decode_meta(kv.encode_meta(self.FULL)).requests
        self.assertEqual(got[1].token_ids, [])
        self.assertIsNone(got[2].token_ids)
        self.assertIsNone(got[2].is_last_chunk)
        self.assertIs(got[1].is_last_chunk, True)
        self.assertIs(got[0].is_last_chunk, False)
        self.assertIsNone(got[2].load_spec)
        self.assertEqual(got[2].block_ids, ())
        self.assertEqual(got[2].block_hashes, [])
        self.assertEqual(got[2].partial_tail_offloads, [])

    def test_empty_meta_round_trips(self):
        self.assertEqual(kv.decode_meta(kv.encode_meta(kv.Meta())), kv.Meta())

    def test_truncated_encoding_raises_decode(self):
        b = kv.encode_meta(self.FULL)
        for n in (0, 1, len(b) // 2, len(b) - 1):
            with self.assertRaises(kvpool.Decode, msg=n):
                kv.decode_meta(b[:n])

    def test_corrupted_encoding_raises_decode(self):
        b = bytearray(kv.encode_meta(self.FULL))
        b[0] = 0xC1  # a msgpack byte that is never valid
        with self.assertRaises(kvpool.Decode):
            kv.decode_meta(bytes(b))

    def test_other_version_is_refused(self):
        b = bytearray(kv.encode_meta(kv.Meta()))
        self.assertEqual(b[1], 1)  # [version, ...]
        b[1] = 2
        with self.assertRaises(kvpool.Version):
            kv.decode_meta(bytes(b))

    def test_wrong_types_raise_type_error(self):
        with self.assertRaises(TypeError):
            kv.encode_meta({"requests": []})
        with self.assertRaises(TypeError):
            kv.encode_meta(kv.Meta(requests=["r1"]))
        with self.assertRaises(TypeError):
            kv.encode_meta(kv.Meta(unfinished_req_ids="abc"))
        with self.assertRaises(TypeError):
            kv.encode_meta(kv.Meta(requests=[kv.ReqMeta("r", block_hashes="ab")]))
        with self.assertRaises(TypeError):
            kv.encode_meta(kv.Meta(requests=[kv.ReqMeta("r", can_save=1)]))
        with self.assertRaises(TypeError):
            kv.decode_meta("not bytes")

    def test_bad_values_raise_value_error(self):
        with self.assertRaises(ValueError):
            kv.encode_meta(kv.Meta(requests=[kv.ReqMeta("r", block_hashes=[b"a" * 32, b"b"])]))
        with self.assertRaises(ValueError):
            kv.encode_meta(kv.Meta(requests=[kv.ReqMeta("nul\0id")]))
        with self.assertRaises(ValueError):
            kv.encode_meta(kv.Meta(requests=[kv.ReqMeta("r", token_len_chunk=1 << 64)]))
        with self.assertRaises(ValueError):
            kv.encode_meta(kv.Meta(requests=[kv.ReqMeta("r", partial_tail_offloads=[(1, 2)])]))


class EndpointTest(unittest.TestCase):
    def test_ipc_endpoint_is_the_spec_format(self):
        self.assertEqual(kv.ipc_endpoint("/run/x", 5678, "node1", 3),
                         "ipc:///run/x/lookup_rpc_port_5678_host_node1_dp_rank3")

    def test_ipc_endpoint_defaults_to_this_host(self):
        self.assertEqual(kv.ipc_endpoint("/run/x", 1),
                         "ipc:///run/x/lookup_rpc_port_1_host_%s_dp_rank0" % os.uname().nodename)

    def test_ipc_endpoint_wrong_types(self):
        with self.assertRaises(TypeError):
            kv.ipc_endpoint(b"/run", 1)
        with self.assertRaises(ValueError):
            kv.ipc_endpoint("/run", -1)


class CacheGroupTest(unittest.TestCase):
    def test_kind_must_be_a_known_name(self):
        self.assertEqual(kv.CacheGroup("mamba", 32, mamba_align=True).kind, "mamba")
        with self.assertRaises(ValueError):
            kv.CacheGroup("attention", 16)
        with self.assertRaises(TypeError):
            kv.CacheGroup(0, 16)
        with self.assertRaises(TypeError):
            kv.CacheGroup("mla", "16")


class LookupPoolTest(unittest.TestCase):
    def setUp(self):
        self.pool = kvpool.Pool("embedded://?capacity=16MiB")
        self.lk = kv.LookupPool(self.pool, MODEL)
        self.hs = hashes(3, 4)

    def tearDown(self):
        self.lk.close()
        self.pool.close()

    def store(self, hs):
        for h in hs:
            self.pool.put(store_key(MODEL, h), b"v" * 64)

    def test_miss_then_hit_after_the_keys_are_stored(self):
        r = self.lk.query(80, self.hs)
        self.assertEqual((r.hit, r.reason), (0, "missing_block"))
        self.assertEqual((r.group_id, r.block_index), (0, 0))
        self.store(self.hs[:2])
        r = self.lk.query(80, self.hs)
        self.assertEqual((r.hit, r.reason), (32, "missing_block"))
        self.assertEqual(r.block_index, 2)
        self.store(self.hs[2:])
        self.assertEqual(self.lk.query(80, self.hs), (64, "none"))

    def test_a_hit_of_the_whole_prompt_is_cut_before_the_last_token(self):
        self.store(self.hs)
        self.assertEqual(self.lk.query(64, self.hs), (48, "capped_last_token"))

    def test_hashes_as_one_bytes_with_hash_len(self):
        self.store(self.hs)
        self.assertEqual(self.lk.query(80, b"".join(self.hs), hash_len=32), (64, "none"))
        with self.assertRaises(ValueError):
            self.lk.query(80, b"".join(self.hs))
        with self.assertRaises(ValueError):
            self.lk.query(80, b"x" * 33, hash_len=32)

    def test_no_hashes_is_its_own_reason(self):
        self.assertEqual(self.lk.query(80, []), (0, "no_hashes"))

    def test_stats_count_lookups_and_reasons(self):
        self.store(self.hs)
        self.lk.query(80, self.hs)
        self.lk.query(80, [])
        s = self.lk.stats()
        self.assertEqual(s["lookups"], 2)
        self.assertEqual(s["hit_tokens"], 64)
        self.assertEqual(s["queried_tokens"], 160)
        self.assertEqual(s["reasons"]["none"], 1)
        self.assertEqual(s["reasons"]["no_hashes"], 1)

    def test_reset_removes_everything(self):
        self.store(self.hs)
        self.assertTrue(self.lk.reset())
        self.assertEqual(self.pool.stats()["live"], 0)
        self.assertEqual(self.lk.query(80, self.hs).hit, 0)
        self.assertEqual(self.lk.stats()["resets"], 1)

    def test_groups_and_cache_prefix_go_into_the_keys(self):
        with kv.LookupPool(self.pool, MODEL, cache_prefix="pfx",
                           groups=[kv.CacheGroup("full_attention", 16)]) as lk:
            self.store(self.hs)
            self.assertEqual(lk.query(80, self.hs).hit, 0)
            for h in self.hs:
                self.pool.put(store_key(MODEL, h, cache_prefix="pfx"), b"v")
            self.assertEqual(lk.query(80, self.hs).hit, 64)

    def test_client_is_the_c_interface_struct(self):
        c = self.lk.client
        self.assertIsInstance(c, kvpool._lib.KvLookupClient)
        self.assertTrue(c.ops and c.ctx)
        self.assertNotEqual(ctypes.addressof(c), 0)

    def test_bad_config_raises_the_status_error(self):
        with self.assertRaises(kvpool.BadConfig):
            kv.LookupPool(self.pool, MODEL, tp_size=4, dcp_size=3)

    def test_wrong_types_raise_type_error(self):
        with self.assertRaises(TypeError):
            kv.LookupPool("embedded://", MODEL)
        with self.assertRaises(TypeError):
            kv.LookupPool(self.pool, MODEL, tp_size="2")
        with self.assertRaises(TypeError):
            kv.LookupPool(self.pool, MODEL, groups=[("full_attention", 16)])
        with self.assertRaises(TypeError):
            self.lk.query(80, "abcd")
        with self.assertRaises(TypeError):
            self.lk.query(80, [1, 2])
        with self.assertRaises(TypeError):
            self.lk.query("80", self.hs)
        with self.assertRaises(ValueError):
            self.lk.query(80, [b"a" * 32, b"b" * 16])
        with self.assertRaises(ValueError):
            kv.LookupPool(self.pool, MODEL, tp_size=0)

    def test_pool_close_is_refused_while_a_lookup_uses_it(self):
        with self.assertRaises(kvpool.Busy):
            self.pool.close()
        self.assertFalse(self.pool.closed)
        self.pool.put("still-open", b"x")
        self.lk.close()
        self.lk.close()  # idempotent

    def test_closed_lookup_raises_closed(self):
        self.lk.close()
        for call in (lambda: self.lk.query(80, self.hs), self.lk.stats, self.lk.reset,
                     lambda: self.lk.client):
            with self.assertRaises(kvpool.Closed):
                call()


class LookupServiceContract:
    """LookupServer + LookupClient over ENDPOINT (set in setUp)."""

    def setUp(self):
        self.pool = kvpool.Pool("embedded://?capacity=16MiB")
        self.lk = kv.LookupPool(self.pool, MODEL)
        self.hs = hashes(5, 4)
        for h in self.hs[:3]:
            self.pool.put(store_key(MODEL, h), b"v" * 64)
        self.want = [self.lk.query(n, self.hs).hit for n in (80, 64, 20, 8)]
        self.server = kv.LookupServer(self.endpoint(), self.lk)
        self.client = kv.LookupClient(self.server.endpoint)

    def tearDown(self):
        self.client.close()
        self.server.close()
        self.lk.close()
        self.pool.close()

    def test_client_hit_equals_the_pool_lookup(self):
        got = [self.client.query(n, self.hs) for n in (80, 64, 20, 8)]
        self.assertEqual(got, self.want)
        self.assertEqual(got[0], 48)
        self.assertEqual(self.client.query(80, b"".join(self.hs), hash_len=32), 48)

    def test_stats_counters_move(self):
        self.client.query(80, self.hs)
        self.client.query(64, self.hs)
        s = self.server.stats()
        self.assertEqual((s["requests"], s["lookups"], s["bad_frames"]), (2, 2, 0))
        c = self.client.stats()
        self.assertEqual((c["lookups"], c["errors"], c["inflight"]), (2, 0, 0))
        self.assertEqual(self.lk.stats()["lookups"], 4 + 2)

    def test_metrics_text_has_the_lookup_counters(self):
        self.client.query(80, self.hs)
        text = self.server.metrics()
        lines = [ln for ln in text.splitlines() if ln.startswith("kvpool_lookup_")]
        self.assertTrue(lines, text)
        self.assertIn("kvpool_lookup_server_lookups_total 1", lines)

    def test_reset_through_the_client_empties_the_pool(self):
        self.assertTrue(self.client.reset())
        self.assertEqual(self.pool.stats()["live"], 0)
        self.assertEqual(self.server.stats()["resets"], 1)
        self.assertEqual(self.client.query(80, self.hs), 0)

    def test_a_served_lookup_refuses_local_queries_and_close(self):
        with self.assertRaises(kvpool.Busy):
            self.lk.query(80, self.hs)
        with self.assertRaises(kvpool.Busy):
            self.lk.close()
        with self.assertRaises(kvpool.Busy):
            kv.LookupServer(self.endpoint(), self.lk)
        self.server.close()
        self.assertEqual(self.lk.query(80, self.hs).hit, self.want[0])

    def test_closed_server_and_client_raise_closed(self):
        self.server.close()
        self.server.close()
        self.client.close()
        self.client.close()
        for call in (self.server.stats, self.server.metrics, lambda: self.server.endpoint,
                     lambda: self.client.query(80, self.hs), self.client.stats):
            with self.assertRaises(kvpool.Closed):
                call()

    def test_wrong_types_raise_type_error(self):
        with self.assertRaises(TypeError):
            kv.LookupServer(self.endpoint(), self.pool)
        with self.assertRaises(TypeError):
            kv.LookupServer(self.endpoint(), self.lk, drain=self.lk)
        with self.assertRaises(TypeError):
            kv.LookupClient(b"tcp://127.0.0.1:1")
        with self.assertRaises(TypeError):
            kv.LookupClient(self.server.endpoint, send_eagle=1)
        with self.assertRaises(TypeError):
            self.client.query(80, "hashes")


class IpcLookupServiceTest(LookupServiceContract, unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kvp-kv.")
        super().setUp()

    def tearDown(self):
        super().tearDown()
        self.assertFalse(os.listdir(self.dir))  # the server unlinked its socket
        shutil.rmtree(self.dir)

    def endpoint(self):
        return kv.ipc_endpoint(self.dir, 1234, "h", 0)

    def test_endpoint_is_the_ipc_path(self):
        self.assertEqual(self.server.endpoint, self.endpoint())
        self.assertTrue(os.path.exists(self.endpoint()[len("ipc://"):]))


class TcpLookupServiceTest(LookupServiceContract, unittest.TestCase):
    def endpoint(self):
        return "tcp://127.0.0.1:0"

    def test_port_0_is_resolved(self):
        ep = self.server.endpoint
        self.assertTrue(ep.startswith("tcp://127.0.0.1:"), ep)
        self.assertNotEqual(ep, "tcp://127.0.0.1:0")


class LookupClientTimeoutTest(unittest.TestCase):
    def test_no_server_is_a_timeout(self):
        d = tempfile.mkdtemp(prefix="kvp-kv.")
        try:
            with kv.LookupClient("ipc://%s/none" % d, timeout_ms=200) as c:
                t = time.monotonic()
                with self.assertRaises(kvpool.Timeout):
                    c.query(32, hashes(1, 2))
                self.assertLess(time.monotonic() - t, 5)
                self.assertEqual(c.stats()["timeouts"], 1)
        finally:
            shutil.rmtree(d)


class WorkerContract:
    """The worker over host caches; USE_NUMPY picks the array kind."""

    USE_NUMPY = False

    def setUp(self):
        self.pool = kvpool.Pool("embedded://?capacity=32MiB")
        self.workers = []

    def tearDown(self):
        for w in self.workers:
            w.close()
        self.pool.close()

    def worker(self, **kw):
        w = kv.Worker(self.pool, MODEL, **kw)
        self.workers.append(w)
        return w

    def cache(self, kv_first=False, num_blocks=8):
        return Cache(num_blocks, kv_first=kv_first, use_numpy=self.USE_NUMPY)

    def save_then_load(self, kv_first):
        src = self.cache(kv_first)
        src.fill(7)
        ws = self.worker()
        ws.register([src.desc()], src.num_blocks)
        hs = hashes(11, 3)
        self.assertEqual(step(ws, [save_meta("save-1", [3, 5, 6], hs)]), (set(), set()))
        ws.drain()
        for h, b in zip(hs, (3, 5, 6)):
            self.assertEqual(self.pool.get(store_key(MODEL, h)), src.block(b))
        self.assertEqual(ws.stats()["blocks_saved"], 3)
        sending, _ = step(ws, finished={"save-1"})
        self.assertEqual(sending, {"save-1"})

        dst = self.cache(kv_first)
        wl = self.worker()
        wl.register([dst.desc()], dst.num_blocks)
        meta = kv.encode_meta(kv.Meta(requests=[load_meta("load-1", [7, 1, 2], hs)]))
        step_until(wl, "load-1", 1, meta)
        for sb, db in ((3, 7), (5, 1), (6, 2)):
            self.assertEqual(dst.block(db), src.block(sb))
        self.assertEqual(dst.block(0), bytes(len(dst.block(0))))
        self.assertEqual(wl.load_errors(), set())
        self.assertEqual(wl.stats()["blocks_loaded"], 3)

    def test_blocks_first_cache_saves_and_loads_the_same_bytes(self):
        self.save_then_load(kv_first=False)

    def test_kv_first_cache_saves_and_loads_the_same_bytes(self):
        self.save_then_load(kv_first=True)

    def test_a_load_of_missing_blocks_reports_them_as_load_errors(self):
        dst = self.cache()
        w = self.worker()
        w.register([dst.desc()], dst.num_blocks)
        meta = kv.encode_meta(kv.Meta(requests=[load_meta("miss-1", [4, 2], hashes(99, 2))]))
        step_until(w, "miss-1", 1, meta)
        self.assertEqual(w.load_errors(), {4, 2})
        self.assertEqual(w.load_errors(), set())  # cleared by the call
        self.assertEqual(w.stats()["load_errors"], 2)

    def test_saved_blocks_are_hits_for_the_lookup(self):
        src = self.cache()
        src.fill(3)
        w = self.worker()
        w.register([src.desc()], src.num_blocks)
        hs = hashes(21, 2)
        with kv.LookupPool(self.pool, MODEL) as lk:
            self.assertEqual(lk.query(40, hs), (0, "missing_block"))
            step(w, [save_meta("s", [0, 1], hs)])
            w.drain()
            self.assertEqual(lk.query(40, hs), (32, "none"))

    def test_reset_drains_the_worker_then_empties_the_pool(self):
        src = self.cache()
        src.fill(5)
        w = self.worker()
        w.register([src.desc()], src.num_blocks)
        step(w, [save_meta("s", [0, 1, 2], hashes(8, 3))])
        with kv.LookupPool(self.pool, MODEL) as lk:
            server = kv.LookupServer("tcp://127.0.0.1:0", lk, drain=w)
            with self.assertRaises(kvpool.Busy):
                w.close()
            with kv.LookupClient(server.endpoint) as c:
                self.assertTrue(c.reset())
            self.assertEqual(self.pool.stats()["live"], 0)
            self.assertEqual(w.stats()["save_queue_depth"], 0)
            server.close()

    def test_metrics_text_has_the_worker_counters(self):
        w = self.worker()
        self.assertIn("kvpool_kv_worker_", w.metrics())


class WorkerCtypesTest(WorkerContract, unittest.TestCase):
    def worker_registered(self):
        c = self.cache()
        w = self.worker()
        w.register([c.desc()], c.num_blocks)
        return w, c

    def test_bad_layout_raises_with_shapes_and_strides(self):
        c = self.cache()
        bad = kv.TensorDesc(c.addr, c.nbytes - 4, 4, c.shape, c.stride)  # not num_blocks pages
        w = self.worker()
        with self.assertRaises(kv.TensorLayoutError) as cm:
            w.register([c.desc(), bad], c.num_blocks)
        e = cm.exception
        self.assertIsInstance(e, ValueError)
        self.assertIsInstance(e, kvpool.InvalidArg)
        self.assertEqual(e.status, -1)
        msg = str(e)
        self.assertIn("shape %s stride %s" % (c.shape, c.stride), msg)
        self.assertIn("tensor 1", msg)
        self.assertIn("storage_bytes %d" % (c.nbytes - 4), msg)

    def test_view_leaving_its_storage_is_refused(self):
        c = self.cache()
        w = self.worker()
        with self.assertRaises(kv.TensorLayoutError):
            w.register([kv.TensorDesc(c.addr, c.nbytes // 2, 4, c.shape, c.stride)],
                       c.num_blocks // 2)

    def test_register_twice_is_a_state_error(self):
        w, c = self.worker_registered()
        with self.assertRaises(kvpool.State):
            w.register([c.desc()], c.num_blocks)

    def test_get_finished_before_register_is_a_state_error(self):
        w = self.worker()
        with self.assertRaises(kvpool.State):
            w.get_finished(None, ())

    def test_bad_meta_bytes_raise_decode(self):
        w, _c = self.worker_registered()
        with self.assertRaises(kvpool.Decode):
            w.get_finished(b"\x94\x01", ())
        self.assertEqual(w.get_finished(None, ()), (set(), set()))

    def test_torch_like_tensor_is_read_through_its_view(self):
        c = self.cache()

        class Storage:  # what torch's untyped_storage() answers
            def data_ptr(self):
                return c.addr

            def nbytes(self):
                return c.nbytes

        class TorchLike:  # the view's own span is the region (data_ptr on)
            shape = c.shape

            def untyped_storage(self):
                return Storage()

            def data_ptr(self):
                return c.addr

            def element_size(self):
                return 4

            def stride(self):
                return c.stride

        c.fill(9)
        w = self.worker()
        w.register([TorchLike()], c.num_blocks)
        hs = hashes(4, 1)
        step(w, [save_meta("t", [2], hs)])
        w.drain()
        self.assertEqual(self.pool.get(store_key(MODEL, hs[0])), c.block(2))

    def test_consumer_never_saves(self):
        c = self.cache()
        c.fill(1)
        w = self.worker(role="kv_consumer")
        w.register([c.desc()], c.num_blocks)
        step(w, [save_meta("s", [0], hashes(2, 1))])
        w.drain()
        self.assertEqual(self.pool.stats()["live"], 0)

    def test_pool_close_is_refused_while_a_worker_uses_it(self):
        w, _c = self.worker_registered()
        with self.assertRaises(kvpool.Busy):
            self.pool.close()
        w.close()
        w.close()

    def test_closed_worker_raises_closed(self):
        w, c = self.worker_registered()
        w.close()
        for call in (lambda: w.get_finished(None, ()), w.load_errors, w.drain, w.stats,
                     w.metrics, lambda: w.register([c.desc()], 8)):
            with self.assertRaises(kvpool.Closed):
                call()

    def test_wrong_types_raise_type_error(self):
        w, c = self.worker_registered()
        with self.assertRaises(TypeError):
            kv.Worker("pool", MODEL)
        with self.assertRaises(TypeError):
            kv.Worker(self.pool, None)
        with self.assertRaises(ValueError):
            kv.Worker(self.pool, MODEL, role="kv_everything")
        with self.assertRaises(TypeError):
            kv.Worker(self.pool, MODEL, load_threads=2.0)
        with self.assertRaises(TypeError):
            self.worker().register(c.desc(), 8)
        with self.assertRaises(TypeError):
            self.worker().register([object()], 8)
        with self.assertRaises(ValueError):
            self.worker().register([kv.TensorDesc(c.addr, c.nbytes, 4, (), ())], 8)
        with self.assertRaises(TypeError):
            w.get_finished(123, ())
        with self.assertRaises(TypeError):
            w.get_finished(None, "req-1")
        with self.assertRaises(TypeError):
            w.get_finished(None, [1])

    def test_bad_config_raises_the_status_error(self):
        with self.assertRaises(kvpool.BadConfig):
            kv.Worker(self.pool, MODEL, tp_rank=2, tp_size=2)


@unittest.skipUnless(numpy, "numpy is not installed")
class WorkerNumpyTest(WorkerContract, unittest.TestCase):
    USE_NUMPY = True

    def test_numpy_cache_is_registered_by_its_address(self):
        c = self.cache()
        c.mem[3] = 1.5
        w = self.worker()
        w.register([kv.TensorDesc(c.mem.ctypes.data, c.mem.nbytes, c.mem.itemsize, c.mem.shape,
                                  tuple(s // c.mem.itemsize for s in c.mem.strides))],
                   c.num_blocks)
        hs = hashes(6, 1)
        step(w, [save_meta("n", [3], hs)])
        w.drain()
        got = numpy.frombuffer(self.pool.get(store_key(MODEL, hs[0])), dtype=numpy.float32)
        self.assertTrue((got == 1.5).all())


if __name__ == "__main__":
    unittest.main()
