"""vLLM's own block hashing (vllm.v1.core.kv_cache_utils, the installed 0.32)
against kvpool's (`kvpool hash`, the C hasher of include/kvpool/hash.h):
and the kvpool package's (kvpool.hash): sha256_cbor and xxhash_cbor, with
and without extra keys (LoRA name and
path, multimodal items, cache salt), fixed and random cases; and NONE_HASH
without PYTHONHASHSEED (vLLM 0.32: sha256_cbor's fixed seed).

Usage: hash_vs_vllm.py KVPOOL_BIN [RNG_SEED]; exit 0 when everything matched.
"""
import os
import random
import subprocess
import sys
from types import SimpleNamespace as NS

from vllm.utils.hashing import sha256_cbor, xxhash_cbor
from vllm.v1.core import kv_cache_utils as K

FNS = {"sha256_cbor": sha256_cbor, "xxhash_cbor": xxhash_cbor}


def vllm_hashes(algo, bs, toks, lora=None, lora_path="", salt=None, mm=()):
    """request.block_hashes as vLLM's block hasher computes them: its
    generate_block_hash_extra_keys and hash_block_tokens over a request
    carrying only what they read."""
    fn = FNS[algo]
    K.init_none_hash(fn)
    feats = [NS(identifier=i, mm_position=NS(offset=o, length=n)) for i, o, n in mm]
    lreq = NS(lora_name=lora, lora_path=lora_path) if lora is not None else None
    req = NS(mm_features=feats, lora_request=lreq, cache_salt=salt, prompt_embeds=None)
    out, parent, mm_idx = [], None, 0
    for start in range(0, len(toks) - bs + 1, bs):
        extra, mm_idx = K.generate_block_hash_extra_keys(req, start, start + bs, mm_idx)
        h = K.hash_block_tokens(fn, parent, toks[start:start + bs], extra)
        out.append(bytes(h).hex())
        parent = h
    return out


def kvpool_hashes(kvp, algo, bs, toks, seed, lora=None, lora_path="", salt=None, mm=()):
    a = [kvp, "hash", "--algo", algo, "--block-size", str(bs)]
    if seed is not None:
        a += ["--seed", seed]
    if lora is not None:
        a += ["--lora", lora, "--lora-path", lora_path]
    if salt is not None:
        a += ["--salt", salt]
    for i, o, n in mm:
        a += ["--mm", "%s:%d:%d" % (i, o, n)]
    r = subprocess.run(a + ["--"] + [str(t) for t in toks], capture_output=True, text=True)
    return r.stdout.split()


def package_hashes(algo, bs, toks, seed, lora=None, lora_path="", salt=None, mm=()):
    """The same through the kvpool package (kvpool.hash over libkvpool.so)."""
    from kvpool import hash as kh
    extra = {}
    if lora is not None:
        extra["lora_name"], extra["lora_path"] = lora, lora_path
    if salt is not None:
        extra["cache_salt"] = salt
    if mm:
        extra["mm_items"] = list(mm)
    return [h.hex() for h in kh.block_hashes(algo, seed, bs, toks, extra=extra or None)]


def main():
    kvp = sys.argv[1]
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    seed = os.environ.get("PYTHONHASHSEED")
    toks = list(range(1000, 1100))
    cases = [
        dict(),
        dict(lora="L", lora_path="/adapters/L"),
        dict(lora="", lora_path=""),
        dict(salt="salty"),
        dict(mm=[("img", 5, 40), ("aud", 60, 10)]),
        dict(mm=[("a", 0, 16), ("b", 16, 16)]),
        dict(lora="x", salt="s", mm=[("a", 0, 16)]),
    ]
    for _ in range(20):
        c = {}
        if rng.random() < 0.5:
            c["lora"], c["lora_path"] = "l%d" % rng.randrange(99), "/p/%d" % rng.randrange(99)
        if rng.random() < 0.5:
            c["salt"] = "s%d" % rng.randrange(99)
        if rng.random() < 0.6:
            pos, mm = 0, []
            while pos < 90 and len(mm) < 4:
                pos += rng.randrange(0, 20)
                n = rng.randrange(1, 30)
                mm.append(("m%d" % len(mm), pos, n))
                pos += n
            c["mm"] = mm
        cases.append(c)
    ok = total = 0
    # Without PYTHONHASHSEED vLLM 0.32 seeds xxhash_cbor at random (nothing
    # can match it), sha256_cbor with its fixed "vllm-none-hash".
    for algo in sorted(FNS) if seed is not None else ["sha256_cbor"]:
        for c in cases:
            for bs in (16, 32):
                want = vllm_hashes(algo, bs, toks, **c)
                got = kvpool_hashes(kvp, algo, bs, toks, seed, **c)
                pkg = package_hashes(algo, bs, toks, seed, **c)
                total += 1
                if want == got == pkg and want:
                    ok += 1
                else:
                    print("MISMATCH %s bs=%d %r: vllm %s kvpool hash %s kvpool.hash %s"
                          % (algo, bs, c, want[:1], got[:1], pkg[:1]))
    print("hash_vs_vllm: %d of %d token lists hashed alike by vLLM %s, kvpool hash and "
          "kvpool.hash (PYTHONHASHSEED=%s)"
          % (ok, total, __import__("vllm").__version__, seed))
    return 0 if ok == total else 1


if __name__ == "__main__":
    sys.exit(main())
