"""Every kind of source error, with its message, position and hint (table-driven)."""
import pytest

from lpu.compiler.errors import SourceError
from lpu.compiler.frontend import elaborate_file, elaborate_source

HEAD = "param D = 8\ninput x : f16[4, D]\nweight w : f16[D, D]\nstate kc : f16[16, D]\n"
# HEAD is 4 lines: cases below start on line 5.

CASES = [
    # (name, program body after HEAD, line, col, message fragment, hint fragment)
    ("missing bracket", "y = exp(x\noutput y\n", 5, 8, "missing closing bracket: `(` is never closed", "add `)`"),
    ("missing bracket eof", "y = concat([x, x], axis=0\n", 5, 11, "missing closing bracket", ""),
    ("missing operator", "y = x w\noutput y\n", 5, 7, "missing operator between `x` and `w`", "insert an operator"),
    ("unmatched bracket", "y = exp(x))\n", 5, 11, "unmatched closing bracket `)`", ""),
    ("bad character", "y = x $ w\n", 5, 7, "unexpected character `$`", ""),
    ("bad declaration", "input z f16[3]\n", 5, 9, "bad declaration", ""),
    ("bad param", "param = 3\n", 5, 7, "bad param", ""),
    ("unknown dtype", "input z : f64[3]\n", 5, 11, "unknown dtype `f64`", "did you mean `f16`?"),
    ("unknown name", "y = x + xx\noutput y\n", 5, 9, "unknown name `xx`", ""),
    ("unknown name hint", "y = exp(kcc)\noutput y\n", 5, 9, "unknown name `kcc`", "did you mean `kc`?"),
    ("unknown function", "y = layernrm(x, x, x)\noutput y\n", 5, 5, "unknown function `layernrm`", "did you mean `layernorm`?"),
    ("too many args", "y = exp(x, x)\noutput y\n", 5, 5, "`exp` takes 1 argument, got 2", "exp(x)"),
    ("missing args", "y = layernorm(x)\noutput y\n", 5, 5, "`layernorm` takes 3 to 4 arguments, got 1 (missing `g`, `b`)", ""),
    ("unknown kwarg", "y = softmax(x, axs=0)\noutput y\n", 5, 16, "`softmax` has no parameter `axs`", "did you mean `axis`?"),
    ("shape mismatch", "y = x + kc\noutput y\n", 5, 7, "shape mismatch in `+`: [4, 8] and [16, 8] do not broadcast", ""),
    ("matmul mismatch", "y = x @ kc\noutput y\n", 5, 7, "shape mismatch in `@`: [4, 8] @ [16, 8] (inner dimensions 8 and 16 differ)", ""),
    ("matmul dtype", "y = i32(x) @ i32(w)\noutput y\n", 5, 12, "matmul takes i8 or float operands, got i32 @ i32", ""),
    ("causal dtype", "y = causal(i8(x))\noutput y\n", 5, 5, "`causal` needs a float tensor, got i8", ""),
    ("inexact param", "param P = D / 3\n", 5, 13, "integer division is not exact: 8 / 3 leaves remainder 2", ""),
    ("param not int", "param P = 1.5\n", 5, 11, "param `P` must be a compile-time integer", ""),
    ("slice range", "y = kc[0:17, :]\noutput y\n", 5, 8, "slice 0:17 is out of range for axis 0 of `kc` (size 16)", ""),
    ("index range", "y = x[4]\noutput y\n", 5, 7, "index 4 is out of range for axis 0 of `x` (size 4)", ""),
    ("too many indexes", "y = x[0, 0, 0]\noutput y\n", 5, 5, "too many indexes", ""),
    ("non-int bound", "y = x[0:1.5]\noutput y\n", 5, 9, "a slice bound must be a compile-time integer", ""),
    ("recursion", "fn f(a) { return f(a) }\ny = f(x)\noutput y\n", 5, 18, "recursive call to `f`", "f -> f"),
    ("store non-state", "x[0:1, :] <- x[0:1, :]\n", 5, 11, "cannot store into input `x`", ""),
    ("store variable", "y = x\ny[0:1, :] <- x[0:1, :]\noutput y\n", 6, 11, "cannot store into `y`", ""),
    ("store shape", "kc[0:2, :] <- x\n", 5, 12, "shape mismatch in store: the value is [4, 8], the region kc[0:2, 0:8] is [2, 8]", ""),
    ("unknown output", "y = x\noutput yy\n", 6, 8, "unknown output name `yy`", "did you mean `y`?"),
    ("output before assign", "output y\ny = x\n", 5, 8, "output `y` is not assigned before this point", ""),
    ("output twice", "output x\noutput x\n", 6, 8, "output `x` is given twice", ""),
    ("reassign input", "x = x * 2\noutput x\n", 5, 1, "cannot assign to input `x`", "read-only"),
    ("reassign state", "kc = x\n", 5, 1, "cannot assign to state `kc`", "kc[...] <- value"),
    ("reassign param", "D = 3\n", 5, 1, "cannot assign to param `D`", ""),
    ("redeclare", "weight x : f16[3]\n", 5, 1, "`x` is already declared as a input", ""),
    ("return at top", "return x\n", 5, 1, "`return` outside a function", ""),
    ("no return", "fn f(a) { b = a }\ny = f(x)\noutput y\n", 5, 4, "function `f` does not `return` a value", ""),
    ("decl in fn", "fn f(a) { param P = 2\n return a }\ny = f(x)\noutput y\n", 5, 17, "`param` must be at the top level", ""),
    ("max of two tensors", "y = max(x, x)\noutput y\n", 5, 5, "got a tensor as the axis", "maximum(a, b)"),
    ("fn in loop", "for i in 0..2 { fn f(a) { return a } }\noutput x\n", 5, 20, "`fn` must be at the top level, not in a loop", ""),
    ("modulo tensor", "y = x % 2\noutput y\n", 5, 7, "`%` works only on compile-time integers", ""),
    ("bad axis", "y = sum(x, axis=2)\noutput y\n", 5, 5, "axis 2 is out of range for a tensor of rank 2", ""),
    ("bad attribute", "y = x.X\noutput y\n", 5, 7, "unknown attribute `.X`", ""),
    ("prelude error at call site", "weight g : f32[3]\ny = layernorm(x, g, g)\noutput y\n", 6, 5,
     "in `layernorm`: shape mismatch in `*`: [4, 8] and [3] do not broadcast", ""),
    ("concat mismatch", "y = concat([x, kc], axis=1)\noutput y\n", 5, 5, "shape mismatch in `concat` along axis 1", ""),
    ("reshape", "y = reshape(x, [5, 7])\noutput y\n", 5, 5, "cannot reshape [4, 8] (32 elements) to [5, 7]", ""),
    ("function as value", "y = softmax\noutput y\n", 5, 5, "`softmax` is a function", ""),
    ("no output", "y = x\n", 0, 0, "the program has no `output` and stores nothing", ""),
    ("negative dim", "input z : f16[D - 9]\n", 5, 17, "dimension must be positive, got -1", ""),
]


