#!/usr/bin/python3
"""kv-sched-replay v1 through kvpool.sched.Scheduler (the CPython extension
python/kvpool/_kvsched.c over the C KV scheduler), for the reference harness
../shared/tools/kvsched-ref (README.md there):

  sched_replay.py < events.jsonl > outputs.jsonl
  check.sh "/usr/bin/python3 tests/python/sched_replay.py"

Same contract as ref.py: line 1 the config, one canonical JSON line per
non-empty input line, {"error": NAME} for a failed event, exit 2 without
output on a bad config line.  Every decision comes from the C scheduler: this
file only builds ref.py-like duck-typed vLLM objects (ref.py's own Request,
NewRequestData, CachedRequestData, SchedulerOutput and its event validation,
imported from the harness), hands them to the extension's hooks and prints
what comes back.  The seed class is never loaded.

What differs from ref.py's calls, and why it is the same decision:
  - The lookup client is a kvpool.kv.CallbackLookup over a scripted object
    with ref.py's LookupKeyClient bookkeeping (next_lookup, lookup_calls,
    discarded, reset_reply), so ref.py's op code reads it unchanged.
  - Block hashes: the stream's strings become bytes (bytes.fromhex for 16 or
    64 hex digits, gen.py's and `kvpool bench --kv-scheduler`'s, else an
    8-byte BLAKE2b of the string); the extension takes vLLM's bytes of one
    length and the seed reads only their count.
  - Request._all_token_ids is the very list all_token_ids is (vLLM's
    Request keeps it under that name; the extension prefers it).
    --all-token-ids leaves it out, so the extension's fallback (a copy of
    all_token_ids) runs instead.
  - request_finished(request_id, total blocks): the wrapper's form; the seed
    only sums the group lengths.
  - build_connector_meta returns the C msgpack encoding; kvpool.kv.decode_meta
    reads it back.  A ReqMeta's partial_tail_offloads is None when empty (the
    C meta has no empty-list form; the seed never attaches an empty list).

Also:
  --time           stderr: per-hook call counts and mean time (only the
                   hook call itself is timed)
  --bench [FILE..] no stdin: the stream files, else gen.py streams (--modes,
                   --seeds, --steps as check.py), each replayed through the
                   extension and through the seed class (ref.Replayer), the
                   outputs checked equal, only the hook calls timed (and,
                   apart, pickling the seed's metadata, which the
                   extension's hook returns already encoded); one JSON
                   summary on stdout.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import pickle
import shlex
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True


def ref_dir():
    """The harness: $KVP_SHARED_DIR/tools/kvsched-ref, else the repository's
    ../shared/tools/kvsched-ref (CMakeLists.txt's KVP_SHARED_DIR)."""
    shared = os.environ.get("KVP_SHARED_DIR") or os.path.join(REPO, "..", "shared")
    return os.path.join(os.path.abspath(shared), "tools", "kvsched-ref")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


REF_DIR = ref_dir()
if not os.path.isfile(os.path.join(REF_DIR, "ref.py")):
    sys.stderr.write("sched_replay.py: the kvsched-ref harness is not at %s "
                     "(set KVP_SHARED_DIR)\n" % REF_DIR)
    sys.exit(2)
sys.path.insert(0, REF_DIR)  # gen.py and check.py import ref by name
ref = _load("ref", os.path.join(REF_DIR, "ref.py"))

if "KVPOOL_LIB" not in os.environ and os.path.isfile(os.path.join(REPO, "build", "libkvpool.so")):
    os.environ["KVPOOL_LIB"] = os.path.join(REPO, "build", "libkvpool.so")
try:
    import kvpool  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(REPO, "python"))
from kvpool import kv as kvpool_kv  # noqa: E402
from kvpool import sched as kvpool_sched  # noqa: E402


def _hash_bytes(s):
    if len(s) in (16, 64):  # gen.py's 8-byte and the C bench's 32-byte hashes
        try:
            return bytes.fromhex(s)
        except ValueError:
            pass
    return hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest()


