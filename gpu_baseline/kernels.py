"""Passes 1-3 of the GPU cost model (model.py): which IR ops are free views, which join one
kernel (epilogue and row-kernel fusion), and which merge into a flash-attention kernel, with the
heads of an attention written as a loop batched into one. cost_class() is the one place that
classifies IR ops for the model."""
from __future__ import annotations

from lpu.compiler import ops
from lpu.compiler.ir import IRGraph
from lpu.compiler.ops import LEAVES, REDUCE

# the op table's GPU cost classes (compiler/ops.py)
ELEMENTWISE = ops.gpu_class("elementwise")
VIEWS = ops.gpu_class("view")


def cost_class(op: str) -> str:
    """How the GPU model treats an IR op (leaf, view, gemm, elementwise, reduce, store, concat),
    from the op table's GPU cost classes: the one place the model classifies ops."""
    if op in LEAVES:
        return "leaf"
    if op in VIEWS:
        return "view"
    if op == "matmul":
        return "gemm"
    if op in REDUCE:
        return "reduce"
    if op in ELEMENTWISE:
        return "elementwise"
    return op                                 # "store", "concat"


class Kernel:
    def __init__(self, head: int, has_matmul: bool):
        self.head = head
        self.members = [head]
        self.has_matmul = has_matmul
        self.flash = False
        self.heads = 1          # flash kernels of sibling heads batched into this one


def read_inputs(n) -> tuple:
    """The inputs a node actually reads: a store reads its value, not the old state version."""
    return n.inputs[1:] if n.op == "store" else n.inputs


# ---- passes 1-3: views, kernels, attention ---------------------------------------------------
def free_nodes(nodes: dict, fuse: bool) -> set:
    free = set()
    users: dict = {}
    for n in nodes.values():
        for i in n.inputs:
            users.setdefault(i, []).append(n.id)
    for n in sorted(nodes.values(), key=lambda m: m.id):
        if cost_class(n.op) in ("leaf", "view"):
            free.add(n.id)
        elif n.op == "concat" and fuse and all(nodes[i].op not in LEAVES for i in n.inputs):
            free.add(n.id)
        elif fuse and n.op == "cast" and weight_view(nodes, free, n.inputs[0]) and all(
                nodes[u].op == "matmul" for u in users.get(n.id, ())):
            free.add(n.id)      # weight-only quantisation: the matmul reads the stored bytes and widens them
    return free


def weight_view(nodes: dict, free: set, nid: int) -> bool:
    while nid in free and nodes[nid].op not in LEAVES and nodes[nid].inputs:
        nid = nodes[nid].inputs[0]
    return nodes[nid].op == "weight"


def sources(nodes: dict, free: set, nid: int) -> list:
    """(base node, bytes read) for reading node `nid`: views resolve to the tensors they view."""
    n = nodes[nid]
    if nid not in free or n.op in LEAVES:
        return [(nid, float(n.nbytes))]
    out = []
    if n.op == "concat":
        for i in n.inputs:
            out += sources(nodes, free, i)
        return out
    src = nodes[n.inputs[0]]
    scale = n.size / max(src.size, 1)
    return [(b, nb * scale) for b, nb in sources(nodes, free, src.id)]


def form_kernels(nodes: dict, free: set, fuse: bool):
    kernels: list[Kernel] = []
    kernel_of: dict[int, Kernel] = {}
    for n in sorted(nodes.values(), key=lambda m: m.id):
        if n.id in free:
            continue
        target = None
        if fuse and cost_class(n.op) in ("elementwise", "reduce", "store"):
            bases = {b for i in read_inputs(n) for b, _ in sources(nodes, free, i)}
            cands = sorted({kernel_of[b] for b in bases if b in kernel_of}, key=lambda k: -k.head)
            for k in cands:
                if n.op in REDUCE and k.has_matmul:
                    continue
                if all(b not in kernel_of or kernel_of[b] is k or kernel_of[b].head < k.head for b in bases):
                    target = k
                    break
        if target is None:
            target = Kernel(n.id, n.op == "matmul")
            kernels.append(target)
        else:
            target.members.append(n.id)
        kernel_of[n.id] = target
    return kernels, kernel_of


