"""Records the scheduler-side hook calls of a real vLLM 0.32 engine running
KvpoolConnector, for replays into other schedulers (sched_vs_vllm032.py, the
overhead bench bench/sched_overhead.py).

    python tests/vllm/sched_record.py OUT.pkl [--small]

(in the vLLM venv, PYTHONPATH=python, KVPOOL_LIB, HF_HUB_OFFLINE=1,
VLLM_CPU_KVCACHE_SPACE=1, VLLM_ENABLE_V1_MULTIPROCESSING=0,
VLLM_RPC_BASE_PATH; tests/integration/test_vllm_engine.sh runs it.)

How.  The engine runs in one process ("uni"), so the scheduler's connector
is a Python object here: its hooks are wrapped on the instance, and every
argument is snapshotted at call time into plain data, because vLLM mutates
the objects afterwards (a Request grows its tokens and hashes, the block
tables grow, and the SchedulerOutput's kv_connector_block_state is set to
None right after build_connector_meta; it also holds a resolver bound to the
live KV-cache manager, so copy.deepcopy of a SchedulerOutput would copy the
engine).  What is kept:
  - get_num_new_matched_tokens: the Request, num_computed_tokens, the answer,
    and the hit the real lookup gave (the C scheduler's LoadSpec for the
    request right after the call; no LoadSpec means the hit was at most
    num_computed_tokens, which both schedulers treat alike: recorded as 0);
  - update_state_after_alloc: the Request, the KVCacheBlocks' block ids,
    num_external_tokens;
  - build_connector_meta: the SchedulerOutput's fields the connectors read
    (finished/preempted ids, new requests, cached requests, scheduled token
    counts, kv_connector_block_state resolved for its req_ids), a snapshot of
    every live Request of the engine (what a scheduler reads from the Request
    objects it holds), and the metadata bytes KvpoolConnector sent;
  - request_finished(_all_groups): the Request, the block ids, the answer.
A Request snapshot: request_id, num_tokens, num_computed_tokens,
all_token_ids, block_hashes, num_prompt_tokens, prompt_token_ids.

Workloads (one engine, max_num_seqs 80, max_num_batched_tokens 512, prefix
caching off so every hit comes from the pool): prompts sharing two prefixes,
run twice (the second run hits); two prompts longer than the batch (chunked
prefill), run twice; and 72 concurrent requests, run twice (the bench's
steps with 64+ running).  --small: fewer and shorter requests (the ctest
entry), still all three kinds.
"""
import copy
import os
import pickle
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engine_util as eu  # noqa: E402

FORMAT = 1
BATCH = 512


def snap_request(r):
    return {"request_id": r.request_id, "num_tokens": r.num_tokens,
            "num_computed_tokens": r.num_computed_tokens,
            "all_token_ids": list(r.all_token_ids), "block_hashes": list(r.block_hashes),
            "num_prompt_tokens": r.num_prompt_tokens,
            "prompt_token_ids": list(r.prompt_token_ids or ())}


def _ids(block_ids):
    return None if block_ids is None else tuple(list(g) for g in block_ids)


def snap_output(so):
    cr = so.scheduled_cached_reqs
    bs = getattr(so, "kv_connector_block_state", None)
    state = None
    if bs is not None:
        state = {"req_ids": set(bs.req_ids),
                 "block_ids": {r: _ids(bs.get_block_ids(r)) for r in bs.req_ids},
                 "boundary_state_offloads": {k: list(v) for k, v in
                                             (bs.boundary_state_offloads or {}).items()}}
    return {
        "finished_req_ids": set(so.finished_req_ids),
        "preempted_req_ids": None if so.preempted_req_ids is None else set(so.preempted_req_ids),
        "new": [{"req_id": n.req_id, "num_computed_tokens": n.num_computed_tokens,
                 "block_ids": _ids(n.block_ids), "prompt_token_ids": list(n.prompt_token_ids),
                 "prefill_token_ids": None if n.prefill_token_ids is None
                 else list(n.prefill_token_ids)} for n in so.scheduled_new_reqs],
        "cached": {"req_ids": list(cr.req_ids), "resumed_req_ids": set(cr.resumed_req_ids),
                   "new_block_ids": [_ids(b) for b in cr.new_block_ids],
                   "num_computed_tokens": list(cr.num_computed_tokens),
                   "num_output_tokens": list(cr.num_output_tokens)},
        "num_scheduled_tokens": dict(so.num_scheduled_tokens),
        "block_state": state,
    }


