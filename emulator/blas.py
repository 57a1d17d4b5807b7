"""float64 matrix products inside the jitted core (emulator/mxm.py `flush`), by the BLAS that
numpy itself is linked with, called through its address: a batch of ABCs that is large enough
for BLAS is multiplied where it waits, without handing the run back to the host and calling the
core again (~40 us of argument unboxing per call, 141 times in bert_base L=1) nor copying.

`dgemm_address()` finds `cblas_dgemm` with 64-bit integers (OpenBLAS built USE64BITINT, as numpy's
wheels bundle it) in the library numpy loaded; 0 where there is none (another BLAS, another
platform): the core then hands large batches to the host (emulator/run.py `_bulk`), which
multiplies them with numpy. The address is an argument, not a constant of the jitted code, so
Numba's cache holds nothing specific to one process. Thread settings are numpy's own (the same
library, already initialised), but while the core runs: its products run on one thread
(`one_thread`; a system's worker processes, which had each set OpenBLAS to its share of the
cores so that idle BLAS threads would not spin on the others' cores, need nothing more).
"""
import contextlib
import ctypes
import functools
import glob
import os

import numpy as np
import llvmlite.binding as ll
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

ROW_MAJOR, NO_TRANS = 101, 111         # CBLAS_ORDER, CBLAS_TRANSPOSE
SYMBOLS = ("scipy_cblas_dgemm64_", "cblas_dgemm64_")     # numpy's wheels, other ILP64 builds


def _openblas():
    """The OpenBLAS libraries numpy's wheel bundles (already loaded by numpy: the same handles)."""
    top = os.path.dirname(np.__file__)
    for path in sorted(glob.glob(os.path.join(top, os.pardir, "numpy.libs", "*openblas*")) +
                       glob.glob(os.path.join(top, ".dylibs", "*openblas*"))):
        try:
            yield ctypes.CDLL(path)
        except OSError:
            continue


@functools.cache
def dgemm_address() -> int:
    """Address of numpy's ILP64 cblas_dgemm, or 0 if numpy's BLAS is not one this finds."""
    for lib in _openblas():
        for name in SYMBOLS:
            if hasattr(lib, name):
                return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0
    return 0


AVX512_KERNELS = ("skylakex", "cooperlake", "sapphirerapids")   # OpenBLAS kernels with 512-bit vectors


@functools.cache
def kernel_name() -> str:
    """The name of the kernel numpy's OpenBLAS runs on this CPU ("Haswell", "SkylakeX", ...), or ""."""
    for lib in _openblas():
        for name in ("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename"):
            if hasattr(lib, name):
                fn = getattr(lib, name)
                fn.restype = ctypes.c_char_p
                return (fn() or b"").decode("ascii", "replace")
    return ""


def jit_has_avx512() -> bool:
    """Whether Numba compiles the core for a CPU with 512-bit vectors (AVX-512F)."""
    if config.CPU_NAME and config.CPU_NAME != "host":
        return False
    return bool(ll.get_host_cpu_features().get("avx512f", False))


@functools.cache
def bulk_work() -> int:
    """The multiply-adds from which a batch of ABCs goes to BLAS (mxm.flush; run.BULK_WORK): 2^24 (no
    tsp-v1 batch: at most 128 x 320 x 320) where the core's jitted short path (emulator/mxm_short.py)
    has 512-bit fused multiply-adds and numpy's OpenBLAS a narrower kernel: on an AMD Zen 5 (OpenBLAS
    0.3.31 runs its Haswell kernel there), settled batches of n x 320 x 320 took 46 vs 109 us on the
    short path against BLAS (n = 16), 165 vs 295 (64), 339 vs 1338 (128), and bert_base L=1 0.87x CPU
    a run against 2^21. Else 2^21: on 256-bit hosts BLAS was the faster from ~16 full rows."""
    if jit_has_avx512() and not any(k in kernel_name().lower() for k in AVX512_KERNELS):
        return 1 << 24
    return 1 << 21


THREAD_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")
THREAD_GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")


@functools.cache
def _thread_calls():
    """(get, set) of numpy's OpenBLAS thread count, or None where numpy's BLAS is not one this finds."""
    for lib in _openblas():
        for get, set_ in zip(THREAD_GETTERS, THREAD_SETTERS):
            if hasattr(lib, get) and hasattr(lib, set_):
                return getattr(lib, get), getattr(lib, set_)
    return None


@contextlib.contextmanager
def one_thread():
    """numpy's OpenBLAS on one thread while the core runs, then as it was. The core's products
    are small (a batch is at most core.ABC_BATCH rows against one 320 x 320 weight buffer): on
    2 cores, quiet, bert_base L=1 ran 0.225 s a run with OpenBLAS' two threads against 0.176 s
    with one, and on cores busy with other processes the threads' hand-offs cost milliseconds a
    product (bert_base 12 layers: 39-89 s a run against 3-4 s with one thread, same load)."""
    calls = _thread_calls()
    if calls is None:
        yield
        return
    get, set_ = calls
    before = int(get())
    if before != 1:
        set_(ctypes.c_int(1))
    try:
        yield
    finally:
        if before != 1:
            set_(ctypes.c_int(before))


@intrinsic
def dgemm(typingctx, fn, x, w, y):
    """y = x @ w by the cblas_dgemm at address fn (int64, not 0): float64 2-D arrays whose rows
    are consecutive elements (views of C-contiguous arrays: any row stride), y not overlapping
    x or w, x.shape[1] == w.shape[0] >= 1, y's shape (x.shape[0], w.shape[1])."""
    if not (isinstance(fn, types.Integer) and all(isinstance(a, types.Array) and a.ndim == 2 and
                                                   a.dtype == types.float64 for a in (x, w, y))):
        return None

    def codegen(context, builder, sig, args):
        i32, i64, f64 = ir.IntType(32), ir.IntType(64), ir.DoubleType()
        arrs = [context.make_array(t)(context, builder, value=v) for t, v in zip(sig.args[1:], args[1:])]
        rows = [cgutils.unpack_tuple(builder, a.shape, 2) for a in arrs]
        lds = [builder.sdiv(cgutils.unpack_tuple(builder, a.strides, 2)[0], i64(8)) for a in arrs]
        lds = [builder.select(builder.icmp_signed("<", ld, n), n, ld) for ld, n in
               zip(lds, (rows[0][1], rows[1][1], rows[2][1]))]     # a one-row view: any stride >= its width
        p = f64.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, f64, p, i64, p, i64, f64, p, i64])
        call = builder.inttoptr(context.cast(builder, args[0], sig.args[0], types.int64), fnty.as_pointer())
        builder.call(call, [i32(ROW_MAJOR), i32(NO_TRANS), i32(NO_TRANS), rows[0][0], rows[1][1], rows[0][1],
                            f64(1.0), arrs[0].data, lds[0], arrs[1].data, lds[1], f64(0.0), arrs[2].data, lds[2]])
        return context.get_dummy_value()
    return types.none(fn, x, w, y), codegen
