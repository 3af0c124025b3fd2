#!/usr/bin/env python3
"""Side by side in one vLLM (issue 14, item 4): vLLM's own
MooncakeStoreConnector over a Mooncake store against kvpool's KvpoolConnector
over a `kvpool server`, same prompts, same model, in one run.

Run it with the vLLM venv's interpreter, from a clone with a release build
(build/kvpool, build/libkvpool.so):

    VENV=$(sh scripts/vllm-env.sh | tail -n 1)   # or /var/cache/kvpool/vllm-<hash>
    cmake --build build -j2 --target kvpool kvpool_shared kvpool_pyext
    $VENV/bin/python bench/vllm_side_by_side.py            # both connectors
    $VENV/bin/python bench/vllm_side_by_side.py --only mooncake

Mooncake comes from python/requirements-bench.txt, installed by
scripts/mooncake-env.sh (pip --target into a directory keyed by that file's
hash, outside the clone; never into the vLLM venv) and put on PYTHONPATH for
the Mooncake engines only.  Its topology: `mooncake_master` on 127.0.0.1, a
`mooncake_client` process owning the store's memory segment (the connector
runs in "standalone-store" mode: the engine contributes no segment), protocol
tcp, metadata server P2PHANDSHAKE, VLLM_HOST_IP=127.0.0.1.  kvpool: a
`kvpool server` on 127.0.0.1, the connector from python/kvpool/vllm over
build/libkvpool.so (PYTHONPATH and KVPOOL_LIB, no install).

Per connector: a fresh engine computes N distinct prompts (cold: nothing
stored yet; the connector saves their KV), then a second fresh engine (its
own process, local prefix cache off) gets the same prompts, whose KV it loads
from the store (warm), and short prompts of the tail's length that load
nothing (the no-load baseline).  TTFT is vLLM's own per-request
first_token_latency (RequestOutput.metrics), one prompt per generate call;
medians are reported.  Load GB/s, the same method for both connectors:
bytes loaded (blocks vLLM counts as cached * bytes per block) / (warm TTFT -
baseline TTFT), medians.  Where the connector's own stats record loads
(Mooncake's load_get: bytes and seconds per store call), their GB/s is
printed beside it, and "best" is the same formula on the fastest warm and
baseline prompts (TTFT on a shared 2-core machine swings with its load: the
load average is printed with each leg).  Engines run enforce_eager by default
(--no-eager: torch.compile, about 30 s more per start).  Every warm run must
return the tokens of its cold run (greedy); the exit status is 1 otherwise.

Every process this script starts (engines, master, segment owner, kvpool
server) runs in its own session and is stopped by its PID at exit, on error
too.
"""
import argparse
import atexit
import glob
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = 32
# The bench model: 8 layers, 8 KV heads of 128 in bf16: 2 (K, V) * 8 * 128 *
# 32 tokens * 2 bytes * 8 layers = 1 MiB of KV per block.
MODEL = dict(layers=8, hidden=1024, heads=8, kv_heads=8, head_dim=128, dtype_bytes=2)


# ---------------------------------------------------------------- processes
class Procs:
    """The processes this run started, each in its own session, stopped by
    PID (TERM, then KILL after a grace period) in reverse start order."""

    def __init__(self):
        self.live = []

    def start(self, name, argv, env=None, log=None, cwd=None):
        out = open(log, "ab") if log else subprocess.DEVNULL
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=cwd)
        self.live.append((name, p))
        return p

    def stop(self, p, grace=5.0):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        self.live = [(n, q) for n, q in self.live if q is not p]

    def stop_all(self):
        for _, p in reversed(list(self.live)):
            try:
                self.stop(p)
            except ProcessLookupError:
                pass


PROCS = Procs()


