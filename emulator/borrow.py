"""Two intrinsics for the jitted core's hot loop (emulator/core.py).

`borrowed(a)`: the same array (data, shape, strides) without its reference count. Numba counts
references to every array it hands around: each view (`x[i]`, `x[a:b]`), each copy of a
variable and each argument of a call increments and decrements the array's count with an
atomic (locked) instruction. In the core's loop that was 40% of the time (perf) and, because a
locked instruction orders all memory accesses around it, it kept cache misses from
overlapping. An array whose meminfo is null skips the atomic (NRT_incref tests for null), and
so do its views. The caller must keep the owner alive while the borrowed array is used: the
core borrows its arguments only, at the top of a function, and never returns them.

`prefetch_row(a, r)`: asks the cache for row r of a 2-D C-contiguous array (every 64-byte
line of it); it changes nothing and cannot fault (an address outside the array is fine for
the hardware, and r is checked anyway).
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LINE = 64


@intrinsic
def borrowed(typingctx, arr):
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, value=args[0])
        out = context.make_array(sig.return_type)(context, builder)
        for f in ("nitems", "itemsize", "data", "shape", "strides"):
            setattr(out, f, getattr(src, f))
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        out.parent = cgutils.get_null_value(out.parent.type)
        return out._getvalue()
    return arr(arr), codegen


@intrinsic
def prefetch_row(typingctx, arr, row):
    if not (isinstance(arr, types.Array) and arr.ndim == 2 and arr.layout == "C" and isinstance(row, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        r = context.cast(builder, args[1], sig.args[1], types.intp)
        shape = cgutils.unpack_tuple(builder, ary.shape, 2)
        strides = cgutils.unpack_tuple(builder, ary.strides, 2)
        ok = builder.and_(builder.icmp_signed(">=", r, r.type(0)), builder.icmp_signed("<", r, shape[0]))
        with builder.if_then(ok, likely=True):
            i8p = ir.IntType(8).as_pointer()
            base = builder.gep(builder.bitcast(ary.data, i8p), [builder.mul(r, strides[0])])
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                ir.VoidType(), [i8p, ir.IntType(32), ir.IntType(32), ir.IntType(32)]), "llvm.prefetch.p0")
            nbytes = builder.mul(shape[1], strides[1])
            with cgutils.for_range_slice(builder, r.type(0), nbytes, r.type(LINE)) as (off, _):
                builder.call(fn, [builder.gep(base, [off]), ir.IntType(32)(0), ir.IntType(32)(3), ir.IntType(32)(1)])
        return context.get_dummy_value()
    return types.none(arr, row), codegen


@intrinsic
def prefetch(typingctx, arr, i, nbytes):
    """Asks the cache for the bytes [i * itemsize, i * itemsize + nbytes) of a C-contiguous
    array's memory (i a flat element index; every 64-byte line of the range); like
    `prefetch_row`, it changes nothing and cannot fault (i is checked against the size)."""
    if not (isinstance(arr, types.Array) and arr.layout == "C" and isinstance(i, types.Integer)
            and isinstance(nbytes, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        r = context.cast(builder, args[1], sig.args[1], types.intp)
        n = context.cast(builder, args[2], sig.args[2], types.intp)
        ok = builder.and_(builder.icmp_signed(">=", r, r.type(0)), builder.icmp_signed("<", r, ary.nitems))
        with builder.if_then(ok, likely=True):
            i8p = ir.IntType(8).as_pointer()
            base = builder.gep(builder.bitcast(ary.data, i8p), [builder.mul(r, ary.itemsize)])
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(
                ir.VoidType(), [i8p, ir.IntType(32), ir.IntType(32), ir.IntType(32)]), "llvm.prefetch.p0")
            with cgutils.for_range_slice(builder, r.type(0), n, r.type(LINE)) as (off, _):
                builder.call(fn, [builder.gep(base, [off]), ir.IntType(32)(0), ir.IntType(32)(3), ir.IntType(32)(1)])
        return context.get_dummy_value()
    return types.none(arr, i, nbytes), codegen
