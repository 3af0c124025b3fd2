"""kvpool.hash against two independent references: tests/integration/hash_ref.py
(vLLM's hashing redone with cbor2/hashlib/xxhash, never calling C) and the
`kvpool hash` command; store keys against connectors-spec scenario 11."""
import hashlib
import random
import subprocess
import unittest

import support
import kvpool
from kvpool import hash as kh

try:
    import hash_ref  # tests/integration/hash_ref.py; needs cbor2 and xxhash
    import cbor2
except ImportError as e:
    hash_ref = None
    MISSING = str(e)


def ref_extra(lora, salt, mm):
    extra = {}
    if lora is not None:
        extra["lora_name"] = lora
    if salt is not None:
        extra["cache_salt"] = salt
    if mm:
        extra["mm_items"] = mm
    return extra or None


@unittest.skipIf(hash_ref is None, "hash_ref.py needs cbor2 and xxhash: %s"
                 % (MISSING if hash_ref is None else ""))
class HashVsPythonReferenceTest(unittest.TestCase):
    def check(self, case, lora_path="lp/x"):
        """Both spellings of the extra keys: vLLM 0.27's bare, 0.32's tagged."""
        algo, seed, bs, tokens, lora, salt, mm = case
        for keys in ("untagged", "tagged"):
            want = hash_ref.block_hashes(algo, seed, bs, tokens, lora, salt, mm, keys, lora_path)
            extra = ref_extra(lora, salt, mm)
            if extra and keys == "tagged":
                extra["lora_path"] = lora_path
            got = kh.block_hashes(algo, seed, bs, tokens, extra, keys=keys)
            self.assertEqual(got, want, case[:3] + (len(tokens), lora, salt, mm, keys))
        tagged_differs = lora is not None or salt or mm
        if tagged_differs and want:
            self.assertNotEqual(kh.block_hashes(algo, seed, bs, tokens, ref_extra(lora, salt, mm),
                                                keys="untagged"), want)
        return bool(tagged_differs), len(want)

    def test_fixed_cases_both_algos_with_and_without_extra_keys(self):
        algos = set()
        extras = 0
        for case in hash_ref.fixed_cases():
            with self.subTest(case=case[:3] + (len(case[3]),)):
                e, _n = self.check(case)
                extras += e
                algos.add(case[0])
        self.assertEqual(algos, {"sha256_cbor", "xxhash_cbor"})
        self.assertGreaterEqual(extras, 5)

    def test_random_cases_match_the_reference(self):
        seed = random.randrange(2**32)
        rng = random.Random(seed)
        counts = {(a, e): 0 for a in ("sha256_cbor", "xxhash_cbor") for e in (False, True)}
        for i in range(120):
            algo = ("sha256_cbor", "xxhash_cbor")[i % 2]
            bs = rng.choice([1, 3, 16, 32, 64])
            tokens = [hash_ref.rand_token(rng) for _ in range(rng.randint(0, 6 * bs))]
            lora = hash_ref.rand_text(rng) if rng.random() < 0.4 else None
            salt = hash_ref.rand_text(rng) if rng.random() < 0.4 else None
            mm = hash_ref.rand_mm(rng, len(tokens)) if tokens and rng.random() < 0.4 else []
            if i % 4 < 2:
                lora, salt, mm = None, None, []
            seed_s = str(rng.randrange(2**32)) if rng.random() < 0.6 else hash_ref.rand_text(rng)
            with self.subTest(rng_seed=seed, case=i):
                e, _n = self.check((algo, seed_s, bs, tokens, lora, salt, mm),
                                   lora_path=hash_ref.rand_text(rng))
                counts[(algo, e)] += 1
        self.assertTrue(all(counts.values()), counts)

    def test_scenario_32_none_hash_and_block_0(self):
        nh = kh.none_hash("sha256_cbor", "0")
        self.assertEqual(nh, hashlib.sha256(cbor2.dumps("0", canonical=True)).digest())
        b0 = hashlib.sha256(cbor2.dumps([nh, list(range(16)), None], canonical=True)).digest()
        self.assertEqual(kh.block_hashes("sha256_cbor", "0", 16, range(16)), [b0])

    def test_prompt_embeds_digests_are_the_last_extra_key(self):
        tokens = list(range(40))
        d0, d1 = hashlib.sha256(b"e0").digest(), hashlib.sha256(b"e1").digest()
        nh = kh.none_hash("sha256_cbor", "0")
        spellings = {
            "untagged": (["s", d0], [d1]),
            "tagged": ([["cache_salt", "s"], ["prompt_embeds", d0]], [["prompt_embeds", d1]]),
        }
        for keys, (x0, x1) in spellings.items():
            with self.subTest(keys=keys):
                got = kh.block_hashes("sha256_cbor", "0", 16, tokens,
                                      {"cache_salt": "s", "prompt_embeds_sha256": d0 + d1},
                                      keys=keys)
                h0 = hashlib.sha256(cbor2.dumps([nh, tokens[:16], x0], canonical=True)).digest()
                h1 = hashlib.sha256(cbor2.dumps([h0, tokens[16:32], x1], canonical=True)).digest()
                self.assertEqual(got, [h0, h1])

    def test_unset_seed_is_vllm_0_32s_fixed_seed_for_sha256_cbor(self):
        self.assertEqual(kh.none_hash("sha256_cbor", None),
                         hashlib.sha256(cbor2.dumps("vllm-none-hash", canonical=True)).digest())