def on_signal(signum, _frame):
    sys.exit(128 + signum)  # runs the finally blocks and atexit


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, what, log, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}); see {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not listening on 127.0.0.1:{port} after {timeout:.0f} s; see {log}")


class LegUnavailable(Exception):
    """A connector leg that cannot run here (said why)."""


# ---------------------------------------------------------------- backends
def mooncake_install():
    """The directory scripts/mooncake-env.sh installs Mooncake into (creates
    it on first use), for this interpreter's Python version."""
    env = dict(os.environ, KVPOOL_PYTHON=sys.executable)
    r = subprocess.run(["sh", os.path.join(REPO, "scripts", "mooncake-env.sh")],
                       env=env, stdout=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise LegUnavailable(f"scripts/mooncake-env.sh failed (exit {r.returncode})")
    return r.stdout.strip().splitlines()[-1]


def start_mooncake(tmp, segment):
    """mooncake_master and the segment owner (mooncake_client) on
    127.0.0.1; returns the engine's extra env (the connector reads its store
    config from MOONCAKE_CONFIG_PATH)."""
    mc = mooncake_install()
    bins = os.path.join(mc, "mooncake")
    master_port, metrics_port, owner_port = free_port(), free_port(), free_port()
    log = os.path.join(tmp, "mooncake-master.log")
    master = PROCS.start("mooncake_master", [
        os.path.join(bins, "mooncake_master"), f"--rpc_port={master_port}",
        "--rpc_address=127.0.0.1", f"--metrics_port={metrics_port}",
        "--metrics_host=127.0.0.1"], log=log)
    wait_listening(master_port, master, "mooncake_master", log)
    master_addr = f"127.0.0.1:{master_port}"
    log = os.path.join(tmp, "mooncake-owner.log")
    owner = PROCS.start("mooncake_client", [
        os.path.join(bins, "mooncake_client"), "--host=127.0.0.1", f"--port={owner_port}",
        f"--global_segment_size={segment}", f"--master_server_address={master_addr}",
        "--metadata_server=P2PHANDSHAKE", "--protocol=tcp"], log=log)
    wait_listening(owner_port, owner, "mooncake_client (segment owner)", log)
    conf = os.path.join(tmp, "mooncake.json")
    with open(conf, "w") as f:
        json.dump({"mode": "standalone-store", "metadata_server": "P2PHANDSHAKE",
                   "master_server_address": master_addr, "protocol": "tcp",
                   "device_name": "", "global_segment_size": 0,
                   "local_buffer_size": "128MB"}, f)
    return {"MOONCAKE_CONFIG_PATH": conf, "PYTHONPATH": mc}


def start_kvpool(tmp, capacity, kvpool_bin, kvpool_lib):
    """A kvpool server on 127.0.0.1; returns (the connector's extra config,
    the engine's extra env)."""
    if not os.path.isfile(os.path.join(REPO, "python", "kvpool", "vllm", "__init__.py")):
        raise LegUnavailable("python/kvpool/vllm (KvpoolConnector) does not exist in this "
                             "checkout yet; run with --only mooncake")
    ext = glob.glob(os.path.join(os.path.dirname(kvpool_lib), "_kvsched*.so"))
    for path in (kvpool_bin, kvpool_lib, ext[0] if ext else "the kvpool._kvsched extension"):
        if not os.path.exists(path):
            raise LegUnavailable(f"{path} missing: build it (cmake --build build -j2 "
                                 "--target kvpool kvpool_shared kvpool_pyext)")
    port_file = os.path.join(tmp, "kvpool.port")
    log = os.path.join(tmp, "kvpool-server.log")
    server = PROCS.start("kvpool server", [
        kvpool_bin, "server", "--listen", "127.0.0.1:0", "--port-file", port_file,
        "--memory", capacity, "--log-level", "warn"], log=log)
    deadline = time.monotonic() + 30
    while not (os.path.exists(port_file) and open(port_file).read().strip()):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"kvpool server did not start; see {log}")
        time.sleep(0.1)
    port = int(open(port_file).read().split()[0])
    wait_listening(port, server, "kvpool server", log)
    extra = {"pool": f"kvpool://127.0.0.1:{port}"}
    env = {"PYTHONPATH": os.path.join(REPO, "python"), "KVPOOL_LIB": kvpool_lib}
    return extra, env


# ---------------------------------------------------------------- the workload
def write_model(tmp):
    """A random-weight Llama's config.json (load_format=dummy reads no weights)."""
    d = os.path.join(tmp, "model")
    os.makedirs(d, exist_ok=True)
    m = MODEL
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": m["hidden"], "intermediate_size": 2 * m["hidden"],
                   "num_hidden_layers": m["layers"], "num_attention_heads": m["heads"],
                   "num_key_value_heads": m["kv_heads"], "head_dim": m["head_dim"],
                   "vocab_size": 1000, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1,
                   "eos_token_id": 2, "tie_word_embeddings": False}, f)
    return d


def bytes_per_block():
    m = MODEL
    return 2 * m["kv_heads"] * m["head_dim"] * BLOCK * m["dtype_bytes"] * m["layers"]


def make_prompts(seed, count, length):
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(length)] for _ in range(count)]


