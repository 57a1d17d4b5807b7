"""Source text -> AST (compiler/ast.py). Lark LALR with grammar.lark; Lark's errors become
SourceErrors with a classification ("missing closing bracket", "missing operator", ...)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from lpu.compiler import ast as A
from lpu.compiler.errors import SourceError, SourceText

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
    def __init__(self, origin: str):
        super().__init__()
        self.origin = origin

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
        return A.Num(int(tok), **_pos(tok))

    def float_lit(self, meta, tok):
        return A.Num(float(tok), **_pos(tok))

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
    """Parse source text into a Program; raises SourceError on a syntax error."""
    parser, post = _parser()
    src = SourceText(name, text)
    try:
        tree = parser.parse(text if text.endswith("\n") else text + "\n")
    except UnexpectedInput as e:
        raise _syntax_error(e, src, post) from None
    try:
        return _ToAst(name).transform(tree)
    except VisitError as e:  # pragma: no cover - a transformer bug, not a user error
        raise e.orig_exc


def _tok_text(tok) -> str:
    if tok.type == "$END":
        return "end of file"
    if tok.type == "_NL":
        return "end of line"
    return f"`{tok}`"


def _syntax_error(e: UnexpectedInput, src: SourceText, post: _Newlines) -> SourceError:
    if isinstance(e, UnexpectedCharacters):
        ch = src.text[e.pos_in_stream] if e.pos_in_stream < len(src.text) else "?"
        return SourceError.at(src, e.line, e.column, f"unexpected character `{ch}`")
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
