"""Source text -> AST (compiler/ast.py). Lark LALR with grammar.lark; Lark's errors become
SourceErrors with a classification ("missing closing bracket", "missing operator", ...)."""
from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from lpu.compiler import ast as A
from lpu.compiler.errors import SourceError, SourceText
from lpu.isa.limits import how_to_raise, limit

OPEN = {"LPAR": ")", "LSQB": "]", "LBRACE": "}"}
CLOSE = {"RPAR": "LPAR", "RSQB": "LSQB", "RBRACE": "LBRACE"}
OPERAND_END = {"NAME", "INT", "FLOAT", "RPAR", "RSQB"}
OPERAND_START = {"NAME", "INT", "FLOAT", "LPAR"}
STMT_KIND = {
    "INPUT": "bad declaration: expected `input NAME : dtype[dims]`",
    "WEIGHT": "bad declaration: expected `weight NAME : dtype[dims]`",
    "STATE": "bad declaration: expected `state NAME : dtype[dims]`",
    "PARAM": "bad param: expected `param NAME = integer expression`",
    "FN": "bad function definition: expected `fn name(a, b, c=1) { ... }`",
    "FOR": "bad loop: expected `for i in a..b { ... }`",
    "OUTPUT": "bad output: expected `output NAME` or `output NAME = expr`",
}
TOKEN_TEXT = {
    "RPAR": "`)`", "RSQB": "`]`", "RBRACE": "`}`", "LPAR": "`(`", "LSQB": "`[`", "LBRACE": "`{`",
    "COMMA": "`,`", "EQUAL": "`=`", "COLON": "`:`", "RANGE": "`..`", "STORE": "`<-`",
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "_NL": "end of line",
    "ADDOP": "an operator", "MULOP": "an operator", "CMPOP": "an operator", "NEG": "`-`", "$END": "end of file",
    "DOT": "`.`", "SEMICOLON": "`;`",
}


class _Newlines:
    """Postlexer: drops newlines inside ( ) and [ ]; remembers open brackets, the previous
    token and the first token of the current statement, for error messages."""
    always_accept = ("_NL",)

    def process(self, stream):
        self.stack, self.prev, self.stmt_start = [], None, None
        for tok in stream:
            inside = any(t.type != "LBRACE" for t in self.stack)
            if tok.type == "_NL" and inside:
                continue
            if tok.type in OPEN:
                self.stack.append(tok)
            elif tok.type in CLOSE and self.stack and self.stack[-1].type == CLOSE[tok.type]:
                self.stack.pop()
            if self.prev is None or self.prev.type in ("_NL", "SEMICOLON", "LBRACE", "RBRACE"):
                self.stmt_start = tok
            yield tok
            self.prev = tok


@lru_cache(maxsize=1)
def _parser() -> tuple[Lark, _Newlines]:
    post = _Newlines()
    grammar = (Path(__file__).parent / "grammar.lark").read_text()
    return Lark(grammar, parser="lalr", postlex=post, propagate_positions=True,
                maybe_placeholders=True), post


def _pos(tok: Token) -> dict:
    return {"line": tok.line, "col": tok.column}