def workload(args):
    """The prompts (the same for both connectors and both passes), and per
    pass a warm-up prompt and the baseline's tail-length prompts, distinct
    from everything stored."""
    tail = args.tokens % BLOCK or BLOCK
    return {"prompts": make_prompts("bench", args.prompts, args.tokens),
            "tail": tail,
            "warmup": {p: make_prompts(f"warmup-{p}", 1, args.tokens) for p in ("cold", "warm")},
            "baseline": make_prompts("baseline", args.prompts, tail)}


# ---------------------------------------------------------------- one engine (child process)
def hook_connector_stats():
    """Keeps a copy of every stats object the worker-side connector hands to
    vLLM (uni executor: the worker runs in this process)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    conn = get_kv_transfer_group()
    kept, orig = [], conn.get_kv_connector_stats

    def get_kv_connector_stats():
        s = orig()
        if s is not None and getattr(s, "data", None):
            kept.append(json.loads(json.dumps(s.data, default=str)))
        return s

    conn.get_kv_connector_stats = get_kv_connector_stats
    return kept, orig


def generate_each(llm, prompts, max_tokens):
    """One prompt per generate call: per prompt its TTFT (vLLM's
    first_token_latency; wall time of the call where metrics are off), the
    tokens and the tokens vLLM counted as cached (loaded, here)."""
    from vllm import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=max_tokens)
    rows = []
    for p in prompts:
        t0 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": p}], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        m = out.metrics
        ttft = m.first_token_latency if m is not None and m.first_token_latency > 0 else None
        rows.append({"ttft": ttft if ttft is not None else wall, "ttft_source":
                     "metrics" if ttft is not None else "wall", "tokens": list(out.outputs[0].token_ids),
                     "cached": out.num_cached_tokens or 0})
    return rows


def child_main(spec_path):
    spec = json.load(open(spec_path))
    from vllm import LLM
    from vllm.config import KVTransferConfig
    kt = dict(kv_connector=spec["connector"], kv_role="kv_both",
              kv_connector_extra_config=spec["extra"])
    if spec.get("module"):
        kt["kv_connector_module_path"] = spec["module"]
    if "kv_load_failure_policy" in getattr(KVTransferConfig, "__dataclass_fields__", {}):
        kt["kv_load_failure_policy"] = "recompute"
    t0 = time.perf_counter()
    llm = LLM(model=spec["model"], load_format="dummy", skip_tokenizer_init=True,
              block_size=BLOCK, distributed_executor_backend="uni", enable_prefix_caching=False,
              max_model_len=spec["max_model_len"], dtype="bfloat16", seed=0,
              disable_log_stats=False, enforce_eager=spec["eager"],
              kv_transfer_config=KVTransferConfig(**kt))
    startup = time.perf_counter() - t0
    kept, orig_stats = hook_connector_stats()
    w = spec["work"]
    generate_each(llm, w["warmup"][spec["pass"]], spec["max_tokens"])
    res = {"startup_s": startup, "prompts": generate_each(llm, w["prompts"], spec["max_tokens"])}
    if spec["pass"] == "warm":
        res["baseline"] = generate_each(llm, w["baseline"], spec["max_tokens"])
    late = orig_stats()
    if late is not None and getattr(late, "data", None):
        kept.append(json.loads(json.dumps(late.data, default=str)))
    res["stats"] = kept
    llm.llm_engine.engine_core.shutdown()  # drains the connector's pending saves
    with open(spec["out"], "w") as f:
        json.dump(res, f)


# ---------------------------------------------------------------- one leg (parent)
def run_engine(tmp, leg, pass_, spec, env, timeout):
    path = os.path.join(tmp, f"{leg}-{pass_}")
    spec = dict(spec, **{"pass": pass_, "out": path + ".out.json"})
    with open(path + ".spec.json", "w") as f:
        json.dump(spec, f)
    log = path + ".log"
    t0 = time.monotonic()
    p = PROCS.start(f"engine {leg} {pass_}", [sys.executable, os.path.abspath(__file__),
                                              "--child", path + ".spec.json"], env=env, log=log)
    try:
        rc = p.wait(timeout)
    except subprocess.TimeoutExpired:
        PROCS.stop(p)
        raise RuntimeError(f"{leg} {pass_} engine ran past {timeout} s; see {log}")
    PROCS.stop(p)
    if rc != 0 or not os.path.exists(spec["out"]):
        tail = open(log, errors="replace").read()[-3000:]
        raise RuntimeError(f"{leg} {pass_} engine failed (exit {rc}); {log} ends:\n{tail}")
    res = json.load(open(spec["out"]))
    res["wall_s"] = time.monotonic() - t0
    return res


def engine_env(extra_env):
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_HOST_IP="127.0.0.1",
               PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false")
    for k, v in extra_env.items():
        env[k] = v + os.pathsep + env[k] if k == "PYTHONPATH" and env.get(k) else v
    return env


def start_leg(name, tmp, args):
    """Starts a leg's store; returns (connector, module, extra config, env)."""
    if name == "mooncake":
        return "MooncakeStoreConnector", None, {}, start_mooncake(tmp, args.capacity_mooncake)
    extra, env = start_kvpool(tmp, args.capacity, args.kvpool_bin, args.kvpool_lib)
    return "KvpoolConnector", "kvpool.vllm", extra, env


