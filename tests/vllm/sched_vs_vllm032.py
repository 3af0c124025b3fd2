"""vLLM 0.32's own MooncakeStoreScheduler against kvpool's C scheduler (through
KvpoolConnector), on hook calls recorded from a real vLLM 0.32 engine run
(sched_record.py).

    python tests/vllm/sched_vs_vllm032.py RECORDING.pkl

Both sides get the recorded calls in the recorded order, each on fresh
objects of vLLM's own classes rebuilt from the snapshots (Request,
KVCacheBlocks, NewRequestData, CachedRequestData, SchedulerOutput,
KVConnectorBlockState), with the hits the engine's real lookup gave:
  (a) MooncakeStoreScheduler(vllm_config, kv_cache_config) with the engine's
      config (the recorded one), its LookupKeyClient replaced by a stub that
      answers the recorded hit, and a stub BlockPool (touch/free_blocks over
      blocks[id]) for its pins;
  (b) KvpoolConnector (scheduler role) over kvpool.sched.Scheduler, its lookup
      a kvpool.kv.CallbackLookup answering the same hit.
Compared per call: get_num_new_matched_tokens (count, async flag); per
build_connector_meta the load plans (each ReqMeta with a load_spec: req id,
vllm/kvpool cached tokens, can_load, block ids), the save decisions (req
ids, token_len_chunk, block ids) and the unfinished/preempted ids; per
request_finished the delay-free answer.  Also checked: the replayed kvpool
side reproduces the metadata the engine's KvpoolConnector sent (decoded),
so the replay is faithful to the run.

Expected differences: 0.32's store scheduler is a newer design than the
seed (vLLM 0.27.1's), which the C scheduler reproduces (with the K12 fix on,
as KvpoolConnector runs it).  These are counted, every other difference is
a failure:

  kind              | seed rule (C scheduler)           | vLLM 0.32
  ------------------+-----------------------------------+---------------------------------
  delay_free        | K17: request_finished returns     | never delays a free
                    | True when the request saved       | (request_finished -> False); the
                    | blocks (freed after done_sending) | blocks of each store job are
                    |                                   | pinned instead (BlockPool.touch,
                    |                                   | released in update_connector_output)
  save_block_extent | a save's block ids: the tracker's | the core's current block table
                    | append-only table (what the       | (kv_connector_block_state), which
                    | scheduler was told so far)        | may hold blocks allocated a step
                    |                                   | ahead; the blocks holding the
                    |                                   | saved tokens must still be equal
  k13_save          | K13: a deferred load whose alloc  | dropped (no save without a load)
                    | reported 0 external tokens saves  |
                    | floor(kvpool_cached/bs)*bs tokens |
  k12               | K12 quirk: a chunk with no new    | fixed; KvpoolConnector runs the C
                    | block ids is not saved            | scheduler with the fix on, so no
                    |                                   | difference may show (counted as a
                    |                                   | failure if one does)
Not compared (0.32 only): store_job_id and the pins themselves (counted),
boundary puts / partial tails (Mamba and partial hits; not in these runs),
token_ids (KV events, off).

Exit status 0 when the two agree up to the expected differences; the counts
are printed.  replay() is also the overhead bench's engine
(bench/sched_overhead.py): it times each side's hook calls only.
"""
import collections
import os
import pickle
import sys
import tempfile
import time

FAIL_SHOW = 12


def load(path):
    with open(path, "rb") as f:
        rec = pickle.load(f)
    if rec.get("format") != 1:
        raise SystemExit("%s: unknown recording format %r" % (path, rec.get("format")))
    return rec


# ------------------------------------------------------------- vLLM objects again