@pytest.mark.parametrize("name,body,line,col,message,hint", CASES, ids=[c[0] for c in CASES])
def test_error(name, body, line, col, message, hint):
    with pytest.raises(SourceError) as info:
        elaborate_source(HEAD + body, "prog.lpu")
    d = info.value.diagnostics[0]
    assert message in d.message, str(info.value)
    assert (d.line, d.col) == (line, col), str(info.value)
    assert hint in d.hint, str(info.value)


def test_rendering_has_position_source_line_caret_and_hint():
    with pytest.raises(SourceError) as info:
        elaborate_source(HEAD + "y = layernrm(x, x, x)\noutput y\n", "prog.lpu")
    assert str(info.value).splitlines() == [
        "prog.lpu:5:5: error: unknown function `layernrm`",
        "    y = layernrm(x, x, x)",
        "        ^",
        "    hint: did you mean `layernorm`? (builtins: docs/language.md)",
    ]


def test_several_errors_reported_together_sorted():
    body = "a = x + nope\nb = exp(x, 1)\nc = a + b\nd = zz\noutput c\n"
    with pytest.raises(SourceError) as info:
        elaborate_source(HEAD + body, "prog.lpu")
    got = [(d.line, d.col, d.message) for d in info.value.diagnostics]
    assert got == [(5, 9, "unknown name `nope`"), (6, 5, "`exp` takes 1 argument, got 2"),
                   (8, 5, "unknown name `zz`")]   # no cascade from `c = a + b`


def test_errors_in_loop_bodies_reported_once():
    with pytest.raises(SourceError) as info:
        elaborate_source(HEAD + "y = x\nfor i in 0..3 { y = y + nope }\noutput y\n")
    assert len(info.value.diagnostics) == 1


def test_override_of_undeclared_param():
    with pytest.raises(SourceError) as info:
        elaborate_source(HEAD + "output x\n", "prog.lpu", params={"DD": 4})
    d = info.value.diagnostics[0]
    assert d.message == "-p DD=4: the program has no `param DD`" and d.hint == "did you mean `D`?"
    assert str(info.value).startswith("prog.lpu: error: -p DD=4")


def test_override_makes_division_inexact():
    text = "param D = 8\nparam H = 2\nparam HD = D / H\ninput x : f16[HD]\noutput x\n"
    with pytest.raises(SourceError, match="3:14: error: integer division is not exact: 8 / 3"):
        elaborate_source(text, params={"H": 3})


def test_missing_file():
    with pytest.raises(SourceError, match="cannot read the program"):
        elaborate_file("/nonexistent/prog.lpu")


def test_source_error_is_an_lpu_error():
    from lpu.isa.errors import LpuError
    assert issubclass(SourceError, LpuError)