def run_leg(name, tmp, args, work, model):
    connector, module, extra, env = start_leg(name, tmp, args)
    spec = {"connector": connector, "module": module, "extra": extra, "model": model,
            "work": work, "max_tokens": args.max_tokens, "eager": args.eager,
            "max_model_len": args.tokens + args.max_tokens + BLOCK}
    env = engine_env(env)
    load = os.getloadavg()[0]
    cold = run_engine(tmp, name, "cold", spec, env, args.engine_timeout)
    warm = run_engine(tmp, name, "warm", spec, env, args.engine_timeout)
    return dict(summarize(cold, warm), loadavg=[load, os.getloadavg()[0]])


# ---------------------------------------------------------------- figures
def stats_load_rate(stats):
    """From the connector's own stats: (GB/s of the loads, bytes loaded).
    Mooncake records each store call (operations load*, with num_bytes and
    duration_seconds): both.  kvpool counts bytes_loaded, no time: (None,
    bytes)."""
    nbytes = secs = 0.0
    for data in stats:
        nbytes += float(data.get("bytes_loaded", 0) or 0)
        for op, records in data.items():
            if not op.startswith("load") or not isinstance(records, list):
                continue
            for r in records:
                if isinstance(r, dict) and "num_bytes" in r and "duration_seconds" in r:
                    nbytes += float(r["num_bytes"])
                    secs += float(r["duration_seconds"])
    return (nbytes / secs / 1e9 if secs > 0 else None), int(nbytes)


def summarize(cold, warm):
    med = statistics.median
    cold_ttft = med(r["ttft"] for r in cold["prompts"])
    warm_ttft = med(r["ttft"] for r in warm["prompts"])
    base = med(r["ttft"] for r in warm["baseline"])
    loaded = int(med(r["cached"] for r in warm["prompts"])) // BLOCK * bytes_per_block()
    load_s = warm_ttft - base
    best_s = min(r["ttft"] for r in warm["prompts"]) - min(r["ttft"] for r in warm["baseline"])
    stats_gbps, stats_bytes = stats_load_rate(warm["stats"])
    mismatched = [i for i, (c, w) in enumerate(zip(cold["prompts"], warm["prompts"]))
                  if c["tokens"] != w["tokens"]]
    return {"cold_ttft": cold_ttft, "warm_ttft": warm_ttft, "baseline_ttft": base,
            "loaded_bytes": loaded, "load_gbps": loaded / load_s / 1e9 if load_s > 0 and loaded else None,
            "best_gbps": loaded / best_s / 1e9 if best_s > 0 and loaded else None,
            "stats_gbps": stats_gbps, "stats_bytes": stats_bytes,
            "cold_ttfts": [r["ttft"] for r in cold["prompts"]],
            "warm_ttfts": [r["ttft"] for r in warm["prompts"]],
            "baseline_ttfts": [r["ttft"] for r in warm["baseline"]],
            "hits": [r["cached"] for r in warm["prompts"]], "cold_hits": [r["cached"] for r in cold["prompts"]],
            "mismatched": mismatched,
            "ttft_source": sorted({r["ttft_source"] for r in cold["prompts"] + warm["prompts"]}),
            "startup_s": [cold["startup_s"], warm["startup_s"]],
            "engine_wall_s": [cold["wall_s"], warm["wall_s"]]}


def fmt(v, unit=""):
    return "n/a" if v is None else f"{v:.3f}{unit}"


