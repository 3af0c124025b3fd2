"""KvpoolConnector inside one real vLLM engine (single-process mode, the
pool embedded in the worker), prefix caching off so that every hit comes from
kvpool.  One engine for the module; each test uses its own prompts.

Run: python tests/vllm/test_engine_local.py  (in the vLLM venv, with
KVPOOL_LIB and PYTHONPATH=python; tests/integration/test_vllm_engine.sh).
"""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_util as eu  # noqa: E402

import kvpool  # noqa: E402
import kvpool.hash  # noqa: E402
from kvpool.vllm import connector as kc  # noqa: E402

BATCH = 256  # max_num_batched_tokens: longer prompts are prefilled in chunks


def setUpModule():
    global LLM, MODEL, T_START
    t0 = time.time()
    MODEL = eu.write_model()
    LLM = eu.make_llm(MODEL, eu.connector_config(pool="embedded://?capacity=256MiB"),
                      max_num_batched_tokens=BATCH, max_num_seqs=16,
                      prefix_caching_hash_algo="sha256_cbor")
    T_START = time.time() - t0
    eu.log("engine start %.1f s", T_START)


def tearDownModule():
    global LLM
    del LLM


def workers():
    return [w for w in list(kc._WORKERS)]


def drain():
    eu.drain(LLM)


def wstats():
    return kvpool.vllm.worker_stats()


def engine_core():
    return LLM.llm_engine.engine_core.engine_core


def sched_connector():
    return engine_core().scheduler.get_kv_connector()


def expected_hit(n):
    """The last-token rule: whole blocks, at most align(n - 1)."""
    return (n - 1) // eu.BLOCK * eu.BLOCK


class TestLocal(unittest.TestCase):
    def test_repeat_loads_prefix_from_pool(self):
        ps = eu.prompts(4, 300, seed=1)
        cold = eu.greedy(LLM, ps)
        self.assertEqual([c for _, c in cold], [0] * 4)
        drain()
        before = wstats()
        self.assertGreaterEqual(before["blocks_saved"], 4 * 9)
        warm = eu.greedy(LLM, ps)
        after = wstats()
        self.assertEqual([t for t, _ in warm], [t for t, _ in cold])
        self.assertEqual([c for _, c in warm], [expected_hit(300)] * 4)
        self.assertEqual(after["blocks_loaded"] - before["blocks_loaded"], 4 * 9)
        self.assertEqual(after["load_errors"], before["load_errors"])

    def test_chunked_prefill_saves_every_chunk(self):
        # 700 tokens over 256-token steps: three chunks, each saved as it
        # completes blocks; the second run's hit covers every chunk.  (Here
        # every chunk brings new block ids, so this does not exercise the
        # K12 fix; tests/unit/test_kv_sched.c does.)
        ps = eu.prompts(2, 700, seed=2)
        cold = eu.greedy(LLM, ps)
        drain()
        warm = eu.greedy(LLM, ps)
        self.assertEqual([t for t, _ in warm], [t for t, _ in cold])
        self.assertEqual([c for _, c in warm], [expected_hit(700)] * 2)

    def test_corrupted_block_changes_output(self):
        # The keys are recomputed here from the tokens with kvpool.hash
        # (vLLM's sha256_cbor, PYTHONHASHSEED unset or fixed alike), which
        # also checks that the connector stores under the documented keys.
        p = eu.prompts(1, 320, seed=3)[0]
        ref = eu.greedy(LLM, [p], max_tokens=16)[0][0]
        drain()
        seed = os.environ.get("PYTHONHASHSEED")
        hashes = kvpool.hash.block_hashes("sha256_cbor", seed, eu.BLOCK, p)
        pool = workers()[0]._pool
        keys = [kvpool.hash.store_key(MODEL, h) for h in hashes]
        self.assertEqual(pool.prefix(keys), len(keys), "saved under the documented keys")
        for k in keys:
            buf = bytearray(pool.get(k))
            for i in range(0, len(buf), 7):
                buf[i] ^= 0x5A
            pool.remove(k)
            pool.put(k, bytes(buf))
        out, cached = eu.greedy(LLM, [p], max_tokens=16)[0]
        self.assertEqual(cached, expected_hit(320))
        self.assertNotEqual(out, ref, "corrupted KV must change the output")

    def test_abort_mid_load(self):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        ps = eu.prompts(3, 400, seed=4)
        cold = eu.greedy(LLM, ps)
        drain()
        eng = LLM.llm_engine
        sp = SamplingParams(max_tokens=8, temperature=0.0, detokenize=False, ignore_eos=True)
        for i, p in enumerate(ps):
            eng.add_request("abort-%d" % i, TokensPrompt(prompt_token_ids=p), sp)
        eng.step()  # lookups hit: the loads start (async), the requests wait for them
        eng.abort_request(["abort-0", "abort-2"])
        done = {}
        for _ in range(200):
            for o in eng.step():
                if o.finished:
                    done[o.request_id] = list(o.outputs[0].token_ids)
            if not eng.has_unfinished_requests():
                break
        self.assertEqual(done.get("abort-1"), cold[1][0])
        self.assertNotIn("abort-0", done)
        # Nothing leaks: the scheduler's tables and views empty out.
        for _ in range(5):
            eng.step()
        st = sched_connector().stats()
        self.assertEqual((st["views"], st["trackers"], st["load_specs"]), (0, 0, 0), st)
        again = eu.greedy(LLM, ps)
        self.assertEqual([t for t, _ in again], [t for t, _ in cold])

    def test_reset_cache_empties_pool(self):
        ps = eu.prompts(1, 200, seed=5)
        eu.greedy(LLM, ps)
        drain()
        self.assertTrue(LLM.reset_prefix_cache(reset_connector=True))
        _, cached = eu.greedy(LLM, ps)[0]
        self.assertEqual(cached, 0)

    def test_stats_through_vllm_hooks(self):
        # What the worker hands vLLM each step (get_kv_connector_stats): the
        # counters' deltas, which vLLM aggregates with the class's methods.
        w = workers()[0]
        seen = []
        orig = w.get_kv_connector_stats

        def spy():
            st = orig()
            if st is not None:
                seen.append(dict(st.data))
            return st
        w.get_kv_connector_stats = spy
        try:
            ps = eu.prompts(1, 200, seed=6)
            eu.greedy(LLM, ps)
            drain()
            eu.greedy(LLM, ps)
            drain()
        finally:
            del w.get_kv_connector_stats
        total = kc.KvpoolConnector.build_kv_connector_stats()
        for d in seen:
            total = total.aggregate(kc.KvpoolConnector.build_kv_connector_stats(d))
        red = total.reduce()
        self.assertEqual(red["blocks_saved"], 6)
        self.assertEqual(red["blocks_loaded"], 6)
        self.assertFalse(total.is_empty())
        self.assertTrue(kc.KvpoolConnector.build_kv_connector_stats().is_empty())


if __name__ == "__main__":
    unittest.main(verbosity=2)
