"""The typed IR graph: what elaboration produces and every later stage (reference interpreter,
back end, GPU baseline) consumes.

An `IRGraph` is a DAG whose nodes are ints (in program order: a node's inputs have smaller ids);
`.g` is it as a networkx.DiGraph, each node with one attribute, `n`: a `Node`, edges from each
input to its user. Passes copy graphs node by node (compiler/rewrite.py), so the graph keeps
its Nodes and users in lists and builds the networkx view only when something asks for it.
Nodes are not changed once added (a pass that changes one replaces it): a copied graph shares
the Nodes it did not change.

Ops are those of the op table, compiler/ops.py (names, families, dtype and shape rules);
`Node.attrs` keys:

  leaves    input | weight | state  [name]          const [value: np.ndarray of `dtype`]
  cast      [to] (same as dtype)
  reduce    [axis] (non-negative), the axis kept with size 1
  shape     transpose [perm]; reshape [shape]; slice [index]: a tuple, one entry per axis of the
            input: (start, stop) keeps the axis, an int drops it; concat [axis] (n inputs);
            tfold [step, parts, starts, count] (rewrites only: columns transposed, those step
            apart stacked, semantics.tfold)
  masks     causal [offset] (-inf where column > row + offset, last two axes)
            rope [pos, theta] (rotate-half form; rows are positions pos, pos+1, ...)
  effects   store [name, index]: inputs (old state version, value); the node is the new state
            version (shape of the whole state); index as for slice, bounds only (no ints)
            output [name]: inputs (value,)
Elementwise ops, comparisons, `where` (inputs cond, a, b) and matmul have no attributes.

Dtypes are those of isa/dtypes.py. Promotion follows numpy on the two tensor dtypes, except
that i8 @ i8 is i32, f16 @ f16 is f32, and an integer tensor with a float literal (a const of
shape ()) is f32. Division of integers gives f32; comparisons give i8 masks (0 or 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from lpu.compiler import ops
from lpu.compiler.errors import split_lines
from lpu.isa.dtypes import dtype_width

if TYPE_CHECKING:
    import networkx as nx

LEAVES = ops.LEAVES


@dataclass
class Node:
    id: int
    op: str
    inputs: tuple            # node ids, in operand order
    shape: tuple
    dtype: str
    attrs: dict = field(default_factory=dict)
    line: int = 0            # DSL source line (1-based), 0 for none
    col: int = 0

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * dtype_width(self.dtype)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


class IRGraph:
    """The program as a DAG. `decls` maps each declared name to its leaf node id (inputs,
    weights, states); `outputs` maps output names to their `output` node ids; `final_states`
    maps each state name to the id of its last version (its leaf if it is never stored); `loops`
    holds, per top-level `for` loop, the node-id range each trip created (trips whose bodies are
    alike are lowered once and replayed: compiler/replay.py)."""

    def __init__(self, source_name: str = "<string>", source: str = ""):
        self._nodes: list[Node] = []      # by id
        self._users: list[list[int]] = []  # by id: the nodes that read it, ascending
        self._nx: nx.DiGraph | None = None
        self.source_name = source_name
        self.source = source
        self.decls: dict[str, int] = {}
        self.outputs: dict[str, int] = {}
        self.final_states: dict[str, int] = {}
        self.params: dict[str, int] = {}
        self.loops: list[list[tuple[int, int]]] = []   # per top-level `for`: node ids [start, end) per trip

    def add(self, op: str, inputs, shape, dtype: str, attrs=None, line: int = 0, col: int = 0) -> int:
        assert op in ops.OPS, op
        node = Node(len(self._nodes), op, tuple(inputs), tuple(map(int, shape)), dtype, dict(attrs or {}), line, col)
        return self.append(node)

    def append(self, node: Node) -> int:
        """Add a Node made for this graph (its id the next one; a copied graph's unchanged Node)."""
        nid = node.id
        assert nid == len(self._nodes)
        self._nodes.append(node)
        self._users.append([])
        for i in node.inputs:
            us = self._users[i]
            if not us or us[-1] != nid:
                us.append(nid)
        if self._nx is not None:
            self._nx.add_node(nid, n=node)
            self._nx.add_edges_from((i, nid) for i in node.inputs)
        return nid

    def replace(self, node: Node):
        """Put node in place of the Node with its id (same inputs: a changed attribute)."""
        assert node.inputs == self._nodes[node.id].inputs
        self._nodes[node.id] = node
        if self._nx is not None:
            self._nx.nodes[node.id]["n"] = node

    @property
    def g(self) -> nx.DiGraph:
        """The graph as a networkx.DiGraph (built on first use, then kept in step)."""
        if self._nx is None:
            import networkx as nx          # only here: importing it took ~0.14 s of every `lpu run`
            g = nx.DiGraph()
            g.add_nodes_from((n.id, {"n": n}) for n in self._nodes)
            g.add_edges_from((i, n.id) for n in self._nodes for i in n.inputs)
            self._nx = g
        return self._nx

    def node(self, nid: int) -> Node:
        return self._nodes[nid]

    def nodes(self):
        """All nodes in program order (inputs before users)."""
        return list(self._nodes)

    def users(self, nid: int) -> list[int]:
        return list(self._users[nid])

    def __len__(self):
        return len(self._nodes)

    def leaves(self, kind: str) -> list[Node]:
        return [n for n in self.nodes() if n.op == kind]

    def source_lines(self) -> list[str]:
        return split_lines(self.source)