def print_table(results, args):
    print(f"\n{args.prompts} prompts of {args.tokens} tokens, {MODEL['layers']} layers, "
          f"{bytes_per_block() / 2**20:.2f} MiB of KV per block of {BLOCK}; medians; "
          f"TTFT from vLLM's first_token_latency")
    print("load GB/s = bytes loaded (cached blocks * bytes per block) / (warm TTFT - "
          "no-load baseline TTFT), medians; best GB/s: the same from the fastest warm and "
          "baseline prompts (less sensitive to a busy machine); stats GB/s = the connector's "
          "own load records")
    hdr = f"{'connector':<10} {'cold TTFT':>10} {'warm TTFT':>10} {'baseline':>9} " \
          f"{'loaded MiB':>10} {'load GB/s':>10} {'best GB/s':>10} {'stats GB/s':>10} {'tokens':>8}"
    print(hdr)
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<10} not run: {r['error']}")
            continue
        ok = "same" if not r["mismatched"] else f"{len(r['mismatched'])} DIFF"
        print(f"{name:<10} {fmt(r['cold_ttft'], 's'):>10} {fmt(r['warm_ttft'], 's'):>10} "
              f"{fmt(r['baseline_ttft'], 's'):>9} {r['loaded_bytes'] / 2**20:>10.1f} "
              f"{fmt(r['load_gbps']):>10} {fmt(r['best_gbps']):>10} {fmt(r['stats_gbps']):>10} {ok:>8}")
    k, m = results.get("kvpool", {}), results.get("mooncake", {})
    if "cold_ttft" in k and "cold_ttft" in m:
        def ratio(key):
            return None if not k[key] or not m[key] else k[key] / m[key]
        print(f"{'kvpool/mc':<10} {fmt(ratio('cold_ttft')):>10} {fmt(ratio('warm_ttft')):>10} "
              f"{fmt(ratio('baseline_ttft')):>9} {'':>10} {fmt(ratio('load_gbps')):>10} "
              f"{fmt(ratio('best_gbps')):>10} {fmt(ratio('stats_gbps')):>10}")
    for name, r in results.items():
        if "hits" in r:
            print(f"{name}: warm cached tokens {r['hits']}, cold {r['cold_hits']}; "
                  f"the connector's stats: {r['stats_bytes'] / 2**20:.0f} MiB loaded; engine start "
                  f"{r['startup_s'][0]:.1f}/{r['startup_s'][1]:.1f} s, engine wall "
                  f"{r['engine_wall_s'][0]:.1f}/{r['engine_wall_s'][1]:.1f} s (cold/warm); load average "
                  f"{r['loadavg'][0]:.1f} before, {r['loadavg'][1]:.1f} after ({os.cpu_count()} CPUs)")


# ---------------------------------------------------------------- main
def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=["mooncake", "kvpool"], help="run one connector's leg")
    ap.add_argument("--prompts", type=int, default=8, help="distinct prompts (default 8)")
    ap.add_argument("--tokens", type=int, default=2064,
                    help="tokens per prompt (default 2064: 64 full blocks, 64 MiB, and a tail of 16)")
    ap.add_argument("--max-tokens", type=int, default=8, help="tokens generated per prompt (default 8)")
    ap.add_argument("--capacity", default="2GiB", help="kvpool server --memory (default 2GiB)")
    ap.add_argument("--capacity-mooncake", default="2GB",
                    help="the Mooncake segment owner's global_segment_size (default 2GB)")
    ap.add_argument("--kvpool-bin", default=os.path.join(REPO, "build", "kvpool"))
    ap.add_argument("--kvpool-lib", default=os.path.join(REPO, "build", "libkvpool.so"))
    ap.add_argument("--engine-timeout", type=int, default=300, help="seconds per engine (default 300)")
    ap.add_argument("--eager", action=argparse.BooleanOptionalAction, default=True,
                    help="enforce_eager engines (default; --no-eager: torch.compile, about "
                         "30 s more per engine start)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap.parse_args()


def main():
    args = parse_args()
    if args.child:
        return child_main(args.child)
    atexit.register(PROCS.stop_all)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    tmp = tempfile.mkdtemp(prefix="kvp-side-by-side.")
    print(f"work directory: {tmp}", flush=True)
    t0 = time.monotonic()
    work, model = workload(args), write_model(tmp)
    results = {}
    try:
        for name in (["mooncake", "kvpool"] if not args.only else [args.only]):
            print(f"{name}: cold and warm engines ...", flush=True)
            try:
                results[name] = run_leg(name, tmp, args, work, model)
            except (LegUnavailable, RuntimeError) as e:
                results[name] = {"error": str(e)}
            finally:
                PROCS.stop_all()  # this leg's store: the next leg starts clean
    finally:
        PROCS.stop_all()
    print_table(results, args)
    print(f"one run: {time.monotonic() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    bad = any("error" in r or r["mismatched"] or not any(r["hits"]) for r in results.values())
    if args.keep or bad:
        print(f"logs kept in {tmp}")
    else:
        subprocess.run(["rm", "-rf", tmp])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