class HashVsCliTest(unittest.TestCase):
    def cli(self, algo, seed, bs, tokens, lora=None, salt=None, mm=(), keys="tagged"):
        args = [support.KVP_BIN, "hash", "--algo", algo, "--seed", seed, "--block-size", str(bs),
                "--keys", keys]
        if lora is not None:
            args += ["--lora", lora]
            if keys == "tagged":
                args += ["--lora-path", "/loras/a"]
        if salt is not None:
            args += ["--salt", salt]
        for ident, off, n in mm:
            args += ["--mm", "%s:%d:%d" % (ident, off, n)]
        out = subprocess.run(args + ["--"] + [str(t) for t in tokens], check=True,
                             stdout=subprocess.PIPE).stdout.decode()
        return [bytes.fromhex(x) for x in out.split()]

    def test_block_hashes_equal_kvpool_hash_output(self):
        seq = list(range(1000, 1100))
        cases = [
            ("sha256_cbor", "0", 16, seq, None, None, []),
            ("xxhash_cbor", "0", 16, seq, None, None, []),
            ("sha256_cbor", "123", 32, seq, "lora-a", "salt", [("img", 10, 40)]),
            ("xxhash_cbor", "x", 8, seq + [-5, 2**40], "", None, [("a", 0, 4), ("b", 30, 9)]),
        ]
        for (algo, seed, bs, tokens, lora, salt, mm), keys in [
                (c, k) for c in cases for k in ("tagged", "untagged")]:
            with self.subTest(algo=algo, bs=bs, lora=lora, keys=keys):
                want = self.cli(algo, seed, bs, tokens, lora, salt, mm, keys)
                self.assertTrue(want)
                extra = ref_extra(lora, salt, mm)
                if extra and lora is not None and keys == "tagged":
                    extra["lora_path"] = "/loras/a"
                self.assertEqual(kh.block_hashes(algo, seed, bs, tokens, extra, keys=keys), want)
                self.assertEqual(len(want[0]), 32 if algo == "sha256_cbor" else 16)

    def test_default_spelling_is_tagged_like_the_clis(self):
        seq = list(range(64))
        extra = {"lora_name": "l", "cache_salt": "s"}
        out = subprocess.run([support.KVP_BIN, "hash", "--seed", "0", "--block-size", "16",
                              "--lora", "l", "--salt", "s", "--"] + [str(t) for t in seq],
                             check=True, stdout=subprocess.PIPE).stdout.decode()
        default = kh.block_hashes("sha256_cbor", "0", 16, seq, extra)
        self.assertEqual(default, [bytes.fromhex(x) for x in out.split()])
        self.assertEqual(default, kh.block_hashes("sha256_cbor", "0", 16, seq,
                                                  dict(extra, lora_path=""), keys="tagged"))
        self.assertNotEqual(default, kh.block_hashes("sha256_cbor", "0", 16, seq, extra,
                                                     keys="untagged"))