class Rebuilder:
    """One side's live vLLM Request objects, kept in step with the snapshots
    (mutated in place, as the engine does, since the schedulers keep them)."""

    def __init__(self):
        from vllm import SamplingParams
        self._sp = SamplingParams(max_tokens=1 << 20, temperature=0.0, detokenize=False)
        self.reqs = {}

    def request(self, s):
        from vllm.v1.request import Request
        r = self.reqs.get(s["request_id"])
        if r is None:
            r = Request(s["request_id"], list(s["prompt_token_ids"]), self._sp, None)
            self.reqs[s["request_id"]] = r
        want, have = s["all_token_ids"], r._all_token_ids
        if len(want) != len(have) or (have and have[-1] != want[len(have) - 1]):
            n = r.num_prompt_tokens
            del have[n:]
            del r._output_token_ids[:]
            have.extend(want[n:])
            r._output_token_ids.extend(want[n:])
        r.num_computed_tokens = s["num_computed_tokens"]
        bh = s["block_hashes"]
        if len(bh) != len(r.block_hashes):
            del r.block_hashes[:]
            r.block_hashes.extend(bh)
        return r

    def drop(self, req_ids):
        for rid in req_ids:
            self.reqs.pop(rid, None)


def kv_blocks(block_ids):
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    return KVCacheBlocks(tuple([KVCacheBlock(b) for b in g] for g in block_ids))


def _copy_ids(ids):
    return None if ids is None else tuple(list(g) for g in ids)


def scheduler_output(s, reb):
    from vllm.v1.core.sched.output import (CachedRequestData, KVConnectorBlockState,
                                           NewRequestData, SchedulerOutput)
    so = SchedulerOutput.make_empty()
    so.finished_req_ids = set(s["finished_req_ids"])
    so.preempted_req_ids = None if s["preempted_req_ids"] is None else set(s["preempted_req_ids"])
    so.scheduled_new_reqs = [
        NewRequestData(req_id=n["req_id"], prompt_token_ids=list(n["prompt_token_ids"]),
                       mm_features=[], sampling_params=reb._sp, pooling_params=None,
                       block_ids=_copy_ids(n["block_ids"]),
                       num_computed_tokens=n["num_computed_tokens"], lora_request=None,
                       prefill_token_ids=n["prefill_token_ids"])
        for n in s["new"]]
    c = s["cached"]
    so.scheduled_cached_reqs = CachedRequestData(
        req_ids=list(c["req_ids"]), resumed_req_ids=set(c["resumed_req_ids"]), new_token_ids=[],
        all_token_ids={}, new_block_ids=[_copy_ids(b) for b in c["new_block_ids"]],
        num_computed_tokens=list(c["num_computed_tokens"]),
        num_output_tokens=list(c["num_output_tokens"]))
    so.num_scheduled_tokens = dict(s["num_scheduled_tokens"])
    so.total_num_scheduled_tokens = sum(so.num_scheduled_tokens.values())
    bs = s["block_state"]
    if bs is not None:
        ids = bs["block_ids"]
        so.kv_connector_block_state = KVConnectorBlockState(
            req_ids=set(bs["req_ids"]), resolve_block_ids=lambda r: _copy_ids(ids[r]),
            boundary_state_offloads=dict(bs["boundary_state_offloads"]))
    return so


# ------------------------------------------------------------- the two sides

class Hit:
    """The recorded hit of the call being replayed, for the stub lookups."""
    value = 0
    calls = 0


class _MooncakeLookupStub:
    def __init__(self, hit):
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.data import (
            MooncakeLookupResult)
        self._result, self._hit = MooncakeLookupResult, hit

    def lookup(self, req_id, num_tokens, block_hashes, non_block=False):
        self._hit.calls += 1
        return self._result(self._hit.value)

    def discard(self, req_id):
        return None

    def reset(self):
        return True


class _BlockPoolStub:
    """What MooncakeStoreScheduler's pins use of vLLM's BlockPool."""

    def __init__(self, num_blocks):
        from vllm.v1.core.kv_cache_utils import KVCacheBlock
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.touches = 0

    def touch(self, blocks):
        for b in blocks:
            b.ref_cnt += 1
            self.touches += 1

    def free_blocks(self, blocks):
        for b in blocks:
            b.ref_cnt -= 1


