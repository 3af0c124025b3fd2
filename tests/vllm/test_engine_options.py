"""KvpoolConnector's other modes in one real vLLM engine (single-process):
synchronous loads (load_async=False: the hit is loaded before the step's
forward pass), asynchronous lookups (lookup_async=True: the scheduler asks
again on a later step), and preemption (a KV cache of 48 blocks for four
requests that grow to 13 blocks each): every output equals the one computed
without the pool's help.
"""
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_util as eu  # noqa: E402

import kvpool.vllm  # noqa: E402

NUM_BLOCKS = 48


def setUpModule():
    global LLM, SEEN
    t0 = time.time()
    LLM = eu.make_llm(eu.write_model(),
                      eu.connector_config(pool="embedded://?capacity=128MiB", load_async=False,
                                          lookup_async=True),
                      max_num_seqs=8, num_gpu_blocks_override=NUM_BLOCKS, max_model_len=1024)
    eu.log("engine start %.1f s", time.time() - t0)
    # Every step's scheduler output, as the connector sees it.
    SEEN = {"preempted": 0, "none_answers": 0}
    conn = LLM.llm_engine.engine_core.engine_core.scheduler.get_kv_connector()
    build, matched = conn.build_connector_meta, conn.get_num_new_matched_tokens

    def spy_build(so):
        SEEN["preempted"] += len(so.preempted_req_ids or ())
        return build(so)

    def spy_matched(request, n):
        r = matched(request, n)
        SEEN["none_answers"] += r[0] is None
        return r
    conn.build_connector_meta, conn.get_num_new_matched_tokens = spy_build, spy_matched


def tearDownModule():
    global LLM
    del LLM


def settle():
    eu.drain(LLM)


def hit(n):
    return (n - 1) // eu.BLOCK * eu.BLOCK


class TestOptions(unittest.TestCase):
    def test_sync_load_and_async_lookup(self):
        ps = eu.prompts(2, 230, seed=31)
        before = dict(SEEN)
        cold = eu.greedy(LLM, ps)
        settle()
        s0 = kvpool.vllm.worker_stats()
        warm = eu.greedy(LLM, ps)
        s1 = kvpool.vllm.worker_stats()
        self.assertEqual([t for t, _ in warm], [t for t, _ in cold])
        self.assertEqual([c for _, c in warm], [hit(230)] * 2)
        self.assertEqual(s1["blocks_loaded"] - s0["blocks_loaded"], 2 * 7)
        self.assertGreater(SEEN["none_answers"], before["none_answers"], "async lookups retried")

    def test_preemption_same_tokens(self):
        # Four prompts of 300 tokens take 10 blocks each (40 of 48): all four
        # start; growing to 400 tokens they need 13 each (52): some must go.
        ps = eu.prompts(4, 300, seed=32)
        alone = [eu.greedy(LLM, [p], max_tokens=100)[0][0] for p in ps]  # one at a time: fits
        settle()
        before = SEEN["preempted"]
        together = eu.greedy(LLM, ps, max_tokens=100)
        self.assertGreater(SEEN["preempted"], before, "the small KV cache preempted requests")
        self.assertEqual([t for t, _ in together], alone)
        settle()
        st = LLM.llm_engine.engine_core.engine_core.scheduler.get_kv_connector().stats()
        self.assertEqual((st["views"], st["trackers"]), (0, 0), st)


if __name__ == "__main__":
    unittest.main(verbosity=2)