class HashArgumentsTest(unittest.TestCase):
    def test_unset_seed_fixed_for_sha256_cbor_random_for_xxhash_cbor(self):
        self.assertEqual(kh.none_hash("sha256_cbor", None), kh.none_hash("sha256_cbor", kh.DEFAULT_SEED))
        self.assertEqual(kh.block_hashes("sha256_cbor", None, 4, range(4)),
                         kh.block_hashes("sha256_cbor", "vllm-none-hash", 4, range(4)))
        a, b = kh.none_hash("xxhash_cbor", None), kh.none_hash("xxhash_cbor", None)
        self.assertEqual(len(a), 16)
        self.assertNotEqual(a, b)
        self.assertNotEqual(kh.block_hashes("xxhash_cbor", None, 4, range(4)),
                            kh.block_hashes("xxhash_cbor", None, 4, range(4)))

    def test_partial_blocks_are_not_hashed(self):
        self.assertEqual(kh.block_hashes("sha256_cbor", "0", 16, range(15)), [])
        self.assertEqual(len(kh.block_hashes("sha256_cbor", "0", 16, range(47))), 2)

    def test_bad_arguments_raise_the_librarys_status(self):
        with self.assertRaises(kvpool.Unsupported):  # pickle-based: not reproducible outside Python
            kh.block_hashes("sha256", "0", 4, range(4))
        with self.assertRaises(kvpool.InvalidArg):
            kh.block_hashes("md5", "0", 4, range(4))
        with self.assertRaises(kvpool.InvalidArg):
            kh.block_hashes("sha256_cbor", "0", 0, range(4))
        with self.assertRaises(kvpool.InvalidArg):  # mm items out of order
            kh.block_hashes("sha256_cbor", "0", 4, range(8),
                            {"mm_items": [("a", 5, 1), ("b", 1, 1)]})
        with self.assertRaises(kvpool.InvalidArg):  # not valid UTF-8
            kh.block_hashes("sha256_cbor", "\udcff", 4, range(4))
        with self.assertRaises(kvpool.InvalidArg):  # too few prompt-embeds digests
            kh.block_hashes("sha256_cbor", "0", 4, range(8), {"prompt_embeds_sha256": b"\0" * 32})
        with self.assertRaises(TypeError):
            kh.block_hashes(None, "0", 4, range(4))
        with self.assertRaises(TypeError):
            kh.block_hashes("sha256_cbor", 0, 4, range(4))
        with self.assertRaises(ValueError):
            kh.block_hashes("sha256_cbor", "0", 4, range(4), {"lora": "x"})
        with self.assertRaises(ValueError):
            kh.block_hashes("sha256_cbor", "0", 4, range(4), keys="bare")
        for big in (1 << 63, -(1 << 63) - 1):  # would wrap silently in a C int64
            with self.assertRaises(ValueError):
                kh.block_hashes("sha256_cbor", "0", 1, [1, big])
        self.assertEqual(len(kh.block_hashes("sha256_cbor", "0", 1, iter([(1 << 63) - 1, -(1 << 63)]))), 2)


class StoreKeyTest(unittest.TestCase):
    def test_scenario_11_key_string(self):
        h = bytes([0xab] * 32)
        self.assertEqual(kh.store_key("/m/Llama-3/", h),
                         "Llama-3@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + "ab" * 32)
        self.assertEqual(kh.store_key("/m/Llama-3/", h, cache_prefix="x"),
                         "x@Llama-3@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + "ab" * 32)

    def test_every_field_round_trips_through_parse(self):
        h = bytes(range(16))
        k = kh.store_key("org/model-7b", h, tp_rank=3, pcp_rank=1, dcp_rank=2, pp_rank=4,
                         group=5, cache_prefix="tenant@a")
        self.assertEqual(k, "tenant@a@model-7b@tp_rank:3@pcp1@dcp2@pp_rank:4@group:5@"
                         + h.hex())
        self.assertEqual(kh.parse_store_key(k), {
            "cache_prefix": "tenant@a", "model": "model-7b", "tp_rank": 3, "pcp_rank": 1,
            "dcp_rank": 2, "pp_rank": 4, "group": 5, "hash": h})
        self.assertEqual(kh.parse_store_key(k.encode())["model"], "model-7b")
        self.assertEqual(kh.parse_store_key(kh.store_key("m", b"\x01"))["cache_prefix"], "")

    def test_block_hash_keys_are_pool_keys(self):
        hs = kh.block_hashes("sha256_cbor", "0", 16, range(64))
        keys = [kh.store_key("/m/Llama-3", h) for h in hs]
        with kvpool.Pool("embedded://?capacity=4MiB") as p:
            p.put_many(keys[:3], [b"kv"] * 3)
            self.assertEqual(p.prefix(keys), 3)

    def test_bad_store_keys(self):
        with self.assertRaises(kvpool.InvalidArg):
            kh.store_key("///", b"\x01")  # no model name left
        with self.assertRaises(kvpool.InvalidArg):
            kh.store_key("a@b", b"\x01")  # '@' in the model name
        with self.assertRaises(ValueError):
            kh.store_key("m", b"")
        with self.assertRaises(TypeError):
            kh.store_key("m", "ab")
        with self.assertRaises(kvpool.KeyLength):
            kh.store_key("m", b"\x01", cache_prefix="p" * 600)
        for bad in ("m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ABCD",
                    "m@tp_rank:01@pcp0@dcp0@pp_rank:0@group:0@ab",
                    "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@abc", "garbage"):
            with self.subTest(key=bad):
                with self.assertRaises(kvpool.Decode):
                    kh.parse_store_key(bad)
        with self.assertRaises(kvpool.KeyLength):
            kh.parse_store_key("")


if __name__ == "__main__":
    unittest.main()
