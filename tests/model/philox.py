#!/usr/bin/python3
"""Philox 4x32-10 and the engine's keyed draws, bit for bit as src/core/philox.h and
src/kernels/cpu/dropout.h define them, for the PyTorch references (torch_moe.py).

Scalar functions (Python ints and floats, exact):
  philox4x32(counter, key)            counter: 4 uint32, key: 2 uint32 -> 4 uint32
  philox_key(seed, stream)            (uint32 low, uint32 high) of seed ^ (stream * golden)
  uniform_open0(bits)                 (bits >> 8) + 1) / 2^24: 24 bits in (0, 1], exact
  uniform_open0_f64(hi, lo)           53 bits in (0, 1]
  normal_from_block(r)                Box-Muller on the block's two 53-bit uniforms
  site_key(seed, layer, site)         philox_key(seed, ((layer << 32) | site) + 1)
  dropout_keep(seed, step, layer, site, p, sample, position, feature)
                                      uniform_open0(r[0]) > p, counter {feature, position,
                                      sample, step}

Vectorised twins (numpy, uint64 products so nothing overflows): philox4x32_np (counter words
as broadcastable uint32 arrays), uniform_open0_f64_np, normal_from_block_np (numpy's log/cos:
may differ from libm by an ulp), dropout_keep_np.

`philox.py --self-test` checks both against known answers printed by the C++ header (the
program `philox.py --cpp-source` prints, built with g++ -std=c++20 -I src) and against the
Random123 known-answer vectors of philox4x32-10.
"""

import math
import sys

import numpy as np

MASK32 = 0xFFFFFFFF
MASK64 = 0xFFFFFFFFFFFFFFFF
MUL0, MUL1 = 0xD2511F53, 0xCD9E8D57
WEYL0, WEYL1 = 0x9E3779B9, 0xBB67AE85
GOLDEN64 = 0x9E3779B97F4A7C15
TWO_PI = 6.283185307179586  # the literal of normal_from_block


# --- scalar, exact -----------------------------------------------------------------------

def philox4x32(counter, key):
    c0, c1, c2, c3 = (int(v) & MASK32 for v in counter)
    k0, k1 = (int(v) & MASK32 for v in key)
    for _ in range(10):
        p0 = MUL0 * c0
        p1 = MUL1 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32)
        k0 = (k0 + WEYL0) & MASK32
        k1 = (k1 + WEYL1) & MASK32
    return (c0, c1, c2, c3)


def philox_key(seed, stream):
    mixed = (int(seed) ^ ((int(stream) * GOLDEN64) & MASK64)) & MASK64
    return (mixed & MASK32, mixed >> 32)


def site_key(seed, layer, site):
    """The key of a dropout-like site: philox_key(seed, ((uint64(layer) << 32) | site) + 1)."""
    return philox_key(seed, (((int(layer) << 32) | int(site)) + 1) & MASK64)


def uniform_open0(bits):
    return ((int(bits) >> 8) + 1) * 2.0 ** -24


def uniform_open0_f64(hi, lo):
    bits = ((int(hi) << 21) ^ (int(lo) >> 11)) & ((1 << 53) - 1)
    return (bits + 1.0) * 2.0 ** -53


def normal_from_block(r):
    u1 = uniform_open0_f64(r[0], r[1])
    u2 = uniform_open0_f64(r[2], r[3])
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(TWO_PI * u2)


def dropout_keep(seed, step, layer, site, p, sample, position, feature):
    """kernels/cpu/dropout.h: keep = double(uniform_open0(r[0])) > p (p = 0: always kept)."""
    if p == 0:
        return True
    r = philox4x32((feature, position, sample, step), site_key(seed, layer, site))
    return uniform_open0(r[0]) > p


# --- vectorised ----------------------------------------------------------------------------

def _u32(x):
    return np.asarray(x).astype(np.uint64) & np.uint64(MASK32)


