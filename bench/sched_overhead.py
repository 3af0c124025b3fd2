"""Scheduler-side overhead per engine step: KvpoolConnector (the C scheduler
through kvpool.sched) against vLLM 0.32's MooncakeStoreScheduler, on the
same recorded steps of a real engine run, in the same run.

    python bench/sched_overhead.py RECORDING.pkl [--reps N] [--min-running 64]

RECORDING comes from tests/vllm/sched_record.py (in the vLLM venv,
PYTHONPATH=python, KVPOOL_LIB=build/libkvpool.so).  Each repetition replays
every recorded hook call into both schedulers, interleaved call by call, on
vLLM's own Request / KVCacheBlocks / SchedulerOutput objects rebuilt from the
snapshots (tests/vllm/sched_vs_vllm032.py's replay), with the recorded lookup
answers from stubs on both sides.  Timed: the hook calls only
(get_num_new_matched_tokens, update_state_after_alloc, request_finished and
build_connector_meta), summed per step (the calls since the previous build,
and the build).  A step's time is its fastest over the repetitions (the
garbage collector is off while timing); reported: the median over the steps
with at least --min-running scheduled requests, per side, and the ratio
(target: kvpool <= 50 % of Mooncake's).  Exit 1 when the target is missed.
"""
import argparse
import gc
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "vllm"))
import sched_vs_vllm032 as sv  # noqa: E402


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recording")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--min-running", type=int, default=64)
    ap.add_argument("--target", type=float, default=0.5)
    a = ap.parse_args(argv)
    rec = sv.load(a.recording)
    best = None
    for _ in range(a.reps):
        gc.collect()
        gc.disable()
        try:
            res = sv.replay(rec, compare=False)
        finally:
            gc.enable()
        cur = [(n, label, ns) for n, label, ns, _ in res.steps]
        new = [k for _, _, _, k in res.steps]
        best = cur if best is None else [
            (n, label, tuple(min(x, y) for x, y in zip(ns, bns)))
            for (n, label, ns), (_, _, bns) in zip(cur, best)]
    big = [ns for n, _, ns in best if n >= a.min_running]
    if not big:
        print("sched_overhead: no step with %d+ running requests in %s"
              % (a.min_running, a.recording))
        return 2
    k = statistics.median(ns[0] for ns in big) / 1e3
    m = statistics.median(ns[1] for ns in big) / 1e3
    ka = statistics.median(ns[0] for _, _, ns in best) / 1e3
    ma = statistics.median(ns[1] for _, _, ns in best) / 1e3
    print("sched_overhead: %s, %d steps, %d with %d+ running requests, best of %d"
          % (a.recording, len(best), len(big), a.min_running, a.reps))
    print("  median per step, %d+ running: kvpool %.1f us, vLLM 0.32 MooncakeStoreScheduler "
          "%.1f us, ratio %.1f %%" % (a.min_running, k, m, 100 * k / m))
    print("  median per step, all steps:   kvpool %.1f us, vLLM 0.32 MooncakeStoreScheduler "
          "%.1f us" % (ka, ma))
    labels = sorted({label for _, label, _ in best if label})
    for label in labels:
        st = [ns for n, lb, ns in best if lb == label and n >= a.min_running]
        if st:
            print("    %-22s %3d steps: kvpool %.1f us, vllm032 %.1f us"
                  % (label, len(st), statistics.median(s[0] for s in st) / 1e3,
                     statistics.median(s[1] for s in st) / 1e3))
    for what, pick in (("with new requests (lookups, loads)", lambda j: new[j] > 0),
                       ("without (decode, running chunks)", lambda j: new[j] == 0)):
        st = [best[j][2] for j in range(len(best)) if best[j][0] >= a.min_running and pick(j)]
        if st:
            print("    steps %-36s %3d: kvpool %.1f us, vllm032 %.1f us"
                  % (what, len(st), statistics.median(s[0] for s in st) / 1e3,
                     statistics.median(s[1] for s in st) / 1e3))
    ok = k <= a.target * m
    print("  target kvpool <= %d %% of Mooncake's: %s" % (100 * a.target,
                                                          "met" if ok else "MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
