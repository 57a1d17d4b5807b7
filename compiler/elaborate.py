"""AST -> IR graph: params are evaluated (with overrides), functions inlined, loops and list
comprehensions unrolled, compile-time integers folded, shapes and dtypes inferred. Errors in
separate top-level statements are collected and raised together as one SourceError.

Scopes: a function body sees its arguments, its own assignments and the program's globals
(params, declared tensors, top-level names), never its caller's locals; a `for` loop runs in
the enclosing scope (its variable and assignments stay visible after it, as in Python); a list
comprehension binds its variable in a scope of its own. A state name reads its latest version."""
from __future__ import annotations

import math
from pathlib import Path

from lpu.compiler import ast as A
from lpu.compiler import builtins as B
from lpu.compiler.builtins import Tensor, describe, fmt
from lpu.compiler.errors import SourceError, SourceText, did_you_mean
from lpu.compiler.ir import IRGraph
from lpu.compiler.parse import deep_recursion, parse, too_deep
from lpu.compiler.semantics import DTYPES
from lpu.isa.limits import how_to_raise, limit

PRELUDE_PATH = Path(__file__).parent / "prelude.lpu"
TOP_ONLY = (A.Param, A.Decl, A.FnDef, A.Output)
STMT_NAME = {A.Param: "`param`", A.Decl: "a declaration", A.FnDef: "`fn`", A.Output: "`output`"}


class _Abort(Exception):
    """Evaluation stopped on a value whose error was already reported."""


class LimitExceeded(SourceError):
    """A limit (isa/limits.py) was exceeded: elaboration stops here, not at the next statement."""


class _Poison:
    """The value of a name whose definition failed: using it aborts silently."""


POISON = _Poison()


class Scope:
    def __init__(self, parent: "Scope | None" = None, vars_: dict | None = None):
        self.parent = parent
        self.vars = dict(vars_ or {})

    def lookup(self, name: str):
        s = self
        while s is not None:
            if name in s.vars:
                return s.vars[name]
            s = s.parent
        raise KeyError(name)

    def names(self) -> set[str]:
        return set(self.vars) | (self.parent.names() if self.parent else set())


def _prelude() -> tuple[SourceText, dict[str, A.FnDef]]:
    text = PRELUDE_PATH.read_text()
    prog = parse(text, "<prelude>")
    return SourceText("<prelude>", text), {s.name: s for s in prog.stmts if isinstance(s, A.FnDef)}