def philox4x32_np(c0, c1, c2, c3, key):
    """Counter words as broadcastable integer arrays (taken mod 2^32), key (k0, k1) ints.

    Returns four uint32 arrays of the broadcast shape. Products are formed in uint64 (a
    32 x 32-bit product fits), so no step overflows.
    """
    c0, c1, c2, c3 = np.broadcast_arrays(_u32(c0), _u32(c1), _u32(c2), _u32(c3))
    c0, c1, c2, c3 = c0.copy(), c1.copy(), c2.copy(), c3.copy()
    k0, k1 = int(key[0]) & MASK32, int(key[1]) & MASK32
    m32, s32 = np.uint64(MASK32), np.uint64(32)
    for _ in range(10):
        p0 = np.uint64(MUL0) * c0
        p1 = np.uint64(MUL1) * c2
        c0, c1, c2, c3 = ((p1 >> s32) ^ c1 ^ np.uint64(k0), p1 & m32,
                          (p0 >> s32) ^ c3 ^ np.uint64(k1), p0 & m32)
        k0 = (k0 + WEYL0) & MASK32
        k1 = (k1 + WEYL1) & MASK32
    return tuple(c.astype(np.uint32) for c in (c0, c1, c2, c3))


def uniform_open0_np(bits):
    return ((bits.astype(np.uint64) >> np.uint64(8)) + np.uint64(1)).astype(np.float64) * 2.0 ** -24


def uniform_open0_f64_np(hi, lo):
    bits = ((hi.astype(np.uint64) << np.uint64(21)) ^ (lo.astype(np.uint64) >> np.uint64(11)))
    bits &= np.uint64((1 << 53) - 1)
    return (bits.astype(np.float64) + 1.0) * 2.0 ** -53


def normal_from_block_np(r):
    u1 = uniform_open0_f64_np(r[0], r[1])
    u2 = uniform_open0_f64_np(r[2], r[3])
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(TWO_PI * u2)


def dropout_keep_np(seed, step, layer, site, p, sample, position, feature):
    """dropout_keep over broadcastable arrays of sample, position and feature indices."""
    shape = np.broadcast_shapes(np.shape(sample), np.shape(position), np.shape(feature))
    if p == 0:
        return np.ones(shape, dtype=bool)
    r = philox4x32_np(feature, position, sample, step, site_key(seed, layer, site))
    return uniform_open0_np(r[0]) > p


# --- self-test ------------------------------------------------------------------------------

CPP_SOURCE = r"""// Known answers of core/philox.h and kernels/cpu/dropout.h's rule, for philox.py.
// g++ -std=c++20 -I src kat.cc -o kat && ./kat
#include "core/philox.h"
#include <cinttypes>
#include <cstdio>
using namespace oases;
int main() {
  const PhiloxCounter counters[] = {{0, 0, 0, 0}, {0xffffffffu, 0xffffffffu, 0xffffffffu,
      0xffffffffu}, {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {7, 3, 1, 2}};
  const PhiloxKey keys[] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u},
                            {12345u, 67890u}};
  for (int i = 0; i < 4; ++i) {
    const auto r = philox4x32(counters[i], keys[i]);
    std::printf("block %08x %08x %08x %08x -> %.17g %.17g %.0f\n", r[0], r[1], r[2], r[3],
                normal_from_block(r), uniform_open0_f64(r[0], r[1]),
                static_cast<double>(uniform_open0(r[0])) * 16777216.0);
  }
  const std::uint64_t seeds[] = {0, 1234, 0xdeadbeefcafef00dull};
  for (auto seed : seeds)
    for (std::uint64_t stream : {1ull, 4294967300ull, 0x123456789abcdefull}) {
      const auto k = philox_key(seed, stream);
      std::printf("key %" PRIu64 " %" PRIu64 " -> %08x %08x\n", seed, stream, k[0], k[1]);
    }
  // Dropout / MoE draws: key = philox_key(seed, ((layer << 32) | site) + 1).
  int kept = 0;
  std::uint64_t mask = 0;
  for (std::uint32_t f = 0; f < 64; ++f) {
    const auto key = philox_key(1234, ((std::uint64_t{1} << 32) | 5) + 1);
    const auto r = philox4x32({f, 3, 2, 1}, key);
    const bool keep = static_cast<double>(uniform_open0(r[0])) > 0.25;
    kept += keep;
    mask |= std::uint64_t{keep} << f;
  }
  std::printf("dropout seed 1234 layer 1 site 5 p 0.25 sample 2 position 3 step 1 features "
              "0..63: kept %d mask %016" PRIx64 "\n", kept, mask);
  for (std::uint32_t e = 0; e < 4; ++e) {
    const auto key = philox_key(77, ((std::uint64_t{3} << 32) | 3) + 1);
    std::printf("noise seed 77 layer 3 expert %u position 5 sample 6 step 2: %.17g\n", e,
                normal_from_block(philox4x32({e, 5, 6, 2}, key)));
  }
  const auto key = philox_key(77, ((std::uint64_t{3} << 32) | 4) + 1);
  const auto r = philox4x32({0, 9, 1, 4}, key);
  std::printf("routing seed 77 layer 3 position 9 sample 1 step 4: %.17g\n",
              uniform_open0_f64(r[0], r[1]));
}
"""