class MooncakeSide:
    name = "vllm032"

    def __init__(self, vllm_config, kv_cache_config):
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import (
            MooncakeStoreConnector)
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.scheduler import (
            MooncakeStoreScheduler)
        self.hit = Hit()
        self.s = MooncakeStoreScheduler(vllm_config, kv_cache_config)
        real = self.s.client
        real.socket.close(linger=0)
        real.executor.shutdown(wait=False)
        self.s.client = _MooncakeLookupStub(self.hit)
        self.pool = _BlockPoolStub(kv_cache_config.num_blocks)
        self.s.bind_gpu_block_pool(self.pool)
        # The 0.32 connector's own rule (it answers without its scheduler).
        self._finished = MooncakeStoreConnector.request_finished_all_groups
        self.block_size = self.s._block_size
        self.gnnmt = self.s.get_num_new_matched_tokens
        self.alloc = self.s.update_state_after_alloc
        self.build = self.s.build_connector_meta

    def finished(self, request, name, block_ids):
        ids = block_ids if name.endswith("groups") else (block_ids,)
        return self._finished(None, request, ids)[0]

    @staticmethod
    def plan(meta):
        return normalize(meta.requests, meta.unfinished_request_ids, meta.preempted_req_ids)

    def close(self):
        pass


class KvpoolSide:
    name = "kvpool"

    def __init__(self, vllm_config, kv_cache_config, seed_k12=False):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        from kvpool import kv
        from kvpool.vllm import connector as kc
        self.hit = Hit()
        hit = self.hit

        def lookup(req_id, num_tokens, hashes, non_block):
            hit.calls += 1
            return hit.value
        self.lookup = kv.CallbackLookup(lookup)
        real, fixes = kc._kv.LookupClient, dict(kc.QUIRK_FIXES)
        kc._kv.LookupClient = lambda endpoint, **kw: self.lookup
        if seed_k12:
            kc.QUIRK_FIXES["fix_k12_save_without_new_blocks"] = False
        try:
            self.c = kc.KvpoolConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
        finally:
            kc._kv.LookupClient = real
            kc.QUIRK_FIXES.clear()
            kc.QUIRK_FIXES.update(fixes)
        self.block_size = self.c._shape["block_size"]
        self.gnnmt = self.c.get_num_new_matched_tokens
        self.alloc = self.c.update_state_after_alloc
        self.build = self.c.build_connector_meta
        self._decode = kv.decode_meta

    def finished(self, request, name, block_ids):
        return getattr(self.c, name)(request, block_ids)[0]

    def plan(self, meta):
        m = self._decode(meta.data if hasattr(meta, "data") else meta)
        return normalize(m.requests, m.unfinished_req_ids, m.preempted_req_ids)

    def close(self):
        self.c._client = None  # the CallbackLookup (no close); shutdown closes the rest
        self.c.shutdown()


def normalize(requests, unfinished, preempted):
    loads, saves = {}, {}
    for m in requests:
        ls = m.load_spec
        if ls is not None:
            loads[m.req_id] = (ls.vllm_cached_tokens, ls.kvpool_cached_tokens, bool(ls.can_load),
                               _copy_ids(m.block_ids))
        if m.can_save:
            saves[m.req_id] = (m.token_len_chunk, _copy_ids(m.block_ids))
    return {"loads": loads, "saves": saves, "unfinished": set(unfinished or ()),
            "preempted": set(preempted or ())}


# ------------------------------------------------------------- replay and compare

class Result:
    def __init__(self, seed_k12=False):
        self.seed_k12 = seed_k12
        self.counts = collections.Counter()
        self.expected = collections.Counter()
        self.failures = []
        # per step: (scheduled requests, workload label, (kvpool ns, vllm032 ns),
        # new requests)
        self.steps = []

    def fail(self, msg):
        self.failures.append(msg)


def _covered(ids, tokens, bs):
    n = tokens // bs
    return tuple(list(g[:n]) for g in ids)


