"""Bounded integer draws equal to numpy's `Generator.integers(lo, hi, size)` (int64, a range
below 2**32) on a PCG64 generator, about 4x faster (the inputs of Llama-2-7B's i8 weights are
hundreds of millions of draws, made before every `lpu run`).

numpy draws each value with Lemire's method from one 32-bit output of the generator: m = u32 *
r (r = hi - lo), value lo + (m >> 32), the draw rejected (the next u32 taken) while the low 32
bits of m are below (2**32 - r) % r. PCG64 makes its 32-bit outputs as the low, then the high
half of each 64-bit output, keeping an unused high half in its state (`has_uint32`,
`uinteger`). `draw` takes the 64-bit outputs in bulk (`random_raw`), applies the method in a
jitted loop, and leaves the state as numpy's own draws would (the same outputs, the same half
kept), so every later draw is the same too.

`seek` puts a generator where the k-th of a run of such draws starts, assuming none of the
draws before it is rejected (PCG64 `advance`); `Plan` and `draw_range` let processes make the
parts of one run of draws at once (emulator/system.py), each checking that its part ends where
`seek` says (else a draw was rejected: the parts after it are misplaced). `draw_rows` makes
scattered runs of a plan's draws (a tensor-parallel chip's columns) with PCG64 itself, jitted:
the generator jumps from run to run (PCG64's own jump-ahead)."""
import sys
from dataclasses import dataclass

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

CHUNK = 1 << 20


@njit(cache=True)
def lemire(u32, r, threshold, lo, out) -> tuple:
    """Fill out[:] from the 32-bit outputs u32 in order: (outputs taken, values made). A chunk
    with no rejected draw (nearly every one: a draw is rejected with odds threshold / 2**32) is
    made in one branch-free pass that vectorizes; a chunk with one is made again draw by draw."""
    n = out.shape[0]
    if u32.shape[0] >= n:
        least = np.uint32(0xFFFFFFFF)      # the smallest low half: one compare after the pass
        for i in range(n):
            m = np.uint64(u32[i]) * np.uint64(r)
            least = min(least, np.uint32(m & np.uint64(0xFFFFFFFF)))
            out[i] = lo + np.int64(m >> np.uint64(32))
        if least >= threshold:
            return n, n
    j = 0
    for i in range(out.shape[0]):
        while True:
            if j == u32.shape[0]:
                return j, i
            m = np.uint64(u32[j]) * np.uint64(r)
            j += 1
            if (m & np.uint64(0xFFFFFFFF)) >= threshold:
                break
        out[i] = lo + np.int64(m >> np.uint64(32))
    return j, out.shape[0]


def usable(bitgen, lo: int, hi: int) -> bool:
    return isinstance(bitgen, np.random.PCG64) and sys.byteorder == "little" and 1 < hi - lo < (1 << 32)