class ScriptedLookup:
    """ref.py's LookupKeyClient bookkeeping, as CallbackLookup callables."""

    def __init__(self):
        self.next_lookup = None
        self.lookup_calls = []
        self.discarded = []
        self.reset_reply = None

    def lookup(self, req_id, num_tokens, block_hashes, non_block):
        self.lookup_calls.append({"num_tokens": num_tokens,
                                  "num_block_hashes": len(block_hashes),
                                  "non_block": bool(non_block)})
        return self.next_lookup

    def discard(self, req_id):
        self.discarded.append(req_id)

    def reset(self):
        if self.reset_reply == "error":
            raise ref.ScriptedError("scripted reset RPC failure")
        return self.reset_reply == "ack"


class ExtReplayer(ref.Replayer):
    """ref.Replayer with the seed class replaced by kvpool.sched.Scheduler."""

    def __init__(self, cfg, private_tokens=True):
        self.cfg = cfg
        self.private_tokens = private_tokens
        self.client = ScriptedLookup()
        self.lookup = kvpool_kv.CallbackLookup(self.client.lookup, self.client.discard,
                                               self.client.reset)
        self.sched = kvpool_sched.Scheduler(
            self.lookup, kv_role=cfg["kv_role"], load_async=cfg["load_async"],
            lookup_async=cfg["lookup_async"], enable_lookup=cfg["enable_lookup"],
            block_size=cfg["block_size"], hash_block_size=cfg["hash_block_size"],
            partial_hits=cfg["partial_hits"])
        self.requests = {}

    def op_req(self, ev):
        out = ref.Replayer.op_req(self, ev)  # validates, then updates in place
        r = self.requests[ev["req_id"]]
        if ev.get("block_hashes") is not None:
            r.block_hashes = [_hash_bytes(h) for h in r.block_hashes]
        elif ev.get("append_block_hashes"):
            n = len(ev["append_block_hashes"])
            r.block_hashes[-n:] = [_hash_bytes(h) for h in r.block_hashes[-n:]]
        if self.private_tokens:
            r._all_token_ids = r.all_token_ids
        return out

    def op_update_state_after_alloc(self, ev):
        blocks = ref._req(ev, "block_ids", "groups")
        ne = ref._req(ev, "num_external_tokens", "int")
        r = self._request(ev)
        groups = ref.KVCacheBlocks(ref._groups(blocks)).get_block_ids()
        return {"ret": self.sched.update_state_after_alloc(r, groups, ne)}

    def op_request_finished(self, ev):
        blocks = ref._req(ev, "block_ids", "groups")
        r = self._request(ev)
        delay = self.sched.request_finished(r.request_id, sum(len(g) for g in blocks))
        return {"ret": [delay, None]}

    def op_reset_store(self, ev):
        reply = ref._req(ev, "reply", "str")
        if reply not in ref.RESET_REPLIES:
            raise ref.BadEvent("reply must be ack, nack or error")
        self.client.reset_reply = reply
        return {"ret": self.sched._s.reset_store()}

    def op_build_connector_meta(self, ev):
        so = self._scheduler_output(ev)
        self.client.discarded = []
        meta = kvpool_kv.decode_meta(self.sched.build_connector_meta(so))
        reqs = []
        for m in meta.requests:
            d = ref.reqmeta_out(m)
            if not m.partial_tail_offloads:
                d["partial_tail_offloads"] = None
            reqs.append(d)
        return {"ret": {
            "unfinished_request_ids": sorted(meta.unfinished_req_ids),
            "preempted_req_ids": sorted(meta.preempted_req_ids),
            "requests": reqs,
        }, "discarded": sorted(self.client.discarded)}

    OPS = dict(ref.Replayer.OPS, req=op_req, update_state_after_alloc=op_update_state_after_alloc,
               request_finished=op_request_finished, reset_store=op_reset_store,
               build_connector_meta=op_build_connector_meta)


HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
         "request_finished", "reset_store")


class Timed:
    """Stands in for a scheduler: each hook call is timed on its own (the
    wrapper's own call is outside the timed span)."""

    def __init__(self, target, acc, after=None):
        """after: {hook: (label, fn)}: fn(the hook's result) is timed too,
        under label, apart from the hook."""
        self._target = target
        for name in HOOKS:
            fn = getattr(target, name, None)
            if fn is not None:
                label, post = (after or {}).get(name, (None, None))
                setattr(self, name, self._wrap(fn, acc.setdefault(name, [0, 0]), post,
                                               acc.setdefault(label, [0, 0]) if post else None))

    @staticmethod
    def _wrap(fn, slot, post, post_slot):
        clock = time.perf_counter_ns

        def timed(*args):
            t = clock()
            try:
                ret = fn(*args)
            finally:
                slot[1] += clock() - t
                slot[0] += 1
            if post is not None:
                t = clock()
                post(ret)
                post_slot[1] += clock() - t
                post_slot[0] += 1
            return ret
        return timed

    def __getattr__(self, name):
        return getattr(self._target, name)