# What CPP_SOURCE printed (g++ 12, x86-64), per counter/key pair: the block, then
# normal_from_block, uniform_open0_f64(r[0], r[1]) and uniform_open0(r[0]) * 2^24.
KAT_BLOCKS = [
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8),
     -0.12151797595308106, 0.39904647084896461, 6694889),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd),
     -1.1133151005615081, 0.25218435685545249, 4230952),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1),
     -0.24262491967130786, 0.81806934102950568, 13724927),
    ((7, 3, 1, 2), (12345, 67890), (0x8903e4ab, 0x9b652c36, 0x67c9266b, 0x76c24f91),
     -0.92639541645506762, 0.53521565618156752, 8979429),
]
# philox_key(seed, stream) -> (low, high).
KAT_KEYS = [
    (0, 1, (0x7f4a7c15, 0x9e3779b9)),
    (0, 4294967300, (0xfd29f054, 0xf82862fa)),
    (0, 81985529216486895, (0x9aeda89b, 0x0c93a7b7)),
    (1234, 1, (0x7f4a78c7, 0x9e3779b9)),
    (1234, 4294967300, (0xfd29f486, 0xf82862fa)),
    (1234, 81985529216486895, (0x9aedac49, 0x0c93a7b7)),
    (16045690984503111693, 1, (0xb5b48c18, 0x409ac756)),
    (16045690984503111693, 4294967300, (0x37d70059, 0x2685dc15)),
    (16045690984503111693, 81985529216486895, (0x50135896, 0xd23e1958)),
]
# Dropout (seed 1234, layer 1, site 5, p 0.25, sample 2, position 3, step 1), features 0..63:
# how many are kept and the keep mask (bit f = feature f).
KAT_DROPOUT = (43, 0x67eddd4d67f679cf)
# Router noise (seed 77, layer 3, site 3, position 5, sample 6, step 2), experts 0..3.
KAT_NOISE = [(0, -0.33158331218371273), (1, 0.16174299369711426), (2, 0.4247198474482074),
             (3, -0.40019238919258282)]
# Random routing's uniform (seed 77, layer 3, site 4, position 9, sample 1, step 4).
KAT_ROUTING = 0.73468974397084807

# Random123's published known answers for philox4x32-10 (kat_vectors).
RANDOM123_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
]