def draw(bitgen, lo: int, hi: int, out: np.ndarray) -> None:
    """out (1-D, any integer dtype holding [lo, hi)) = Generator(bitgen).integers(lo, hi, out.size)."""
    r = hi - lo
    threshold = ((1 << 32) - r) % r
    st = bitgen.state
    left = np.array([st["uinteger"]] if st["has_uint32"] else [], np.uint32)
    done = 0
    while done < out.size:
        need = min(CHUNK, out.size - done)
        raw = bitgen.random_raw(max(0, (need - len(left) + 1) // 2))
        u32 = np.concatenate([left, raw.view(np.uint32)]) if len(left) else raw.view(np.uint32)
        taken, made = lemire(u32, r, threshold, lo, out[done:done + need])
        done += made
        left = u32[taken:]
    st = bitgen.state
    st["has_uint32"], st["uinteger"] = (1, int(left[0])) if len(left) else (0, 0)
    bitgen.state = st


def seek(bitgen, state: dict, k: int) -> dict:
    """Set bitgen (PCG64) to where the k-th 32-bit output after `state` is next, as if k draws
    were made from `state` with none rejected; returns that state."""
    bitgen.state = state
    if k == 0:
        return bitgen.state
    k -= 1 if state["has_uint32"] else 0          # the kept high half comes first
    raws, half = divmod(k, 2)
    bitgen.advance(raws)                           # (it drops a kept half)
    if half:                                       # the low half taken: the high half kept
        raw = int(bitgen.random_raw(1)[0])
        st = bitgen.state
        st["has_uint32"], st["uinteger"] = 1, raw >> 32
        bitgen.state = st
    return bitgen.state


def same_place(a: dict, b: dict) -> bool:
    """Two PCG64 states that make the same draws from here on."""
    return a["state"] == b["state"] and a["has_uint32"] == b["has_uint32"] and \
        (not a["has_uint32"] or a["uinteger"] == b["uinteger"])


@dataclass(frozen=True)
class Plan:
    """A run of n bounded draws in [lo, hi) from the PCG64 state `start`; `end`: the state after
    them if none is rejected (`seek`). `make` and `make_rows` are what a worker of
    emulator/system_workers.py calls (the emulator imports nothing of the compiler)."""
    start: dict
    end: dict
    n: int
    lo: int
    hi: int

    def make(self, out: np.ndarray, k0: int, k1: int) -> bool:
        return draw_range(self, out, k0, k1)

    def make_rows(self, starts: np.ndarray, out: np.ndarray) -> bool:
        return draw_rows(self, starts, out)


def plan(bitgen, lo: int, hi: int, n: int) -> Plan:
    """The Plan of the next n draws of bitgen, which is moved past them (as if none were rejected)."""
    start = bitgen.state
    return Plan(start, seek(bitgen, start, n), n, lo, hi)


def draw_range(p: Plan, out: np.ndarray, k0: int, k1: int) -> bool:
    """out[k0:k1] = draws k0 .. k1 - 1 of the plan (out: the run's 1-D array), made from the
    place `seek` gives. False: a draw was rejected in them (they end elsewhere than `seek`
    says), so these and every later draw of the stream may be misplaced."""
    bitgen = np.random.PCG64()
    seek(bitgen, p.start, k0)
    draw(bitgen, p.lo, p.hi, out[k0:k1])
    made = bitgen.state
    return same_place(made, p.end if k1 == p.n else seek(bitgen, p.start, k1))


# ---- PCG64 itself, for `draw_rows`: state and increment as (high, low) uint64 halves -------------
MULT = 0x2360ED051FC65DA44385DF649FCCF645       # PCG64's 128-bit LCG multiplier (numpy's)
U64 = (1 << 64) - 1
MH, ML = np.uint64(MULT >> 64), np.uint64(MULT & U64)


@intrinsic
def _mulhi(typingctx, a, b):
    """The high 64 bits of the 128-bit product of two uint64 (one machine multiply)."""
    def codegen(context, builder, signature, args):
        i128 = ir.IntType(128)
        prod = builder.mul(builder.zext(args[0], i128), builder.zext(args[1], i128))
        return builder.trunc(builder.lshr(prod, ir.Constant(i128, 64)), ir.IntType(64))
    return types.uint64(types.uint64, types.uint64), codegen


@njit(cache=True, inline="always")
def _mul(ah, al, bh, bl):
    return _mulhi(al, bl) + ah * bl + al * bh, al * bl


@njit(cache=True, inline="always")
def _add(ah, al, bh, bl):
    lo = al + bl
    return ah + bh + (np.uint64(1) if lo < al else np.uint64(0)), lo


@njit(cache=True, inline="always")
def _raw(sh, sl, ih, il):
    """PCG64's next 64-bit output and state: the LCG step, then XSL-RR of the new state."""
    mh, ml = _mul(sh, sl, MH, ML)
    sh, sl = _add(mh, ml, ih, il)
    v, rot = sh ^ sl, sh >> np.uint64(58)
    return (v >> rot) | (v << ((np.uint64(64) - rot) & np.uint64(63))), sh, sl


@njit(cache=True)
def _advance(sh, sl, ih, il, delta):
    """The state `delta` (>= 0) steps on (PCG64 advance: the LCG's affine map squared up)."""
    ah, al, ph, pl = np.uint64(0), np.uint64(1), np.uint64(0), np.uint64(0)
    mh, ml, ch, cl = MH, ML, ih, il
    while delta > 0:
        if delta & 1:
            ah, al = _mul(ah, al, mh, ml)
            xh, xl = _mul(ph, pl, mh, ml)
            ph, pl = _add(xh, xl, ch, cl)
        xh, xl = _add(mh, ml, np.uint64(0), np.uint64(1))
        ch, cl = _mul(xh, xl, ch, cl)
        mh, ml = _mul(mh, ml, mh, ml)
        delta >>= 1
    xh, xl = _mul(ah, al, sh, sl)
    return _add(xh, xl, ph, pl)


@njit(cache=True, inline="always")
def _bounded(u, r, lo, least):
    """Lemire's draw of one 32-bit output u (uint64): (value, the smallest low half so far)."""
    m = u * r
    return lo + np.int64(m >> np.uint64(32)), min(least, m & np.uint64(0xFFFFFFFF))


@njit(cache=True)
def _rows(sh, sl, ih, il, kept, starts, r, threshold, lo, out) -> bool:
    """out[i, :] = the bounded draws of 32-bit outputs starts[i] .. of the stream whose state is
    (sh, sl), increment (ih, il), and whose first output is the kept half `kept` (-1: none).
    False: a draw among them is rejected (they and all later draws of the stream are elsewhere)."""
    off = 1 if kept >= 0 else 0
    r64, w = np.uint64(r), out.shape[1]
    least = np.uint64(0xFFFFFFFF)
    at, ph, pl = 0, sh, sl                     # the next 64-bit output is number `at`, from (ph, pl)
    for i in range(out.shape[0]):
        row, j, c = out[i], starts[i], 0
        if j < off and w:                      # the kept half first
            row[0], least = _bounded(np.uint64(kept), r64, lo, least)
            j, c = j + 1, 1
        if c == w:
            continue
        q, half = divmod(j - off, 2)
        if q < at:
            at, ph, pl = 0, sh, sl
        if q > at:
            ph, pl = _advance(ph, pl, ih, il, q - at)
            at = q
        if half:                               # starts at a high half
            x, ph, pl = _raw(ph, pl, ih, il)
            at += 1
            row[c], least = _bounded(x >> np.uint64(32), r64, lo, least)
            c += 1
        pairs = (w - c) // 2
        for t in range(pairs):
            x, ph, pl = _raw(ph, pl, ih, il)
            row[c + 2 * t], least = _bounded(x & np.uint64(0xFFFFFFFF), r64, lo, least)
            row[c + 2 * t + 1], least = _bounded(x >> np.uint64(32), r64, lo, least)
        at += pairs
        c += 2 * pairs
        if c < w:                              # ends at a low half
            x, ph, pl = _raw(ph, pl, ih, il)
            at += 1
            row[c], least = _bounded(x & np.uint64(0xFFFFFFFF), r64, lo, least)
    return least >= threshold


def draw_rows(p: Plan, starts: np.ndarray, out: np.ndarray) -> bool:
    """out[i, :] = draws starts[i] .. starts[i] + out.shape[1] - 1 of the plan (out: 2-D, any
    integer dtype holding [lo, hi)), made as if no draw of the plan before them is rejected.
    False: one of them is rejected (so these and every later draw of the plan may be misplaced)."""
    st = p.start["state"]
    r = p.hi - p.lo
    return _rows(np.uint64(st["state"] >> 64), np.uint64(st["state"] & U64), np.uint64(st["inc"] >> 64),
                 np.uint64(st["inc"] & U64), int(p.start["uinteger"]) if p.start["has_uint32"] else -1,
                 np.asarray(starts, np.int64), r, ((1 << 32) - r) % r, p.lo, out)
