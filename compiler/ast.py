"""The syntax tree of a .lpu program: plain dataclasses, each with its source `line` and `col`
(1-based). parse.py builds it from the Lark tree; elaborate.py walks it."""
from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field


@dataclass
class Pos:
    _: KW_ONLY
    line: int = 0
    col: int = 0


# ---- expressions -------------------------------------------------------------------------

@dataclass
class Num(Pos):
    value: int | float


@dataclass
class Name(Pos):
    id: str


@dataclass
class BinOp(Pos):
    op: str              # + - * / % @ < <= > >= == !=
    left: "Expr"
    right: "Expr"


@dataclass
class Neg(Pos):
    operand: "Expr"


@dataclass
class Keyword(Pos):
    name: str
    value: "Expr"


@dataclass
class Call(Pos):
    func: str
    args: list["Expr"]
    kwargs: list[Keyword]


@dataclass
class Slice(Pos):
    start: "Expr | None"
    stop: "Expr | None"


@dataclass
class Index(Pos):
    value: "Expr"
    subs: list["Expr | Slice"]


@dataclass
class Attr(Pos):
    value: "Expr"
    name: str


@dataclass
class ListLit(Pos):
    items: list["Expr"]


@dataclass
class ListComp(Pos):
    elt: "Expr"
    var: str
    start: "Expr"
    stop: "Expr"


Expr = Num | Name | BinOp | Neg | Call | Index | Attr | ListLit | ListComp


# ---- statements --------------------------------------------------------------------------

@dataclass
class Param(Pos):
    name: str
    value: Expr


@dataclass
class Decl(Pos):
    kind: str            # input | weight | state
    name: str
    dtype: str
    dims: list[Expr]
    dtype_pos: tuple = (0, 0)


@dataclass
class FnParam(Pos):
    name: str
    default: Expr | None


@dataclass
class FnDef(Pos):
    name: str
    params: list[FnParam]
    body: list["Stmt"]
    origin: str = ""     # file the function was defined in (the prelude or the user's file)


@dataclass
class For(Pos):
    var: str
    start: Expr
    stop: Expr
    body: list["Stmt"]


@dataclass
class Output(Pos):
    name: str
    value: Expr | None


@dataclass
class Return(Pos):
    value: Expr


@dataclass
class Assign(Pos):
    name: str
    value: Expr


@dataclass
class Store(Pos):
    name: str
    subs: list[Expr | Slice]
    value: Expr


Stmt = Param | Decl | FnDef | For | Output | Return | Assign | Store


@dataclass
class Program(Pos):
    stmts: list[Stmt] = field(default_factory=list)
