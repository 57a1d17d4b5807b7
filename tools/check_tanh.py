"""Compare the VXM fast path's vector tanh (emulator/vxm_fast.py over vxm_tanh.tanh_lane) with
libm's tanhf (Numba's np.tanh, which arith.f32_unary called before) on every float32 bit pattern, or on every `--step`-th one: the proof
that the VXM's TANH and GELU kept their bits (all 2^32 inputs: ~75 s of CPU).
python -m tools.check_tanh [--step N] (from the repository root)"""
import argparse
import sys
import time

import numpy as np
from numba import njit

from lpu.emulator.arith import C_TANH
from lpu.emulator.vxm_fast import _unary


@njit
def _libm(x, out):
    for l in range(x.shape[0]):
        out[l] = np.tanh(x[l])


@njit
def _fill(start, step, bits):
    for l in range(bits.shape[0]):
        bits[l] = np.uint32((start + l * step) & 0xFFFFFFFF)


def first_mismatch(bits):
    """(input, libm's bits, the vector's bits) of the first pattern in uint32 `bits` where the
    two differ, or None."""
    x = bits.view(np.float32)
    want = np.empty_like(x)
    _libm(x, want)
    got = x.copy()
    _unary(C_TANH, got, got.shape[0])
    bad = np.flatnonzero(want.view(np.uint32) != got.view(np.uint32))
    if bad.size == 0:
        return None
    i = bad[0]
    return int(bits[i]), int(want.view(np.uint32)[i]), int(got.view(np.uint32)[i])


def check(step=1, chunk=1 << 22):
    """first_mismatch over every `step`-th pattern of all 2^32."""
    bits = np.empty(chunk, np.uint32)
    total = (1 << 32) // step
    done = 0
    while done < total:
        n = min(chunk, total - done)
        _fill(done * step, step, bits[:n])
        bad = first_mismatch(bits[:n])
        if bad:
            return bad
        done += n
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", type=int, default=1)
    a = ap.parse_args(argv)
    t = time.perf_counter()
    bad = check(a.step)
    if bad:
        print(f"DIFFER at input 0x{bad[0]:08x}: libm 0x{bad[1]:08x}, vector 0x{bad[2]:08x}")
        return 1
    print(f"{(1 << 32) // a.step} inputs identical ({time.perf_counter() - t:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