def compare_plans(res, step, k, m, bs, deferred_zero, no_new_blocks):
    """k: the kvpool side's plan, m: vLLM 0.32's.  deferred_zero: requests
    in K13's case this step; no_new_blocks: cached requests scheduled with no
    new block ids (K12's case, a difference only with the quirk kept)."""
    res.counts["load plans compared"] += len(set(k["loads"]) | set(m["loads"]))
    for rid in sorted(set(k["loads"]) | set(m["loads"])):
        if k["loads"].get(rid) != m["loads"].get(rid):
            res.fail("step %d %s load plan: kvpool %s, vllm032 %s"
                     % (step, rid, k["loads"].get(rid), m["loads"].get(rid)))
    res.counts["save decisions compared"] += len(set(k["saves"]) | set(m["saves"]))
    for rid in sorted(set(k["saves"]) | set(m["saves"])):
        ks, ms = k["saves"].get(rid), m["saves"].get(rid)
        if ks == ms:
            continue
        if ks is not None and ms is None and rid in deferred_zero:
            res.expected["k13_save"] += 1
        elif ks is None and ms is not None and rid in no_new_blocks and res.seed_k12:
            res.expected["k12"] += 1
        elif (ks is not None and ms is not None and ks[0] == ms[0]
              and _covered(ks[1], ks[0], bs) == _covered(ms[1], ms[0], bs)):
            res.expected["save_block_extent"] += 1
        else:
            res.fail("step %d %s save: kvpool %s, vllm032 %s" % (step, rid, ks, ms))
    for what in ("unfinished", "preempted"):
        if k[what] != m[what]:
            res.fail("step %d %s ids: kvpool %s, vllm032 %s"
                     % (step, what, sorted(k[what]), sorted(m[what])))


