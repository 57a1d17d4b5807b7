"""`borrowed(a)`: the same array (data, shape, strides) without its reference count, for the
jitted core's hot loop (emulator/core.py).

Numba counts references to every array it hands around: each view (`x[i]`, `x[a:b]`), each
copy of a variable and each argument of a call increments and decrements the array's count
with an atomic (locked) instruction. In the core's loop that was 40% of the time (perf) and,
because a locked instruction orders all memory accesses around it, it kept cache misses from
overlapping. An array whose meminfo is null skips the atomic (NRT_incref tests for null), and
so do its views. The caller must keep the owner alive while the borrowed array is used: the
core borrows its arguments only, at the top of a function, and never returns them.
"""
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


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