@v_args(inline=True, meta=True)
class _ToAst(Transformer):
    def __init__(self, origin: str, src: SourceText | None = None):
        super().__init__()
        self.origin = origin
        self.src = src or SourceText(origin, "")

    def start(self, meta, *stmts):
        return A.Program(list(stmts), line=1, col=1)

    def block(self, meta, *stmts):
        return list(stmts)

    def param_decl(self, meta, name, value):
        return A.Param(str(name), value, **_pos(name))

    def tensor_decl(self, meta, kind, name, dtype, dims):
        return A.Decl(str(kind), str(name), str(dtype), dims if dims is not None else [],
                      dtype_pos=(dtype.line, dtype.column), **_pos(kind))

    def dims(self, meta, *exprs):
        return [e for e in exprs if e is not None]

    def fn_def(self, meta, name, *rest):
        *params, body = rest
        return A.FnDef(str(name), [p for p in params if p is not None], body, self.origin, **_pos(name))

    def fn_param(self, meta, name, default):
        return A.FnParam(str(name), default, **_pos(name))

    def for_stmt(self, meta, var, start, _range, stop, body):
        return A.For(str(var), start, stop, body, **_pos(var))

    def output_stmt(self, meta, name, value):
        return A.Output(str(name), value, **_pos(name))

    def return_stmt(self, meta, value):
        return A.Return(value, line=meta.line, col=meta.column)

    def assign(self, meta, name, value):
        return A.Assign(str(name), value, **_pos(name))

    def store(self, meta, name, subs, arrow, value):
        return A.Store(str(name), subs, value, **_pos(arrow))

    def binop(self, meta, left, op, right):
        return A.BinOp(str(op), left, right, **_pos(op))

    def neg(self, meta, op, operand):
        return A.Neg(operand, **_pos(op))

    def index(self, meta, value, subs):
        return A.Index(value, subs, line=meta.line, col=meta.column)

    def attr(self, meta, value, name):
        return A.Attr(value, str(name), **_pos(name))

    def int_lit(self, meta, tok):
        bits = limit("int_bits")
        # int() of a long digit string is slow (and refused past 4,300 digits): check the length first
        if len(tok.lstrip("0")) > bits * 0.302 + 1 or int(tok) >= 2**bits:
            raise SourceError.at(self.src, tok.line, tok.column, f"integer literal too large ({len(tok)} digits): "
                                 f"compile-time integers are below 2**{bits}", how_to_raise("int_bits"))
        return A.Num(int(tok), **_pos(tok))

    def float_lit(self, meta, tok):
        value = float(tok)
        if value == float("inf"):
            raise SourceError.at(self.src, tok.line, tok.column, f"number literal `{tok}` is too large "
                                 "(it overflows a 64-bit float)")
        return A.Num(value, **_pos(tok))

    def name(self, meta, tok):
        return A.Name(str(tok), **_pos(tok))

    def call(self, meta, func, *args):
        args = [a for a in args if a is not None]
        pos = [a for a in args if not isinstance(a, A.Keyword)]
        kws = [a for a in args if isinstance(a, A.Keyword)]
        return A.Call(str(func), pos, kws, **_pos(func))

    def arg(self, meta, value):
        return value

    def kwarg(self, meta, name, value):
        return A.Keyword(str(name), value, **_pos(name))

    def list_lit(self, meta, *items):
        return A.ListLit([i for i in items if i is not None], line=meta.line, col=meta.column)

    def list_comp(self, meta, elt, var, start, _range, stop):
        return A.ListComp(elt, str(var), start, stop, line=meta.line, col=meta.column)

    def subscripts(self, meta, *subs):
        return list(subs)

    def slice(self, meta, start, colon, stop):
        return A.Slice(start, stop, line=meta.line, col=meta.column)


def parse(text: str, name: str = "<string>") -> A.Program:
    """Parse source text into a Program; raises SourceError on a syntax error or a limit
    (source_bytes, nesting, int_bits: isa/limits.py) exceeded."""
    src = SourceText(name, text)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit("source_bytes"):
        raise SourceError([src.diagnostic(0, 0, f"the program is too large: {size:,} bytes",
                                          how_to_raise("source_bytes"))])
    parser, post = _parser()
    try:
        tree = parser.parse(text if text.endswith("\n") else text + "\n")
    except UnexpectedInput as e:
        raise _syntax_error(e, src, post) from None
    check_depth(tree, src)
    try:
        with deep_recursion():
            return _ToAst(name, src).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, RecursionError):
            raise too_deep(src) from None
        raise e.orig_exc from None
    except RecursionError:
        raise too_deep(src) from None


def too_deep(src: SourceText) -> SourceError:
    return SourceError([src.diagnostic(0, 0, "the program is nested too deeply to compile",
                                       how_to_raise("nesting") + " (and keep it below the Python recursion limit)")])