def unfuse_but_attention(kernels, kernel_of, nodes):
    """PyTorch eager: a fused attention call (scaled_dot_product_attention) stays one kernel, every
    other op is a kernel of its own."""
    out = []
    for k in kernels:
        if k.flash:
            out.append(k)
            continue
        for m in k.members:
            single = Kernel(m, nodes[m].op == "matmul")
            kernel_of[m] = single
            out.append(single)
    return out


def consumers(graph: IRGraph, nodes: dict, free: set, nid: int) -> set:
    """Kernel nodes that read `nid` (through views); -1 stands for a graph output."""
    out = set()
    for u in graph.users(nid):
        if nodes[u].op == "output":
            out.add(-1)
        elif u in free:
            out |= consumers(graph, nodes, free, u)
        elif not (nodes[u].op == "store" and nodes[u].inputs[0] == nid):
            out.add(u)
    return out


def merge_attention(graph, nodes, free, kernels, kernel_of):
    """score GEMM kernel S -> softmax kernel R -> value GEMM kernel C  =>  one flash kernel."""
    def ext_bases(k):
        return {b for m in k.members for i in read_inputs(nodes[m])
                for b, _ in sources(nodes, free, i) if kernel_of.get(b) is not k}

    def readers(k):
        return {kernel_of[c] if c >= 0 else None for m in k.members
                for c in consumers(graph, nodes, free, m)} - {k}

    for c in [k for k in kernels if k.has_matmul and not k.flash]:
        a_bases = [b for b, _ in sources(nodes, free, nodes[c.head].inputs[0])]
        r = kernel_of.get(a_bases[0]) if len(a_bases) == 1 else None
        if r is None or r.has_matmul or not any(nodes[m].op in REDUCE for m in r.members) \
                or not any(nodes[m].op == "exp" for m in r.members):     # a softmax, not a norm
            continue
        s_set = {kernel_of[b] for b in ext_bases(r) if b in kernel_of}
        if len(s_set) != 1:
            continue
        s = s_set.pop()
        if not s.has_matmul or s.flash or readers(s) != {r} or readers(r) != {c}:
            continue
        if any(kernel_of[b].head >= s.head for b in ext_bases(c) if b in kernel_of and kernel_of[b] not in (r, s)):
            continue
        s.members += r.members + c.members
        s.flash = True
        for m in r.members + c.members:
            kernel_of[m] = s
        kernels = [k for k in kernels if k is not r and k is not c]
    return kernels


def batch_heads(graph, nodes, free, kernels, kernel_of):
    """Flash kernels of the same shape that read nothing of each other and feed the same kernels
    (an attention written as a loop over heads, joined by a concat) => one kernel over all the
    heads, as scaled_dot_product_attention and flash-attention run a batch of heads."""
    groups: dict = {}
    for k in kernels:
        if not k.flash:
            continue
        sig = tuple((nodes[m].op, nodes[m].shape) for m in k.members)
        cons = frozenset(kernel_of[c].head if c >= 0 else -1 for m in k.members
                         for c in consumers(graph, nodes, free, m) if c < 0 or kernel_of.get(c) is not k)
        groups.setdefault((sig, cons), []).append(k)
    gone = set()
    for group in groups.values():
        if len(group) < 2:
            continue
        first = group[0]
        mine = {m for k in group for m in k.members}
        reads = {b for k in group for m in k.members for i in read_inputs(nodes[m])
                 for b, _ in sources(nodes, free, i) if kernel_of.get(b) not in (k, None)}
        if reads & mine:            # one head reads another's result: not siblings
            continue
        for k in group[1:]:
            first.members += k.members
            first.heads += k.heads
            for m in k.members:
                kernel_of[m] = first
            gone.add(id(k))
    return [k for k in kernels if id(k) not in gone]