def replay(lines, make, acc=None, after=None):
    """Yields the output lines of a stream; make(cfg) -> replayer; acc:
    hook timings (Timed)."""
    rep = None
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            ev = None
        if rep is None:
            rep = make(ref.parse_config(ev))
            if acc is not None:
                rep.sched = Timed(rep.sched, acc, after)
            yield ref.canonical({"ret": None})
            continue
        yield ref.canonical(rep.handle(ev))


def _summary(acc):
    return {k: {"calls": c, "mean_ns": round(t / c) if c else None, "total_s": t / 1e9}
            for k, (c, t) in acc.items()}


def _streams(args):
    """(name, event lines): the files given, else gen.py's streams."""
    if args.files:
        for path in args.files:
            with open(path, encoding="utf-8") as f:
                yield path, f.read().splitlines()
        return
    import check  # the harness's mode table (imports gen and ref)
    import gen
    modes = check.MODES
    if args.modes:
        modes = {m: check.MODES[m] for m in args.modes.split(",")}
    for mode, margs in modes.items():
        for s in range(args.seed_start, args.seed_start + args.seeds):
            yield "%s seed %d" % (mode, s), gen.generate(
                shlex.split(margs) + ["--seed", str(s), "--steps", str(args.steps)])


def bench(args):
    ext, seed = {}, {}
    streams = events = 0
    for name, evs in _streams(args):
        mine = list(replay(evs, lambda c: ExtReplayer(c, not args.all_token_ids), ext))
        # The extension's hook returns the msgpack encoding for the workers;
        # the seed's returns objects that vLLM pickles to send them (the
        # multiprocess executor): that is timed on its own.
        theirs = list(replay(evs, ref.Replayer, seed, {"build_connector_meta": (
            "build_connector_meta_result_pickled", lambda m: pickle.dumps(m, protocol=5))}))
        if mine != theirs:
            i = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
            sys.stderr.write("mismatch: %s line %d\n  seed: %s\n  ext:  %s\n"
                             % (name, i + 1, theirs[i], mine[i]))
            return 1
        streams += 1
        events += len(evs)
    res = {"streams": streams, "events": events, "extension": _summary(ext),
           "seed": _summary(seed)}
    if not args.files:
        res.update(steps=args.steps, seeds=args.seeds, modes=args.modes or "all 16")
    b = res["extension"].get("build_connector_meta"), res["seed"].get("build_connector_meta")
    if b[0] and b[1] and b[0]["mean_ns"]:
        res["build_connector_meta_seed_over_ext"] = round(b[1]["mean_ns"] / b[0]["mean_ns"], 2)
    print(json.dumps(res, indent=1, sort_keys=True))
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--all-token-ids", action="store_true",
                   help="Requests without _all_token_ids (the extension's fallback path)")
    p.add_argument("--time", action="store_true", help="per-hook timing on stderr")
    p.add_argument("--bench", action="store_true", help="extension vs seed on gen.py streams")
    p.add_argument("--modes", default=None)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--seed-start", type=int, default=0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("files", nargs="*", help="--bench: stream files instead of gen.py's")
    args = p.parse_args(argv)
    if args.files and not args.bench:
        p.error("stream files are for --bench (a replay reads stdin)")
    if not __debug__:
        sys.stderr.write("sched_replay.py: must not run with -O (ref.py's checks)\n")
        return 2
    if args.bench:
        return bench(args)
    acc = {} if args.time else None
    out = sys.stdout
    try:
        for o in replay(sys.stdin, lambda c: ExtReplayer(c, not args.all_token_ids), acc):
            out.write(o + "\n")
    except ref.BadEvent as e:
        sys.stderr.write("sched_replay.py: bad config line: %s\n" % e)
        return 2
    out.flush()
    if acc is not None:
        sys.stderr.write(json.dumps(_summary(acc), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