def check_depth(tree, src: SourceText) -> None:
    """Refuse a tree nested deeper than limit 'nesting' (iteratively: the transformer and the
    elaborator recurse, and must stay within the recursion limit deep_recursion() sets)."""
    most = limit("nesting")
    stack = [(tree, 1)]
    while stack:
        t, d = stack.pop()
        if d > most:
            line, col = _where(t)
            raise SourceError.at(src, line, col, f"nesting too deep: more than {most} expressions and blocks "
                                 "within one another", how_to_raise("nesting"))
        stack.extend((c, d + 1) for c in t.children if isinstance(c, Tree))


def _where(t) -> tuple[int, int]:
    meta = t.meta
    if not getattr(meta, "empty", True):
        return meta.line, meta.column
    for c in t.children:
        if isinstance(c, Token):
            return c.line, c.column
    return 0, 0


class deep_recursion:
    """Raise Python's recursion limit while parsing or elaborating a program nested up to limit
    'nesting' (each level takes a few Python frames); a RecursionError still ends as a limit error."""
    FRAMES_PER_LEVEL = 40

    def __enter__(self):
        self.saved = sys.getrecursionlimit()
        sys.setrecursionlimit(max(self.saved, 2000 + self.FRAMES_PER_LEVEL * limit("nesting")))

    def __exit__(self, *exc):
        sys.setrecursionlimit(self.saved)


def _tok_text(tok) -> str:
    if tok.type == "$END":
        return "end of file"
    if tok.type == "_NL":
        return "end of line"
    return f"`{tok}`"


def _syntax_error(e: UnexpectedInput, src: SourceText, post: _Newlines) -> SourceError:
    if isinstance(e, UnexpectedCharacters):
        ch = src.text[e.pos_in_stream] if e.pos_in_stream < len(src.text) else "?"
        shown = f"`{ch}`" if ch.isprintable() else f"U+{ord(ch):04X}"
        return SourceError.at(src, e.line, e.column, f"unexpected character {shown}")
    assert isinstance(e, UnexpectedToken)
    tok, prev, expected = e.token, post.prev, set(e.expected)
    line = tok.line if tok.type != "$END" else len(src.lines)
    col = tok.column if tok.type != "$END" else len(src.lines[-1]) + 1 if src.lines else 1
    open_ = [t for t in post.stack if t is not tok]
    if open_ and (tok.type in ("$END", "_NL") or (prev is not None and tok.line > prev.end_line)):
        opener = open_[-1]
        return SourceError.at(src, opener.line, opener.column,
                              f"missing closing bracket: `{opener}` is never closed",
                              f"add `{OPEN[opener.type]}`")
    if tok.type in CLOSE and not [t for t in post.stack if t.type in OPEN]:
        return SourceError.at(src, line, col, f"unmatched closing bracket `{tok}`")
    if tok.type == "CMPOP" and prev is not None and prev.type in OPERAND_END:
        return SourceError.at(src, line, col, f"comparisons do not chain: unexpected `{tok}` after a comparison",
                              "combine two masks instead: (a < b) * (b < c)")
    start = post.stmt_start
    if start is not None and start.type in ("INPUT", "WEIGHT", "STATE"):
        return SourceError.at(src, line, col, STMT_KIND[start.type] + f", found {_tok_text(tok)}")
    if prev is not None and prev.type in ("ADDOP", "MULOP", "CMPOP", "NEG") and tok.type not in OPERAND_START | {"NEG"}:
        return SourceError.at(src, line, col, f"missing operand after `{prev}`, found {_tok_text(tok)}",
                              "an operator needs a value on each side")
    if prev is not None and prev.type in OPERAND_END and tok.type in OPERAND_START:
        return SourceError.at(src, line, col, f"missing operator between `{prev}` and `{tok}`",
                              "insert an operator (+ - * / @) or a comma")
    want = sorted({TOKEN_TEXT.get(x, f"`{x.lower()}`") for x in expected - {"_NL"}})
    hint = "expected " + ", ".join(want[:6]) if want else ""
    if start is not None and start.type in STMT_KIND:
        return SourceError.at(src, line, col, STMT_KIND[start.type] + f", found {_tok_text(tok)}", hint)
    return SourceError.at(src, line, col, f"unexpected {_tok_text(tok)}", hint)