class Recorder:
    """Wraps the hooks of the engine's scheduler connector (a KvpoolConnector)."""

    def __init__(self, llm):
        self.sched = llm.llm_engine.engine_core.engine_core.scheduler
        self.conn = self.sched.get_kv_connector()
        self.events = []
        self.step_label = None
        c = self.conn
        orig = {n: getattr(c, n) for n in ("get_num_new_matched_tokens",
                                           "update_state_after_alloc", "build_connector_meta",
                                           "request_finished", "request_finished_all_groups")}
        ev = self.events

        def gnnmt(request, num_computed_tokens):
            snap = snap_request(request)
            out = orig["get_num_new_matched_tokens"](request, num_computed_tokens)
            ls = c._sched.load_spec(request.request_id)
            hit = ls[1] if ls is not None and out[0] else 0
            ev.append(("gnnmt", snap, num_computed_tokens, tuple(out), hit))
            return out

        def alloc(request, blocks, num_external_tokens):
            ev.append(("alloc", snap_request(request), _ids(blocks.get_block_ids()),
                       num_external_tokens))
            return orig["update_state_after_alloc"](request, blocks, num_external_tokens)

        def build(so):
            live = [snap_request(r) for r in self.sched.requests.values()]
            snap = snap_output(so)
            meta = orig["build_connector_meta"](so)
            ev.append(("build", snap, live, meta.data, self.step_label))
            return meta

        def finished(name):
            def f(request, block_ids):
                snap = snap_request(request)
                ids = _ids(block_ids) if name.endswith("groups") else list(block_ids)
                out = orig[name](request, block_ids)
                ev.append(("finished", snap, name, ids, out[0]))
                return out
            return f

        c.get_num_new_matched_tokens = gnnmt
        c.update_state_after_alloc = alloc
        c.build_connector_meta = build
        c.request_finished = finished("request_finished")
        c.request_finished_all_groups = finished("request_finished_all_groups")


def portable_config(vllm_config):
    """The engine's VllmConfig without its forward context (the model's
    layers and the KV-cache tensors, gigabytes; no scheduler reads them)."""
    cfg = copy.copy(vllm_config)
    cfg.compilation_config = copy.copy(cfg.compilation_config)
    cfg.compilation_config.static_forward_context = {}
    return cfg


def workloads(small):
    rng = random.Random(7)
    tok = lambda n: [rng.randrange(3, 1000) for _ in range(n)]  # noqa: E731
    pre = [tok(200), tok(130)]
    shared = [pre[i % 2] + tok(40 + 23 * i) for i in range(4 if small else 6)]
    chunked = [tok(1100 if small else 1300) for _ in range(1 if small else 2)]
    # A 20-token prompt, then 64-token ones: each step's 512 tokens end 44
    # tokens into a prompt, whose last 20 tokens come next step without a new
    # block (K12's case: the seed never saves that prompt's second block).
    k12 = [tok(20)] + [tok(64) for _ in range(15 if small else 23)]
    batch = [tok(70 if small else 100) for _ in range(64 if small else 72)]
    return [("shared_prefixes", shared, 8), ("chunked_prefill", chunked, 4),
            ("k12_chunks", k12, 2), ("batch", batch, 8 if small else 32)]


def record(out_path, small=False):
    t0 = time.time()
    model = eu.write_model()
    extra = {"pool": "embedded://?capacity=256MiB"}
    llm = eu.make_llm(model, eu.connector_config(**extra), max_num_batched_tokens=BATCH,
                      max_num_seqs=80, prefix_caching_hash_algo="sha256_cbor")
    t_start = time.time() - t0
    rec = Recorder(llm)
    runs = []
    for name, ps, max_tokens in workloads(small):
        for run in ("cold", "warm"):
            rec.step_label = "%s/%s" % (name, run)
            outs = eu.greedy(llm, ps, max_tokens=max_tokens)
            eu.drain(llm)
            runs.append((rec.step_label, [c for _, c in outs]))
    core = llm.llm_engine.engine_core.engine_core
    data = {
        "format": FORMAT, "vllm_version": __import__("vllm").__version__,
        "vllm_config": portable_config(core.vllm_config),
        "kv_cache_config": core.scheduler.kv_cache_config,
        "model_config_json": open(os.path.join(model, "config.json")).read(),
        "events": rec.events, "runs": runs, "engine_start_s": t_start,
    }
    with open(out_path, "wb") as f:
        pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
    sizes = {k: len(pickle.dumps(data[k], protocol=pickle.HIGHEST_PROTOCOL))
             for k in ("vllm_config", "kv_cache_config", "events")}
    eu.log("pickled sizes %s", sizes)
    n = {k: sum(1 for e in rec.events if e[0] == k) for k in ("gnnmt", "alloc", "build",
                                                              "finished")}
    eu.log("recorded %s: %s; engine start %.1f s, total %.1f s", out_path, n, t_start,
           time.time() - t0)
    for label, cached in runs:
        eu.log("  %s: num_cached_tokens %s", label, sorted(set(cached)))
    return data


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 1:
        sys.exit("usage: sched_record.py OUT.pkl [--small]")
    record(args[0], small="--small" in sys.argv)
