#!/usr/bin/python3
"""Reference check of `kvpool hash` against an independent Python computation.

The Python side reproduces vLLM's block hashing (vllm/utils/hashing.py
sha256_cbor / xxhash_cbor, vllm/v1/core/kv_cache_utils.py init_none_hash,
hash_block_tokens, generate_block_hash_extra_keys and the request block
hasher) with Debian's python3-cbor2, hashlib and python3-xxhash, and never
calls into the C code.  For each random case it runs `$KVP_BIN hash ...` and
compares every byte of every hash.  It also checks that bad input exits 2
with one line on stderr.

usage: hash_ref.py [--count N] [--rng-seed S]   (env: KVP_BIN)
Exit status 0 only if every case passed.  Last line: "N passed, M failed".
"""
import argparse
import hashlib
import os
import random
import subprocess
import sys

import cbor2
import xxhash


def sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash_cbor(obj):
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


HASH_FNS = {"sha256_cbor": sha256_cbor, "xxhash_cbor": xxhash_cbor}


def mm_extra_keys(mm_items, start, end, start_idx, tagged=False):
    """vLLM's _gen_mm_extra_hash_keys; mm_items: [(identifier, offset, length)] sorted.
    tagged: vLLM 0.32's ("mm", identifier, offset), else 0.27's (identifier, offset)."""
    keys = []
    if not mm_items:
        return keys, start_idx
    last_off, last_len = mm_items[-1][1], mm_items[-1][2]
    if last_off + last_len <= start:
        return keys, start_idx
    if start_idx < 0:
        start_idx = len(mm_items) + start_idx
    idx = start_idx
    while idx < len(mm_items):
        ident, off, length = mm_items[idx]
        if end > off:
            if start >= off + length:
                idx += 1
                continue
            keys.append(("mm", ident, off - start) if tagged else (ident, off - start))
            if end >= off + length:
                idx += 1
            else:
                break
        else:
            break
    return keys, idx


def block_hashes(algo, seed, block_size, tokens, lora=None, salt=None, mm_items=(),
                 keys="untagged", lora_path=""):
    """request.block_hashes for a request hashed from token 0 in one call.
    keys: "untagged" (vLLM 0.27's bare extra keys) or "tagged" (vLLM 0.32's
    ("lora", name, path), ("mm", id, offset), ("cache_salt", salt))."""
    h = HASH_FNS[algo]
    tagged = keys == "tagged"
    none_hash = h(seed)  # init_none_hash with PYTHONHASHSEED=seed
    out = []
    parent = None
    mm_idx = 0
    start = 0
    while start + block_size <= len(tokens):
        end = start + block_size
        mm_keys, mm_idx = mm_extra_keys(list(mm_items), start, end, mm_idx, tagged)
        if lora is None:
            lora_keys = []
        else:
            lora_keys = [("lora", lora, lora_path)] if tagged else [lora]
        if start == 0 and salt:
            salt_keys = [("cache_salt", salt)] if tagged else [salt]
        else:
            salt_keys = []
        extra = lora_keys + mm_keys + salt_keys
        extra = tuple(extra) if extra else None
        if not parent:
            parent = none_hash
        bh = h((parent, tuple(tokens[start:end]), extra))
        out.append(bh)
        parent = bh
        start = end
    return out


def rand_text(rng, allow_empty=True):
    alphabets = [
        "abcdefghijklmnopqrstuvwxyz0123456789-_.",
        "ABCxyz019 :@/=+",
        "äöüßéñ漢字テスト😀\u00a0\u07ff\u0800\uffff\U00010000\U0010ffff",
    ]
    n = rng.randint(0 if allow_empty else 1, 24)
    a = rng.choice(alphabets) if rng.random() < 0.7 else "".join(alphabets)
    return "".join(rng.choice(a) for _ in range(n))


def rand_token(rng):
    r = rng.random()
    if r < 0.2:
        return rng.randint(0, 23)
    if r < 0.35:
        return rng.randint(24, 255)
    if r < 0.6:
        return rng.randint(256, 65535)
    if r < 0.9:
        return rng.randint(65536, 2**32 - 1)
    if r < 0.95:
        return rng.randint(2**32, 2**63 - 1)
    return rng.randint(-(2**63), -1)


