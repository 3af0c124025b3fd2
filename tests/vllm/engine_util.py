"""Shared pieces of the vLLM engine tests: a tiny random-weight Llama written
by the test itself, engines configured for this CPU, greedy generation, and
deterministic prompts.  Nothing here asserts; the test modules do.

The model: LlamaForCausalLM, hidden 256, 4 heads of 64, 2 KV heads, vocab
1000, load_format="dummy" (vLLM's seeded random weights, so two engines on
one config compute the same tokens).  The CPU backend needs block_size a
multiple of 32 and head_dim >= 32.
"""
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

BLOCK = 32


def write_model(layers=2, kv_heads=2, head_dim=64, heads=4, hidden=256, max_len=2048,
                dtype="float32", root=None):
    d = tempfile.mkdtemp(prefix="kvp-model-", dir=root)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": hidden, "intermediate_size": 2 * hidden,
           "num_attention_heads": heads, "head_dim": head_dim, "num_key_value_heads": kv_heads,
           "num_hidden_layers": layers, "vocab_size": 1000, "max_position_embeddings": max_len,
           "rms_norm_eps": 1e-5, "torch_dtype": dtype, "bos_token_id": 1, "eos_token_id": 2,
           "tie_word_embeddings": False}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def connector_config(role="kv_both", **extra):
    from vllm.config import KVTransferConfig
    return KVTransferConfig(kv_connector="KvpoolConnector", kv_connector_module_path="kvpool.vllm",
                            kv_role=role, kv_load_failure_policy="recompute",
                            kv_connector_extra_config=extra)


def make_llm(model, kv_transfer_config=None, max_model_len=2048, **kw):
    from vllm import LLM
    args = dict(model=model, load_format="dummy", skip_tokenizer_init=True, block_size=BLOCK,
                max_model_len=max_model_len, distributed_executor_backend="uni",
                enable_prefix_caching=False, dtype="float32", seed=0, enforce_eager=True,
                kv_transfer_config=kv_transfer_config)
    args.update(kw)
    return LLM(**args)


def prompts(n, length, seed):
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(length)] for _ in range(n)]


def greedy(llm, token_prompts, max_tokens=8):
    """[(output token ids, num_cached_tokens)] for each prompt, in order."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, detokenize=False,
                        ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in token_prompts], sp,
                        use_tqdm=False)
    return [(list(o.outputs[0].token_ids), o.num_cached_tokens or 0) for o in outs]


def drain(llm):
    """Saves done, and the engine told: the connector's workers drain, then
    the engine steps until the finished requests whose frees waited for
    their saves are freed (LLM.generate stops stepping at the last output)."""
    from kvpool.vllm import connector as kc
    for w in list(kc._WORKERS):
        assert w.drain(30), "saves did not drain"
    core = llm.llm_engine.engine_core.engine_core
    for _ in range(100):
        if not core.scheduler.has_finished_requests():
            return
        llm.llm_engine.step()
        time.sleep(0.005)
    raise AssertionError("finished requests never freed")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `kvpool server` on 127.0.0.1 (the C binary), stopped by stop()."""

    def __init__(self, kvpool_bin, memory="512MiB"):
        self.port = free_port()
        self.bin = kvpool_bin
        self.memory = memory
        self.proc = None
        self.start()

    @property
    def uri(self):
        return "kvpool://127.0.0.1:%d" % self.port

    def start(self):
        self.proc = subprocess.Popen([self.bin, "server", "--listen", "127.0.0.1:%d" % self.port,
                                      "--memory", self.memory, "--no-prefault",
                                      "--log-level", "warn"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("kvpool server exited: %s" % self.proc.stderr.read())
                time.sleep(0.05)
        raise RuntimeError("kvpool server did not listen on %d" % self.port)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def log(msg, *args):
    sys.stdout.write(("  " + msg + "\n") % args)
    sys.stdout.flush()
