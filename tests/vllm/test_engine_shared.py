"""Several vLLM engines, each in its own process, sharing one `kvpool server`
through KvpoolConnector (pool = kvpool://127.0.0.1:PORT): the second engine
gets hits for the first one's prompts; a kv_producer saves and a kv_consumer
only loads; the pool server killed between a hit and its load makes vLLM
recompute (same tokens, load errors counted, the engine keeps serving).

The engines are this file run with --engine SPEC (a JSON object): it builds
one engine, runs SPEC's actions and prints one JSON result line.  An engine
process ends right after its last generate: its saves reach the pool through
the connector's drain at shutdown/exit, which the next engine's hits prove.
"""
import json
import os
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_util as eu  # noqa: E402

HERE = os.path.abspath(__file__)


# ------------------------------------------------------------------ engine process

def engine_main(spec):
    import kvpool.vllm
    from kvpool.vllm import connector as kc
    t0 = time.time()
    llm = eu.make_llm(spec["model"], eu.connector_config(spec["role"], **spec["extra"]),
                      max_num_seqs=16)
    res = {"start_s": time.time() - t0, "runs": []}
    kill_pid = spec.get("kill_on_first_hit")
    if kill_pid:
        # The server dies right after the scheduler's first hit: the lookup
        # said yes, the load that follows cannot read the blocks.
        sched = llm.llm_engine.engine_core.engine_core.scheduler.get_kv_connector()
        orig = sched.get_num_new_matched_tokens

        def hook(request, num_computed):
            n, load_async = orig(request, num_computed)
            if n and not res.get("killed"):
                os.kill(kill_pid, signal.SIGKILL)
                res["killed"] = True
            return n, load_async
        sched.get_num_new_matched_tokens = hook
    for ps in spec["runs"]:
        res["runs"].append(eu.greedy(llm, ps))
    res["stats"] = kvpool.vllm.worker_stats()
    print("RESULT " + json.dumps(res), flush=True)


def run_engine(role, runs, pool, kill_on_first_hit=None, extra=None):
    spec = {"model": MODEL, "role": role, "runs": runs,
            "extra": dict({"pool": pool}, **(extra or {})),
            "kill_on_first_hit": kill_on_first_hit}
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    p = subprocess.run([sys.executable, "-u", HERE, "--engine", json.dumps(spec)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise AssertionError("engine process failed (rc %d):\n%s" % (p.returncode,
                                                                     p.stdout[-4000:]))
    res = json.loads(lines[-1][len("RESULT "):])
    res["output"] = p.stdout
    eu.log("engine %s: start %.1f s", role, res["start_s"])
    return res


# ------------------------------------------------------------------ tests

def setUpModule():
    global MODEL, SERVER
    MODEL = eu.write_model()
    SERVER = eu.Server(os.environ["KVPOOL_BIN"])


def tearDownModule():
    SERVER.stop()


def toks(run):
    return [t for t, _ in run]


def cached(run):
    return [c for _, c in run]


def hit(n):
    return (n - 1) // eu.BLOCK * eu.BLOCK


class TestShared(unittest.TestCase):
    def test_second_instance_hits_the_first_ones_saves(self):
        ps = eu.prompts(4, 300, seed=11)
        a = run_engine("kv_both", [ps], SERVER.uri)
        self.assertEqual(cached(a["runs"][0]), [0] * 4)
        b = run_engine("kv_both", [ps], SERVER.uri)
        self.assertEqual(toks(b["runs"][0]), toks(a["runs"][0]))
        self.assertEqual(cached(b["runs"][0]), [hit(300)] * 4)
        self.assertEqual(b["stats"]["blocks_loaded"], 4 * 9)
        self.assertEqual(b["stats"]["load_errors"], 0)

    def test_producer_saves_consumer_only_loads(self):
        ps = eu.prompts(3, 200, seed=12)
        fresh = eu.prompts(2, 200, seed=13)
        p = run_engine("kv_producer", [ps], SERVER.uri)
        self.assertEqual(p["stats"]["blocks_saved"], 3 * 6)
        c = run_engine("kv_consumer", [ps, fresh], SERVER.uri)
        self.assertEqual(toks(c["runs"][0]), toks(p["runs"][0]))
        self.assertEqual(cached(c["runs"][0]), [hit(200)] * 3)
        self.assertEqual(cached(c["runs"][1]), [0, 0])
        self.assertEqual(c["stats"]["blocks_saved"], 0)
        self.assertEqual(c["stats"]["blocks_loaded"], 3 * 6)
        # what the consumer computed was not saved: a producer misses it
        p2 = run_engine("kv_producer", [fresh], SERVER.uri)
        self.assertEqual(cached(p2["runs"][0]), [0, 0])
        self.assertEqual(toks(p2["runs"][0]), toks(c["runs"][1]))

    def test_unreachable_pool_engine_still_serves(self):
        ps = eu.prompts(2, 150, seed=16)
        r = run_engine("kv_both", [ps, ps], "kvpool://127.0.0.1:%d" % eu.free_port())
        self.assertEqual(toks(r["runs"][1]), toks(r["runs"][0]))
        self.assertEqual(r["output"].count("unreachable"), 1, "logged once")
        # the private stand-in pool still caches within the instance
        self.assertEqual(cached(r["runs"][1]), [hit(150)] * 2)

    def test_pool_killed_between_hit_and_load_recomputes(self):
        server = eu.Server(os.environ["KVPOOL_BIN"])
        try:
            ps = eu.prompts(3, 260, seed=14)
            ref = run_engine("kv_both", [ps], server.uri)
            after = eu.prompts(2, 100, seed=15)
            k = run_engine("kv_both", [ps, after], server.uri,
                           kill_on_first_hit=server.proc.pid, extra={"pool_timeout_ms": 2000})
            self.assertTrue(k.get("killed"))
            self.assertEqual(toks(k["runs"][0]), toks(ref["runs"][0]), "recomputed, same tokens")
            self.assertGreater(k["stats"]["load_errors"], 0)
            self.assertEqual(k["stats"]["blocks_loaded"], 0)
            self.assertEqual(len(k["runs"][1]), 2, "the engine kept serving")
        finally:
            server.stop()


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--engine":
        engine_main(json.loads(sys.argv[2]))
    else:
        unittest.main(verbosity=2)