class Elaborator:
    def __init__(self, text: str, name: str, params: dict[str, int] | None):
        self.user_src = self.src = SourceText(name, text)
        self.prelude_src, prelude_fns = _prelude()
        self.overrides = dict(params or {})
        self.graph = IRGraph(name, text)
        self.globals = Scope()
        self.kinds: dict[str, str] = {}          # declared name -> param | input | weight | state
        self.fns: dict[str, A.FnDef] = dict(prelude_fns)
        self.calls: list[str] = []               # functions being inlined, outermost first
        self.site: tuple[int, int] | None = None  # call-site position for prelude ops
        self.diags = []
        # limits (isa/limits.py), read once; `depth` and `steps` count expressions being / evaluated
        self.max_depth, self.max_steps, self.max_trips = limit("nesting"), limit("steps"), limit("loop_trips")
        self.max_nodes, self.max_dim, self.max_elems = limit("ir_nodes"), limit("dim"), limit("tensor_elements")
        self.int_max, self.max_errors = 2 ** limit("int_bits"), limit("errors")
        self.depth = self.steps = 0

    # ---- helpers used by builtins -------------------------------------------------------
    def error(self, at, message: str, hint: str = ""):
        raise SourceError.at(self.src, at.line, at.col, message, hint)

    def limit_error(self, at, message: str, hint: str):
        raise LimitExceeded([self.src.diagnostic(at.line, at.col, message, hint)])

    def node(self, op, inputs, shape, dtype, attrs, at) -> Tensor:
        self._check_shape(shape, at)
        if len(self.graph) >= self.max_nodes:
            self.limit_error(at, f"the program unrolls to more than {self.max_nodes:,} IR operations",
                       how_to_raise("ir_nodes"))
        line, col = self.site or (at.line, at.col)
        return Tensor(self.graph.add(op, inputs, shape, dtype, attrs, line, col))

    def _check_shape(self, shape, at):
        for d in shape:
            if d > self.max_dim:
                self.limit_error(at, f"dimension {d:,} is too large", how_to_raise("dim"))
        n = math.prod(shape)
        if n > self.max_elems:
            self.limit_error(at, f"a tensor of shape {fmt(shape)} has {n:,} elements, too many", how_to_raise("tensor_elements"))

    def checked_int(self, v, at):
        """`v`, if it is not an integer out of the range of compile-time integers (limit int_bits)."""
        if isinstance(v, int) and not -self.int_max < v < self.int_max:
            self.limit_error(at, f"integer overflow: a compile-time integer must be below 2**{limit('int_bits')} "
                           f"in magnitude, this one has {v.bit_length()} bits", how_to_raise("int_bits"))
        return v

    def did_you_mean(self, name, candidates) -> str:
        """A did-you-mean hint, until the error limit is reached (then none: they cost time).
        `candidates` may be a function that returns them, called only if the hint is made."""
        if len(self.diags) >= self.max_errors:
            return ""
        return did_you_mean(name, candidates() if callable(candidates) else candidates)

    def shape(self, t: Tensor) -> tuple:
        return self.graph.node(t.id).shape

    def dtype(self, t: Tensor) -> str:
        return self.graph.node(t.id).dtype

    # ---- program ------------------------------------------------------------------------
    def run(self, prog: A.Program) -> IRGraph:
        try:
            with deep_recursion():
                return self._run(prog)
        except RecursionError:
            raise too_deep(self.user_src) from None
        except LimitExceeded as e:      # with the errors found before it
            raise SourceError(self.diags + e.diagnostics) from None

    def _run(self, prog: A.Program) -> IRGraph:
        for s in prog.stmts:
            if isinstance(s, A.FnDef):
                self._guard(self._define, s)
        self.later = _assigned(prog.stmts)
        self._block(prog.stmts, self.globals, top=True)
        for name, value in sorted(self.overrides.items()):
            if name not in self.graph.params:
                hint = self.did_you_mean(name, self.graph.params) or f"params: {', '.join(self.graph.params) or 'none'}"
                self.diags.append(self.src.diagnostic(0, 0, f"-p {name}={value}: the program has no `param {name}`", hint))
        if not self.diags and not self.graph.outputs and not self._stored():
            self.diags.append(self.src.diagnostic(0, 0, "the program has no `output` and stores nothing"))
        if self.diags:
            raise SourceError(self.diags)
        return self.graph

    def _stored(self) -> bool:
        return any(self.graph.final_states[n] != self.graph.decls[n] for n in self.graph.final_states)

    def _guard(self, fn, *args) -> bool:
        try:
            fn(*args)
            return True
        except LimitExceeded:
            raise
        except SourceError as e:
            self.diags.extend(e.diagnostics)
        except _Abort:
            pass
        return False

    def _define(self, s: A.FnDef):
        if s.name in B.BUILTINS:
            self.error(s, f"`{s.name}` is a builtin function and cannot be redefined")
        if s.name in self.fns and self.fns[s.name].origin == s.origin:
            self.error(s, f"function `{s.name}` is defined twice")
        names = [p.name for p in s.params]
        for p in s.params:
            if names.count(p.name) > 1:
                self.error(p, f"parameter `{p.name}` appears twice")
        self.fns[s.name] = s

    # ---- statements ---------------------------------------------------------------------
    def _block(self, stmts, scope: Scope, top: bool):
        """Run statements; at the top level (and in top-level loops) errors are collected
        per statement. Returns the value of a `return`, or None."""
        for i, s in enumerate(stmts):
            if isinstance(s, A.Return):
                if scope is self.globals:
                    self.error(s, "`return` outside a function")
                if i != len(stmts) - 1:
                    self.error(stmts[i + 1], "statement after `return` is never run")
                return self.expr(s.value, scope)
            if not top:
                self._stmt(s, scope, top)
            elif not self._guard(self._stmt, s, scope, top):
                name = getattr(s, "name", None)
                defines = isinstance(s, (A.Assign, A.Param, A.Decl)) or isinstance(s, A.Output) and s.value
                if defines and name not in self.kinds:
                    scope.vars[name] = POISON
        return None

    def _stmt(self, s, scope: Scope, top: bool):
        if isinstance(s, TOP_ONLY) and scope is not self.globals:
            self.error(s, f"{STMT_NAME[type(s)]} must be at the top level of the program")
        match s:
            case A.Param():
                self._param(s)
            case A.Decl():
                self._decl(s)
            case A.FnDef():
                pass
            case A.Assign():
                self._assign(s.name, self.expr(s.value, scope), scope, s)
            case A.Store():
                self._store(s, scope)
            case A.For():
                for b in s.body:
                    if isinstance(b, TOP_ONLY):
                        self.error(b, f"{STMT_NAME[type(b)]} must be at the top level, not in a loop")
                lo, hi = self._range(s.start, s.stop, scope)
                self._trips(lo, hi, s)
                trips = []
                for i in range(lo, hi):
                    self._assign(s.var, i, scope, s)
                    start = len(self.graph)
                    self._block(s.body, scope, top)
                    trips.append((start, len(self.graph)))
                if top and len(trips) > 1:
                    self.graph.loops.append(trips)
            case A.Output():
                self._output(s, scope)

    def _trips(self, lo, hi, at):
        if hi - lo > self.max_trips:
            self.limit_error(at, f"the loop runs {hi - lo:,} times, more than {self.max_trips:,}", how_to_raise("loop_trips"))

    def _range(self, start, stop, scope) -> tuple[int, int]:
        lo = B.int_arg(self, self.expr(start, scope), "a range bound", start)
        hi = B.int_arg(self, self.expr(stop, scope), "a range bound", stop)
        return lo, hi

    def _param(self, s: A.Param):
        if s.name in self.kinds:
            self.error(s, f"`{s.name}` is already declared as a {self.kinds[s.name]}")
        if s.name in self.overrides:
            value = self.overrides[s.name]
            if not isinstance(value, int):
                self.error(s, f"-p {s.name}={value}: a param override must be an integer")
            self.checked_int(value, s)
        else:
            value = self.expr(s.value, self.globals)
            if not isinstance(value, int):
                self.error(s.value, f"param `{s.name}` must be a compile-time integer, got {describe(value)}")
        self.kinds[s.name] = "param"
        self.graph.params[s.name] = value
        self.globals.vars[s.name] = value

    def _decl(self, s: A.Decl):
        if s.name in self.kinds:
            self.error(s, f"`{s.name}` is already declared as a {self.kinds[s.name]}")
        if s.dtype not in DTYPES:
            line, col = s.dtype_pos
            raise SourceError.at(self.src, line, col, f"unknown dtype `{s.dtype}`",
                                 self.did_you_mean(s.dtype, DTYPES) or f"dtypes: {', '.join(DTYPES)}")
        dims = []
        for d in s.dims:
            n = B.int_arg(self, self.expr(d, self.globals), "a dimension", d)
            if n <= 0:
                self.error(d, f"dimension must be positive, got {n}")
            dims.append(n)
        t = self.node(s.kind, [], dims, s.dtype, {"name": s.name}, s)
        self.kinds[s.name] = s.kind
        self.graph.decls[s.name] = t.id
        if s.kind == "state":
            self.graph.final_states[s.name] = t.id
        self.globals.vars[s.name] = t

    def _assign(self, name: str, value, scope: Scope, at):
        if scope is self.globals and name in self.kinds:
            kind = self.kinds[name]
            hint = (f"store into it with `{name}[...] <- value`" if kind == "state"
                    else "declared names are read-only; pick a new name")
            self.error(at, f"cannot assign to {kind} `{name}`", hint)
        scope.vars[name] = value

    def _output(self, s: A.Output, scope: Scope):
        if s.value is not None:
            self._assign(s.name, self.expr(s.value, scope), scope, s)
        if s.name in self.graph.outputs:
            self.error(s, f"output `{s.name}` is given twice")
        try:
            value = scope.lookup(s.name)
        except KeyError:
            if s.name in self.later:
                self.error(s, f"output `{s.name}` is not assigned before this point")
            self.error(s, f"unknown output name `{s.name}`", self.did_you_mean(s.name, scope.names))
        if value is POISON:
            raise _Abort
        if not isinstance(value, Tensor):
            self.error(s, f"output `{s.name}` must be a tensor, got {describe(value)}")
        t = self.node("output", [value.id], self.shape(value), self.dtype(value), {"name": s.name}, s)
        self.graph.outputs[s.name] = t.id

    def _store(self, s: A.Store, scope: Scope):
        kind = self.kinds.get(s.name) if s.name not in self._locals(scope) else None
        if kind != "state":
            if kind is None and s.name not in scope.names():
                self.error(s, f"unknown name `{s.name}`", self.did_you_mean(s.name, scope.names))
            what = f"{kind} `{s.name}`" if kind else f"`{s.name}`"
            self.error(s, f"cannot store into {what}: `<-` stores only into a declared state")
        old = self.globals.vars[s.name]
        shape = self.shape(old)
        index = self._subscripts(s.subs, shape, scope, s, s.name)
        bounds = tuple((i, i + 1) if isinstance(i, int) else i for i in index)
        full = tuple(b - a for a, b in bounds)
        kept = tuple(b - a for (a, b), i in zip(bounds, index) if not isinstance(i, int))
        value = self.expr(s.value, scope)
        if not isinstance(value, Tensor):
            self.error(s.value, f"`<-` stores a tensor, got {describe(value)}")
        if self.shape(value) != full:
            if self.shape(value) != kept:
                self.error(s, f"shape mismatch in store: the value is {fmt(self.shape(value))}, "
                              f"the region {s.name}{self._region(bounds)} is {fmt(full)}")
            value = self.node("reshape", [value.id], full, self.dtype(value), {"shape": full}, s)
        t = self.node("store", [old.id, value.id], shape, self.dtype(old), {"name": s.name, "index": bounds}, s)
        self.globals.vars[s.name] = t
        self.graph.final_states[s.name] = t.id

    @staticmethod
    def _region(bounds) -> str:
        return "[" + ", ".join(f"{a}:{b}" for a, b in bounds) + "]"

    def _locals(self, scope: Scope) -> set[str]:
        s, out = scope, set()
        while s is not None and s is not self.globals:
            out |= set(s.vars)
            s = s.parent
        return out

    # ---- expressions --------------------------------------------------------------------
    def expr(self, e, scope: Scope):
        """The value of expression `e`, within the limits on nesting and on elaboration steps."""
        self.steps += 1
        if self.steps > self.max_steps:
            self.limit_error(e, f"elaboration takes more than {self.max_steps:,} steps (loops and calls unrolled)",
                       how_to_raise("steps"))
        if self.depth >= self.max_depth:
            self.limit_error(e, f"nesting too deep: more than {self.max_depth} expressions and inlined calls within "
                          "one another", how_to_raise("nesting"))
        self.depth += 1
        try:
            return self._expr(e, scope)
        finally:
            self.depth -= 1

    def _expr(self, e, scope: Scope):
        match e:
            case A.Num():
                return self.checked_int(e.value, e)
            case A.Name():
                return self._name(e, scope)
            case A.BinOp():
                a, b = self.expr(e.left, scope), self.expr(e.right, scope)
                if e.op == "@":
                    return B.matmul(self, a, b, e)
                if isinstance(a, (int, float)) and isinstance(b, (int, float)):
                    return self.checked_int(B.fold_binary(self, e.op, a, b, e), e)
                if e.op == "%":
                    self.error(e, "`%` works only on compile-time integers")
                return B.binary(self, B.BINOP[e.op], a, b, e)
            case A.Neg():
                v = self.expr(e.operand, scope)
                if isinstance(v, list):
                    self.error(e, "cannot negate a list")
                return self.checked_int(-v, e) if isinstance(v, (int, float)) else B.unary(self, "neg", v, e)
            case A.Call():
                return self._call(e, scope)
            case A.Index():
                return self._index(e, scope)
            case A.Attr():
                v = self.expr(e.value, scope)
                if e.name != "T":
                    self.error(e, f"unknown attribute `.{e.name}`", "the only attribute is `.T`")
                v = B.tensor_arg(self, v, ".T", e)
                rank = len(self.shape(v))
                if rank < 2:
                    self.error(e, f"`.T` needs a tensor of rank 2 or more, got {fmt(self.shape(v))}")
                return B.transpose(self, v, [*range(rank - 2), rank - 1, rank - 2], e)
            case A.ListLit():
                return [self.expr(i, scope) for i in e.items]
            case A.ListComp():
                lo, hi = self._range(e.start, e.stop, scope)
                self._trips(lo, hi, e)
                return [self.expr(e.elt, Scope(scope, {e.var: i})) for i in range(lo, hi)]
        raise AssertionError(e)

    def _name(self, e: A.Name, scope: Scope):
        try:
            v = scope.lookup(e.id)
        except KeyError:
            if e.id in self.fns or e.id in B.BUILTINS:
                self.error(e, f"`{e.id}` is a function: call it, like `{e.id}(...)`")
            self.error(e, f"unknown name `{e.id}`", self.did_you_mean(e.id, scope.names))
        if v is POISON:
            raise _Abort
        return v

    def _index(self, e: A.Index, scope: Scope):
        v = self.expr(e.value, scope)
        if isinstance(v, list):
            if len(e.subs) != 1 or isinstance(e.subs[0], A.Slice):
                self.error(e, "a list takes one integer index")
            i = B.int_arg(self, self.expr(e.subs[0], scope), "a list index", e.subs[0])
            if not -len(v) <= i < len(v):
                self.error(e.subs[0], f"index {i} is out of range for a list of length {len(v)}")
            return v[i]
        v = B.tensor_arg(self, v, "indexing", e)
        what = e.value.id if isinstance(e.value, A.Name) else "the tensor"
        index = self._subscripts(e.subs, self.shape(v), scope, e, what)
        if all(not isinstance(i, int) and i == (0, n) for i, n in zip(index, self.shape(v))):
            return v
        shape = [b - a for a, b in (i for i in index if not isinstance(i, int))]
        return self.node("slice", [v.id], shape, self.dtype(v), {"index": tuple(index)}, e)

    def _subscripts(self, subs, shape, scope, at, what) -> list:
        """One entry per axis: (start, stop) for a slice, an int for an index."""
        if len(subs) > len(shape):
            self.error(at, f"too many indexes: `{what}` is {fmt(shape)}, {len(subs)} given")
        out = []
        for axis, (sub, n) in enumerate(zip(subs, shape)):
            if isinstance(sub, A.Slice):
                lo = 0 if sub.start is None else B.int_arg(self, self.expr(sub.start, scope), "a slice bound", sub.start)
                hi = n if sub.stop is None else B.int_arg(self, self.expr(sub.stop, scope), "a slice bound", sub.stop)
                lo, hi = lo + n if lo < 0 else lo, hi + n if hi < 0 else hi
                if not 0 <= lo < hi <= n:
                    self.error(sub, f"slice {lo}:{hi} is out of range for axis {axis} of `{what}` (size {n})")
                out.append((lo, hi))
            else:
                i = B.int_arg(self, self.expr(sub, scope), "an index", sub)
                if not -n <= i < n:
                    self.error(sub, f"index {i} is out of range for axis {axis} of `{what}` (size {n})")
                out.append(i % n)
        return out + [(0, n) for n in shape[len(subs):]]

    # ---- calls --------------------------------------------------------------------------
    def _call(self, e: A.Call, scope: Scope):
        if e.func in self.fns:
            fn = self.fns[e.func]
            spec = [(p.name, p.default if p.default is not None else B.REQUIRED) for p in fn.params]
        elif e.func in B.BUILTINS:
            spec, handler = B.BUILTINS[e.func]
        else:
            near = self.did_you_mean(e.func, [*self.fns, *B.BUILTINS])
            self.error(e, f"unknown function `{e.func}`",
                       f"{near} (builtins: docs/language.md)" if near else "the builtins are listed in docs/language.md")
        args = self._bind(e, spec, scope)
        if e.func not in self.fns:
            return handler(self, args, e)
        return self._inline(self.fns[e.func], args, e)

    def _bind(self, e: A.Call, spec, scope) -> dict:
        names = [n for n, _ in spec]
        need = sum(d is B.REQUIRED for _, d in spec)
        want = f"{need} to {len(spec)} arguments" if need != len(spec) else \
            f"{need} argument{'s' * (need != 1)}"
        if len(e.args) > len(spec):
            self.error(e, f"`{e.func}` takes {want}, got {len(e.args)}", f"{e.func}({', '.join(names)})")
        args = {n: self.expr(a, scope) for n, a in zip(names, e.args)}
        for kw in e.kwargs:
            if kw.name not in names:
                self.error(kw, f"`{e.func}` has no parameter `{kw.name}`",
                           self.did_you_mean(kw.name, names) or f"{e.func}({', '.join(names)})")
            if kw.name in args:
                self.error(kw, f"`{e.func}` got argument `{kw.name}` twice")
            args[kw.name] = self.expr(kw.value, scope)
        missing = [n for n, d in spec if d is B.REQUIRED and n not in args]
        if missing:
            self.error(e, f"`{e.func}` takes {want}, got {len(e.args) + len(e.kwargs)} "
                          f"(missing {', '.join(f'`{m}`' for m in missing)})", f"{e.func}({', '.join(names)})")
        for n, d in spec:
            if n not in args:
                args[n] = d if not isinstance(d, A.Pos) else None
        return args

    def _inline(self, fn: A.FnDef, args: dict, call: A.Call):
        if fn.name in self.calls:
            self.error(call, f"recursive call to `{fn.name}`: functions are inlined, so they cannot recurse",
                       " -> ".join([*self.calls, fn.name]))
        prelude = fn.origin == "<prelude>"
        saved = self.src, self.site
        if prelude:
            self.src, self.site = self.prelude_src, self.site or (call.line, call.col)
        self.calls.append(fn.name)
        try:
            for p in fn.params:
                if args[p.name] is None:
                    args[p.name] = self.expr(p.default, self.globals)
            result = self._block(fn.body, Scope(self.globals, args), top=False)
            if result is None:
                self.error(fn, f"function `{fn.name}` does not `return` a value")
            return result
        except SourceError as err:
            if not prelude or isinstance(err, LimitExceeded):
                raise
            d = err.diagnostics[0]
            raise SourceError.at(saved[0], call.line, call.col, f"in `{fn.name}`: {d.message}", d.hint) from None
        finally:
            self.calls.pop()
            self.src, self.site = saved


def _assigned(stmts) -> set[str]:
    """Names given a value at the top level (in loops too), for "used before assigned" errors."""
    out = set()
    for s in stmts:
        if isinstance(s, A.Assign) or isinstance(s, A.Output) and s.value is not None:
            out.add(s.name)
        elif isinstance(s, A.For):
            out |= _assigned(s.body) | {s.var}
    return out


def elaborate(prog: A.Program, text: str, name: str = "<string>", params: dict[str, int] | None = None) -> IRGraph:
    """Elaborate a parsed program to the IR graph."""
    return Elaborator(text, name, params).run(prog)