def self_test():
    failures = []

    def check(what, ok, detail=""):
        print(f"  {'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}",
              flush=True)
        if not ok:
            failures.append(what)

    print("philox.py self-test (numpy " + np.__version__ + ")", flush=True)
    for counter, key, want in RANDOM123_KAT:
        got = philox4x32(counter, key)
        check(f"Random123 KAT philox4x32-10 ctr {counter[0]:08x}.. key {key[0]:08x}..",
              got == want, " ".join(f"{v:08x}" for v in got))
    for counter, key, block, normal, u53, u24 in KAT_BLOCKS:
        r = philox4x32(counter, key)
        check(f"C++ block ctr {counter[0]:08x}.. key {key[0]:08x}..", r == block,
              " ".join(f"{v:08x}" for v in r))
        if normal is not None:
            check("  normal_from_block", normal_from_block(r) == normal,
                  f"{normal_from_block(r)!r} vs {normal!r}")
            check("  uniform_open0_f64", uniform_open0_f64(r[0], r[1]) == u53)
            check("  uniform_open0", uniform_open0(r[0]) * 2.0 ** 24 == u24)
        rv = philox4x32_np(*[np.array([v]) for v in counter], key)
        check("  numpy twin equals the scalar block", tuple(int(v[0]) for v in rv) == r)
        nv = float(normal_from_block_np(rv)[0])
        check("  numpy normal_from_block within 4 ulp of the exact one",
              abs(nv - normal_from_block(r)) <= 4 * np.spacing(abs(normal_from_block(r))))
    for seed, stream, want in KAT_KEYS:
        check(f"philox_key({seed}, {stream})", philox_key(seed, stream) == want,
              " ".join(f"{v:08x}" for v in philox_key(seed, stream)))
    if KAT_DROPOUT is not None:
        kept, mask = KAT_DROPOUT
        keep = [dropout_keep(1234, 1, 1, 5, 0.25, 2, 3, f) for f in range(64)]
        got_mask = sum(1 << f for f, k in enumerate(keep) if k)
        check("dropout_keep mask (seed 1234, layer 1, site 5, p 0.25)",
              sum(keep) == kept and got_mask == mask, f"kept {sum(keep)} mask {got_mask:016x}")
        keep_np = dropout_keep_np(1234, 1, 1, 5, 0.25, 2, 3, np.arange(64))
        check("dropout_keep_np equals dropout_keep", list(keep_np) == keep)
    for e, want in KAT_NOISE:
        got = normal_from_block(philox4x32((e, 5, 6, 2), site_key(77, 3, 3)))
        check(f"router noise expert {e} (seed 77, layer 3, site 3)", got == want,
              f"{got!r}")
    if KAT_ROUTING is not None:
        r = philox4x32((0, 9, 1, 4), site_key(77, 3, 4))
        got = uniform_open0_f64(r[0], r[1])
        check("random-routing uniform (seed 77, layer 3, site 4)", got == KAT_ROUTING,
              f"{got!r}")
    # The vectorised draws over a grid equal the scalar ones.
    gen = np.random.default_rng(5)
    c = [gen.integers(0, 2 ** 32, size=200, dtype=np.uint64) for _ in range(4)]
    key = philox_key(0xdeadbeefcafef00d, 123456789)
    rv = philox4x32_np(*c, key)
    scalar = [philox4x32([int(w[i]) for w in c], key) for i in range(200)]
    check("philox4x32_np equals philox4x32 on 200 random counters",
          all(tuple(int(w[i]) for w in rv) == scalar[i] for i in range(200)))
    exact = np.array([normal_from_block(s) for s in scalar])
    check("normal_from_block_np within 4 ulp of normal_from_block",
          bool(np.all(np.abs(normal_from_block_np(rv) - exact) <= 4 * np.spacing(np.abs(exact)))))
    u = np.array([uniform_open0_f64(s[0], s[1]) for s in scalar])
    check("uniform_open0_f64_np equals uniform_open0_f64",
          bool(np.all(uniform_open0_f64_np(rv[0], rv[1]) == u)))
    # Statistics of many draws: dropout keeps 1 - p, normals have mean 0 and variance 1.
    keep = dropout_keep_np(9, 3, 2, 5, 0.3, np.arange(64)[:, None, None],
                           np.arange(32)[None, :, None], np.arange(50)[None, None, :])
    rate = float(keep.mean())
    check("dropout keeps 1 - p of 102400 elements", abs(rate - 0.7) < 0.01, f"{rate:.4f}")
    eps = normal_from_block_np(philox4x32_np(np.arange(100000), 1, 2, 3, site_key(1, 0, 3)))
    check("normal draws: mean ~0, variance ~1", abs(eps.mean()) < 0.02
          and abs(eps.var() - 1) < 0.02, f"mean {eps.mean():.4f} var {eps.var():.4f}")
    if failures:
        print(f"FAIL: philox.py self-test: {len(failures)} check(s) failed: "
              + "; ".join(failures), file=sys.stderr, flush=True)
        return 1
    print("PASS: philox.py self-test", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--cpp-source"]:
        sys.stdout.write(CPP_SOURCE)
        sys.exit(0)
    if sys.argv[1:] != ["--self-test"]:
        print(f"usage: {sys.argv[0]} --self-test | --cpp-source", file=sys.stderr)
        sys.exit(2)
    sys.exit(self_test())