def rand_mm(rng, ntok):
    items = []
    pos = rng.randint(0, max(0, ntok // 3))
    for _ in range(rng.randint(1, 5)):
        length = rng.randint(1, max(1, ntok // 2 + 1))
        ident = rng.choice([
            "%064x" % rng.getrandbits(256),
            "lora-x:%032x" % rng.getrandbits(128),  # an identifier holding ':'
            rand_text(rng, allow_empty=False),
        ])
        items.append((ident, pos, length))
        pos += length + rng.choice([0, 0, 1, rng.randint(0, 40)])
    return items


def run_cli(kvp_bin, algo, seed, block_size, tokens, lora, salt, mm_items, keys="untagged",
            lora_path=""):
    args = [kvp_bin, "hash", "--algo", algo, "--seed", seed, "--block-size", str(block_size),
            "--keys", keys]
    if lora is not None:
        args += ["--lora", lora]
        if keys == "tagged":
            args += ["--lora-path", lora_path]
    if salt is not None:
        args += ["--salt", salt]
    for ident, off, length in mm_items:
        args += ["--mm", "%s:%d:%d" % (ident, off, length)]
    args += ["--"] + [str(t) for t in tokens]
    bargs = [a.encode("utf-8") if isinstance(a, str) else a for a in args]
    try:
        return subprocess.run(bargs, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:  # a missing or unrunnable binary is a failure, not a traceback
        return subprocess.CompletedProcess(bargs, 127, b"", str(e).encode())


def fixed_cases():
    """Boundary cases first, then the random ones."""
    seq = list(range(100, 164))
    return [
        ("sha256_cbor", "0", 16, list(range(16)), None, None, []),  # scenario 32
        ("xxhash_cbor", "0", 16, list(range(16)), None, None, []),
        ("sha256_cbor", "0", 16, [], None, None, []),
        ("sha256_cbor", "0", 16, list(range(15)), None, None, []),
        ("sha256_cbor", "", 1, [0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1], None, None, []),
        ("sha256_cbor", "42", 4, [2**63 - 1, -(2**63), -1, -24, -25, -256, -257, 0], None, None, []),
        ("sha256_cbor", "0", 16, seq, "", None, []),      # empty LoRA name is still a key
        ("sha256_cbor", "0", 16, seq, None, "", []),      # empty salt is no key
        ("xxhash_cbor", "7", 16, seq, "my-lora", "s@lt", []),
        ("sha256_cbor", "0", 16, seq, None, None, [("img", 16, 16)]),   # exactly block 1
        ("sha256_cbor", "0", 16, seq, None, None, [("img", 8, 40)]),    # spans blocks 0..2
        ("sha256_cbor", "0", 16, seq, None, None, [("a", 0, 4), ("b", 4, 4), ("c", 12, 30)]),
        ("sha256_cbor", "0", 16, seq, None, None, [("a", 0, 40), ("b", 2, 3)]),  # nested
        ("xxhash_cbor", "0", 16, seq, "L", "salt", [("a", 5, 100)]),    # past the end
        ("sha256_cbor", "4294967295", 1000, list(range(2000)), None, None, []),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=240, help="random cases (default 240)")
    ap.add_argument("--rng-seed", type=int, default=None)
    a = ap.parse_args()
    kvp_bin = os.environ.get("KVP_BIN")
    if not kvp_bin:
        print("KVP_BIN is not set", file=sys.stderr)
        return 2
    rng_seed = a.rng_seed if a.rng_seed is not None else random.randrange(2**32)
    print("hash_ref: rng seed %d (rerun with --rng-seed %d)" % (rng_seed, rng_seed))
    rng = random.Random(rng_seed)

    cases = fixed_cases()
    for _ in range(a.count):
        algo = rng.choice(sorted(HASH_FNS))
        seed = str(rng.randrange(2**32)) if rng.random() < 0.6 else rand_text(rng)
        block_size = rng.choice([1, 2, 3, 4, 5, 8, 16, 16, 16, 32, 64, 128, 256])
        ntok = rng.randint(0, min(8 * block_size + rng.randint(0, block_size), 700))
        tokens = [rand_token(rng) for _ in range(ntok)]
        kind = rng.random()
        lora = rand_text(rng) if rng.random() < 0.35 else None
        salt = rand_text(rng) if rng.random() < 0.35 else None
        mm = rand_mm(rng, ntok) if rng.random() < 0.45 else []
        if kind < 0.25:  # a quarter without any extra key
            lora, salt, mm = None, None, []
        cases.append((algo, seed, block_size, tokens, lora, salt, mm))
    # Every case in both spellings of the extra keys: vLLM 0.27's bare
    # values and vLLM 0.32's tagged tuples (the LoRA path: random text).
    cases = [c + ("untagged", "") for c in cases] + \
            [c + ("tagged", rand_text(rng)) for c in cases]

    passed = failed = blocks = with_extras = 0
    for i, (algo, seed, bs, tokens, lora, salt, mm, keys, lora_path) in enumerate(cases):
        want = block_hashes(algo, seed, bs, tokens, lora, salt, mm, keys, lora_path)
        r = run_cli(kvp_bin, algo, seed, bs, tokens, lora, salt, mm, keys, lora_path)
        got = r.stdout.decode("ascii", "replace").split()
        want_hex = [h.hex() for h in want]
        if r.returncode != 0 or got != want_hex:
            failed += 1
            print("FAIL case %d: algo=%s seed=%r bs=%d ntok=%d lora=%r salt=%r mm=%r rc=%d"
                  % (i, algo, seed, bs, len(tokens), lora, salt, mm, r.returncode))
            print("  stderr: %s" % r.stderr.decode("utf-8", "replace").strip())
            for j in range(max(len(got), len(want_hex))):
                g = got[j] if j < len(got) else "-"
                w = want_hex[j] if j < len(want_hex) else "-"
                if g != w:
                    print("  block %d: got %s want %s" % (j, g, w))
                    break
        else:
            passed += 1
            blocks += len(want)
            with_extras += bool(lora is not None or salt or mm)
    print("hash_ref: %d token sequences (%d with extra keys), %d block hashes compared"
          % (len(cases), with_extras, blocks))

    # No --seed with sha256_cbor: vLLM 0.32's fixed seed "vllm-none-hash".
    toks = [7, 8, 9, 10, 11, 12, 13, 14]
    r = subprocess.run([kvp_bin, "hash", "--block-size", "4"] + [str(t) for t in toks],
                       capture_output=True)
    want = [h.hex() for h in block_hashes("sha256_cbor", "vllm-none-hash", 4, toks)]
    if r.returncode != 0 or r.stdout.decode().split() != want:
        failed += 1
        print("FAIL no --seed: want the default seed 'vllm-none-hash' (%s), got %r"
              % (want, r.stdout.decode()))
    else:
        passed += 1

    # Bad input: exit status 2, exactly one line on stderr, nothing on stdout.
    bad_inputs = [
        ["hash", "--algo", "xxhash_cbor", "--block-size", "4", "1", "2", "3", "4"],  # no --seed
        ["hash", "--seed", "0", "1", "2"],                                    # no --block-size
        ["hash", "--seed", "0", "--block-size", "4", "1", "x2"],              # bad token
        ["hash", "--seed", "0", "--block-size", "4", "99999999999999999999"], # overflow
        ["hash", "--seed", "0", "--block-size", "4", "+1"],                   # sign
        ["hash", "--seed", "0", "--block-size", "4", " 1"],                   # blank
        ["hash", "--seed", "0", "--block-size", "4", "1.5"],
        ["hash", "--seed", "0", "--block-size", "0", "1"],                    # block size 0
        ["hash", "--seed", "0", "--block-size", "-3", "1"],
        ["hash", "--algo", "md5", "--seed", "0", "--block-size", "4", "1"],   # unknown algo
        ["hash", "--algo", "sha256", "--seed", "0", "--block-size", "4", "1"],  # pickle algo
        ["hash", "--seed", "0", "--block-size", "4", "--mm", "x:1", "1"],     # bad --mm
        ["hash", "--seed", "0", "--block-size", "4", "--mm", "a:8:2", "--mm", "b:1:2",
         "1", "2", "3", "4"],                                                  # unsorted mm
        ["hash", "--seed", "0", "--block-size", "4", "--mm", "a:-1:2", "1"],  # negative offset
        ["hash", "--seed", "0", "--block-size", "4", "--mm", "a:1:0", "1"],   # zero length
        [b"hash", b"--seed", b"\xff\xfe", b"--block-size", b"1", b"1"],       # seed not UTF-8
        [b"hash", b"--seed", b"0", b"--lora", b"\xc0\x80", b"--block-size", b"1", b"1"],
        ["hash", "--seed", "0", "--bogus", "1"],                              # unknown option
        ["hash", "--seed"],                                                   # missing value
    ]
    env = dict(os.environ, KVP_LOG_LEVEL="warn")
    for args in bad_inputs:
        bargs = [kvp_bin.encode()] + [x if isinstance(x, bytes) else x.encode() for x in args]
        try:
            r = subprocess.run(bargs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        except OSError as e:
            r = subprocess.CompletedProcess(bargs, 127, b"", str(e).encode())
        lines = r.stderr.decode("utf-8", "replace").splitlines()
        if r.returncode == 2 and len(lines) == 1 and not r.stdout:
            passed += 1
        else:
            failed += 1
            print("FAIL bad input %r: rc=%d stdout=%r stderr=%r"
                  % (args, r.returncode, r.stdout[:200], lines))

    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