def replay(rec, compare=True, seed_k12=False):
    """Replays the recording into both sides; returns a Result (timings of
    the hook calls per step, and the comparison when compare).  seed_k12:
    the C scheduler keeps the seed's K12 quirk (the negative control: its
    differences must show, and nothing else)."""
    if "VLLM_RPC_BASE_PATH" not in os.environ:  # (made once, only when none is given)
        os.environ["VLLM_RPC_BASE_PATH"] = tempfile.mkdtemp(prefix="kvp-replay-")
    vcfg, kcfg = rec["vllm_config"], rec["kv_cache_config"]
    sides = [KvpoolSide(vcfg, kcfg, seed_k12), MooncakeSide(vcfg, kcfg)]
    kside, mside = sides
    rebs = [Rebuilder(), Rebuilder()]
    res = Result(seed_k12)
    ns = [0, 0]
    clock = time.perf_counter_ns
    deferred = {}  # req id -> whether its alloc reported 0 external tokens (K13's case)
    step = 0
    try:
        for ev in rec["events"]:
            kind = ev[0]
            if kind == "gnnmt":
                _, snap, ncomp, out, hit = ev
                got = []
                for i, side in enumerate(sides):
                    r = rebs[i].request(snap)
                    side.hit.value = hit
                    t = clock()
                    a = side.gnnmt(r, ncomp)
                    ns[i] += clock() - t
                    got.append(tuple(a))
                res.counts["hits compared"] += 1
                if compare:
                    if got[0] != tuple(out):
                        res.fail("gnnmt %s: replayed kvpool %s, engine run %s"
                                 % (snap["request_id"], got[0], out))
                    if got[0] != got[1]:
                        res.fail("gnnmt %s (hit %d, computed %d): kvpool %s, vllm032 %s"
                                 % (snap["request_id"], hit, ncomp, got[0], got[1]))
            elif kind == "alloc":
                _, snap, ids, next_ = ev
                deferred[snap["request_id"]] = next_ == 0
                for i, side in enumerate(sides):
                    r = rebs[i].request(snap)
                    blocks = kv_blocks(ids)
                    t = clock()
                    side.alloc(r, blocks, next_)
                    ns[i] += clock() - t
                res.counts["allocs"] += 1
            elif kind == "finished":
                _, snap, name, ids, out = ev
                got = []
                for i, side in enumerate(sides):
                    r = rebs[i].request(snap)
                    arg = _copy_ids(ids) if name.endswith("groups") else list(ids)
                    t = clock()
                    got.append(bool(side.finished(r, name, arg)))
                    ns[i] += clock() - t
                res.counts["request_finished compared"] += 1
                if compare:
                    if got[0] != bool(out):
                        res.fail("request_finished %s: replayed kvpool %s, engine run %s"
                                 % (snap["request_id"], got[0], out))
                    if got[0] and not got[1]:
                        res.expected["delay_free"] += 1
                    elif got[0] != got[1]:
                        res.fail("request_finished %s: kvpool %s, vllm032 %s"
                                 % (snap["request_id"], got[0], got[1]))
            elif kind == "build":
                _, snap, live, data, label = ev
                metas = []
                for i, side in enumerate(sides):
                    for s in live:
                        rebs[i].request(s)
                    so = scheduler_output(snap, rebs[i])
                    t = clock()
                    metas.append(side.build(so))
                    ns[i] += clock() - t
                res.steps.append((len(snap["num_scheduled_tokens"]), label, tuple(ns),
                                  len(snap["new"])))
                ns = [0, 0]
                if compare:
                    k, m = kside.plan(metas[0]), mside.plan(metas[1])
                    if seed_k12:
                        pass  # the engine ran with the fix on
                    elif k != kside.plan(data):
                        res.fail("step %d: the replayed kvpool metadata differs from the "
                                 "engine run's" % step)
                    else:
                        res.counts["steps reproducing the engine's metadata"] += 1
                    c = snap["cached"]
                    compare_plans(res, step, k, m, kside.block_size,
                                  {r for r, z in deferred.items()
                                   if z and r not in snap["num_scheduled_tokens"]},
                                  {r for r, b in zip(c["req_ids"], c["new_block_ids"])
                                   if not b or not any(b)})
                for rb in rebs:
                    rb.drop(snap["finished_req_ids"])
                for rid in snap["finished_req_ids"]:
                    deferred.pop(rid, None)
                step += 1
                res.counts["steps"] += 1
            res.counts["hooks"] += 1
    finally:
        for side in sides:
            side.close()
    res.counts["lookups asked (kvpool, vllm032)"] = (kside.hit.calls, mside.hit.calls)
    res.counts["0.32 store jobs pinned"] = mside.s._next_store_job_id
    res.counts["0.32 block references taken"] = mside.pool.touches
    return res


def report(title, res):
    print("  %s:" % title)
    for k, v in res.counts.items():
        print("    %s: %s" % (k, v))
    for kind in ("delay_free", "save_block_extent", "k13_save", "k12"):
        print("    expected difference %s: %d" % (kind, res.expected[kind]))
    for f in res.failures[:FAIL_SHOW]:
        print("    unexpected: " + f)
    if len(res.failures) > FAIL_SHOW:
        print("    ... %d more" % (len(res.failures) - FAIL_SHOW))


def main(argv):
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1])
        return 2
    rec = load(argv[1])
    t0 = time.time()
    res = replay(rec)
    # The negative control: with the seed's K12 quirk kept, the comparison
    # must see K12's lost saves (the recording has that case) and only them.
    ctl = replay(rec, seed_k12=True)
    print("sched_vs_vllm032: %s (vLLM %s), %.1f s" % (argv[1], rec["vllm_version"],
                                                       time.time() - t0))
    report("kvpool as KvpoolConnector runs it (K12 fix on) vs vLLM 0.32", res)
    report("control: kvpool with the seed's K12 quirk vs vLLM 0.32", ctl)
    ok = True
    if res.failures:
        print("  FAIL: %d unexpected differences" % len(res.failures))
        ok = False
    if ctl.failures or not ctl.expected["k12"]:
        print("  FAIL: the control must show K12 differences (%d) and nothing else (%d)"
              % (ctl.expected["k12"], len(ctl.failures)))
        ok = False
    if ok:
        print("  agreement: no unexpected difference; the control shows K12's %d"
              % ctl.expected["k12"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
