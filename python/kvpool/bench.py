"""python3 -m kvpool.bench: Pool.get_into (or put) of large values from Python
against `kvpool bench` in C, same pool URI, same run.

The workload is the C bench's (tools/cmd_bench.c): `count` distinct keys of
`size` bytes; get stores them first (untimed), then reads each once in random
order into distinct, pre-faulted destinations; put stores `count` distinct
values from distinct sources.  Each round runs the C bench as a subprocess
(--kvpool-bin) and then the Python loop, each in a fresh process (so neither
pays for the other's freed gigabytes).  The best and the median GB/s of each
side (decimal GB, as the C bench prints) and their ratios are reported; on a
busy machine the rounds vary a lot, and best-of is the one to quote.  The
Python side removes the keys it stored; on a kvpool:// server the C bench's
keys stay until evicted, so the server needs room for one side's values.

usage: python3 -m kvpool.bench [--uri URI] [--op get|put] [--size 1MiB]
                               [--count 2000] [--rounds 3] [--kvpool-bin PATH] [--json]
"""
import argparse
import json
import mmap
import os
import random
import shutil
import struct
import subprocess
import sys
import time

from .pool import Pool

_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def _size(s):
    num = s.rstrip("KMGiB")
    unit = s[len(num):]
    if unit not in _UNITS or not num.isdigit():
        raise argparse.ArgumentTypeError("size like 1MiB, 4096 or 64KiB, not %r" % s)
    return int(num) * _UNITS[unit]


def _prefaulted(nbytes):
    """Destinations touched page by page before timing.  Small pages, as the
    C bench's destinations get (it maps each 1 MiB buffer on its own, too
    small for a huge page): huge pages here made single rounds swing from
    3 to 10 GB/s (compaction and khugepaged at work under the timed loop)."""
    m = mmap.mmap(-1, nbytes)
    page = b"\x01" * 4096
    for off in range(0, nbytes, 1 << 20):  # touch every page
        n = min(1 << 20, nbytes - off)
        m[off:off + n] = page * (n // 4096) + page[:n % 4096]
    return m


def python_round(uri, op, size, count, rng):
    """GB/s of one timed pass from Python."""
    keys = ["pybench-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%032x" % rng.getrandbits(128)
            for _ in range(count)]
    order = list(range(count))
    rng.shuffle(order)
    bufs = _prefaulted(size * count)
    views = [memoryview(bufs)[i * size:(i + 1) * size] for i in range(count)]
    with Pool(uri) as pool:
        try:
            if op == "get":
                src = bytearray(b"\xa5" * size)
                for i, k in enumerate(keys):
                    struct.pack_into("<Q", src, 0, i)
                    pool.put(k, src)
                get_into = pool.get_into
                t0 = time.perf_counter()
                for i in order:
                    get_into(keys[i], views[i])
                dt = time.perf_counter() - t0
                for i in rng.sample(range(count), min(count, 64)):  # the bytes really arrived
                    if struct.unpack_from("<Q", views[i])[0] != i or views[i][-1] != 0xA5:
                        raise SystemExit("kvpool.bench: key %d read back wrong bytes" % i)
            else:
                for i, v in enumerate(views):
                    struct.pack_into("<Q", v, 0, i)
                put = pool.put
                t0 = time.perf_counter()
                for i in order:
                    put(keys[i], views[i])
                dt = time.perf_counter() - t0
        finally:
            for j in range(0, count, 4096):
                pool.remove_many(keys[j:j + 4096])
    for v in views:
        v.release()
    bufs.close()
    return size * count / dt / 1e9


def python_round_subprocess(uri, op, size, count, seed):
    args = [sys.executable, "-m", "kvpool.bench", "--side", "python", "--uri", uri, "--op", op,
            "--size", str(size), "--count", str(count), "--seed", str(seed), "--json"]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this kvpool's parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    r = subprocess.run(args, stdout=subprocess.PIPE, check=True, env=env)
    return json.loads(r.stdout.decode().strip().splitlines()[-1])["gbps"]


def c_round(kvpool_bin, uri, op, size, count):
    r = subprocess.run([kvpool_bin, "bench", "--uri", uri, "--op", op, "--size", str(size),
                        "--count", str(count), "--json"], stdout=subprocess.PIPE, check=True)
    out = json.loads(r.stdout.decode().strip().splitlines()[-1])
    if out.get("errors"):
        raise SystemExit("kvpool.bench: the C bench counted %d errors" % out["errors"])
    return out["gbps"]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m kvpool.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--uri", default="embedded://?capacity=4GiB")
    ap.add_argument("--op", choices=("get", "put"), default="get")
    ap.add_argument("--size", type=_size, default=1 << 20)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kvpool-bin", default=os.environ.get("KVP_BIN") or shutil.which("kvpool"),
                    help="the kvpool command for the C side (default: $KVP_BIN or PATH)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--side", choices=("both", "python"), default="both",
                    help="python: one Python pass in this process (what each round runs)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if a.side == "python":
        gbps = python_round(a.uri, a.op, a.size, a.count, random.Random(a.seed))
        print(json.dumps({"gbps": gbps}) if a.json else "Python %.2f GB/s" % gbps)
        return 0
    if not a.kvpool_bin:
        ap.error("no kvpool command: pass --kvpool-bin or set KVP_BIN")
    py, c = [], []
    for r in range(a.rounds):
        c.append(c_round(a.kvpool_bin, a.uri, a.op, a.size, a.count))
        py.append(python_round_subprocess(a.uri, a.op, a.size, a.count, a.seed + r))
        if not a.json:
            print("round %d: C %.2f GB/s  Python %.2f GB/s" % (r + 1, c[-1], py[-1]))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    res = {"uri": a.uri, "op": a.op, "size": a.size, "count": a.count, "rounds": a.rounds,
           "c_gbps": max(c), "python_gbps": max(py), "ratio": max(py) / max(c),
           "c_gbps_median": med(c), "python_gbps_median": med(py),
           "ratio_median": med(py) / med(c)}
    if a.json:
        print(json.dumps(res))
    else:
        print("kvpool.bench %s op=%s size=%d count=%d: C %.2f GB/s, Python %.2f GB/s, "
              "ratio %.2f (best of %d; medians %.2f / %.2f, ratio %.2f)"
              % (a.uri, a.op, a.size, a.count, res["c_gbps"], res["python_gbps"], res["ratio"],
                 a.rounds, res["c_gbps_median"], res["python_gbps_median"],
                 res["ratio_median"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
