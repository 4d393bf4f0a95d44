"""Dependency groups for structured pruning: which channels must be removed together.

Every output channel of a *source* (Conv with ``group=1``, Gemm, or MatMul with a constant
2-D weight) is an **atom**. Walking the graph in topological order, each tensor that carries
channels gets a *layout*: the atom of each of its channel positions, the channel axis, and
whether it was flattened. Ops either keep the layout, couple layouts, or end it:

* pass-through (same atoms): elementwise activations (Relu, Clip, Sigmoid, HardSigmoid,
  HardSwish, LeakyRelu, Tanh, …), PRelu and BatchNormalization (their parameters are
  sliced), Add/Sub/Mul/Div/Max/Min with constants (per-channel constants are sliced),
  MaxPool/AveragePool/GlobalAveragePool/GlobalMaxPool, Resize with scale 1 on the channel
  axis, Pad with no channel padding, Transpose (the channel axis moves), ReduceMean/… with
  ``keepdims=1`` over other axes, depthwise Conv (``group = C_in = C_out``; its weight,
  bias and ``group`` follow);
* coupling: an elementwise op whose operands carry layouts (residual Add/Sum, SE gate Mul)
  unites the atoms position by position — channel k of every operand is one **unit**;
* Concat on the channel axis concatenates layouts (channel ranges map to their inputs); an
  operand without a layout contributes fresh atoms that cannot be pruned;
* Flatten, and a Reshape that merges the channel axis with the axes after it (concrete
  shapes from one ONNX Runtime run decide), make a *flat* layout: channel c becomes the
  features ``o·C·inner + c·inner + i`` (``inner`` = product of the dims after the channel
  axis, ``outer`` = product of the flattened dims before it), read only by Gemm/MatMul;
* consumers: Conv (``group=1``), Gemm (``transA=0``) and MatMul with a constant weight read
  the channels as input channels — their weights are sliced along the input axis;
* Shape is allowed only when its result is sliced/gathered to dims before the channel axis.

Everything else blocks the atoms it touches, with the reason kept for the report: graph
outputs, unknown ops, use inside a subgraph, Transpose/Reshape that mix the channel axis,
grouped (non-depthwise) Conv, shared weights at consumers, mismatched broadcasts.

A **group** is a connected set of units (linked by a shared source, consumer or tensor);
:meth:`ChannelGraph.describe` prints one like Torch-Pruning's ``group.details()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from ._graph import attr, const_value, is_graph_output

UNARY = {
    "Relu", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh", "Elu", "Selu", "Softplus",
    "Softsign", "Identity", "Neg", "Abs", "Exp", "Sqrt", "Erf", "Gelu", "Mish", "Clip", "Dropout",
    "Celu", "ThresholdedRelu", "Sin", "Cos", "Floor", "Ceil", "Round", "Reciprocal", "Log", "Cast",
}
BINARY = {"Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Mean", "Pow"}
POOLS = {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool", "GlobalLpPool"}
REDUCE = {"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceL2", "ReduceL1"}


@dataclass
class Layout:
    """Channel positions of one tensor: ``atoms[k]`` is the atom at channel position ``k``."""

    atoms: np.ndarray
    axis: int  # position of the channel axis counted from the front
    rank: int
    flat: tuple | None = None  # (outer, inner) when flattened for a Gemm/MatMul

    @property
    def size(self) -> int:
        return len(self.atoms)


@dataclass
class Source:
    node: gs.Node
    kind: str  # conv | gemm | matmul
    out_axis: int  # axis of the weight that indexes output channels


@dataclass
class Consumer:
    node: gs.Node
    tensor: gs.Tensor
    kind: str  # conv | gemm | matmul
    in_axis: int  # axis of the weight that indexes input channels/features


@dataclass
class ParamSlice:
    """A constant input of a node sliced along ``axis`` by the layout of ``tensor``."""

    node: gs.Node
    index: int
    axis: int
    tensor: gs.Tensor


class UnionFind:
    def __init__(self):
        self.parent: list = []

    def new(self, n: int) -> np.ndarray:
        start = len(self.parent)
        self.parent.extend(range(start, start + n))
        return np.arange(start, start + n)

    def find(self, a: int) -> int:
        root = a
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[a] != root:
            self.parent[a], a = root, self.parent[a]
        return root

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)
        return min(ra, rb)


@dataclass
class ChannelGraph:
    """The result of :func:`analyse`: layouts, roles, units, blocked units with reasons."""

    graph: gs.Graph
    layouts: dict = field(default_factory=dict)  # tensor name -> Layout
    tensors: dict = field(default_factory=dict)  # tensor name -> gs.Tensor
    sources: list = field(default_factory=list)
    consumers: list = field(default_factory=list)
    params: list = field(default_factory=list)
    depthwise: list = field(default_factory=list)  # (node, tensor) depthwise convs (group attr)
    reshapes: list = field(default_factory=list)  # (node, position of the merged dim)
    passthrough: list = field(default_factory=list)  # nodes in some group (for explain)
    uf: UnionFind = field(default_factory=UnionFind)
    block_atoms: dict = field(default_factory=dict)  # atom -> reason

    # --- building -------------------------------------------------------------
    def set_layout(self, tensor, layout: Layout) -> None:
        self.layouts[tensor.name] = layout
        self.tensors[tensor.name] = tensor

    def block(self, layout: Layout, reason: str) -> None:
        for a in layout.atoms:
            self.block_atoms.setdefault(int(a), reason)

    # --- queries ----------------------------------------------------------------
    def unit(self, atom: int) -> int:
        return self.uf.find(int(atom))

    def units_of(self, name: str) -> np.ndarray:
        return np.array([self.unit(a) for a in self.layouts[name].atoms], dtype=np.int64)

    def blocked_units(self) -> dict:
        out = {}
        for atom, reason in self.block_atoms.items():
            out.setdefault(self.unit(atom), reason)
        return out

    def all_units(self) -> set:
        return {self.unit(a) for lay in self.layouts.values() for a in lay.atoms}

    def groups(self) -> list:
        """Connected sets of units: units that appear in the same tensor are in one group."""
        uf = UnionFind()
        index = {u: i for i, u in enumerate(sorted(self.all_units()))}
        uf.new(len(index))
        for name in self.layouts:
            units = self.units_of(name)
            for u in units[1:]:
                uf.union(index[int(units[0])], index[int(u)])
        groups: dict = {}
        for u, i in index.items():
            groups.setdefault(uf.find(i), []).append(u)
        return [sorted(g) for g in groups.values()]

    def source_groups(self) -> list:
        """Units linked through a source's output (and the couplings behind it), not Concat.

        The unit of selection for ``ratio``: each group's kept count is one source's (or one
        residual chain's) channel count, so ``multiple`` applies to real layer widths.
        """
        uf = UnionFind()
        index = {u: i for i, u in enumerate(sorted(self.all_units()))}
        uf.new(len(index))
        for s in self.sources:
            units = self.units_of(s.node.outputs[0].name)
            for u in units[1:]:
                uf.union(index[int(units[0])], index[int(u)])
        groups: dict = {}
        for u, i in index.items():
            groups.setdefault(uf.find(i), []).append(u)
        return [sorted(g) for g in groups.values()]

    def describe(self, group: list) -> str:
        """One group in words: sources, nodes it passes through, consumers, status."""
        units = set(group)
        names = [n for n in self.layouts if units & set(self.units_of(n).tolist())]
        name_set = set(names)
        srcs = [s for s in self.sources if s.node.outputs[0].name in name_set]
        cons = [c for c in self.consumers if c.tensor.name in name_set]
        through = []
        for node in self.passthrough:
            if any(t.name in name_set for t in node.outputs):
                through.append(f"{node.op} {node.name or node.outputs[0].name!r}")
        blocked = self.blocked_units()
        reasons = sorted({blocked[u] for u in units if u in blocked})
        status = "prunable" if not reasons else (
            f"{sum(u in blocked for u in units)}/{len(units)} units blocked: {'; '.join(reasons)}")
        lines = [f"group of {len(units)} channel units — {status}"]
        lines += [f"  source   {s.node.op} {s.node.name!r} ({self.layouts[s.node.outputs[0].name].size} out)"
                  for s in srcs]
        lines += [f"  through  {t}" for t in dict.fromkeys(through)]
        lines += [f"  consumer {c.node.op} {c.node.name!r} (input {c.tensor.name!r})" for c in cons]
        return "\n".join(lines)


def analyse(graph: gs.Graph, shapes: dict) -> ChannelGraph:
    """Build the channel graph of ``graph`` (topologically sorted); ``shapes``: name → concrete shape."""
    cg = ChannelGraph(graph)
    main_nodes = {id(n) for n in graph.nodes}
    for node in graph.nodes:
        _visit(cg, node, shapes)
        for out in node.outputs:
            if out.name in cg.layouts:
                if is_graph_output(out, graph):
                    cg.block(cg.layouts[out.name], "reaches a graph output")
                if any(id(user) not in main_nodes for user in out.outputs):
                    cg.block(cg.layouts[out.name], "used inside a subgraph")
    return cg


def _visit(cg: ChannelGraph, node: gs.Node, shapes: dict) -> None:
    ins = [cg.layouts.get(t.name) if isinstance(t, gs.Variable) else None for t in node.inputs]
    if node.domain not in (None, "", "ai.onnx"):
        _block_all(cg, node, ins, f"unknown op {node.domain}.{node.op}")
        return
    weight_role = _weight_role(node)
    if weight_role is not None:
        _visit_weighted(cg, node, ins, weight_role, shapes)
        return
    if not any(lay is not None for lay in ins):
        return
    handler = _HANDLERS.get(node.op)
    if handler is None:
        if node.op in UNARY:
            handler = _unary
        elif node.op in BINARY:
            handler = _binary
        elif node.op in POOLS:
            handler = _pool
        elif node.op in REDUCE:
            handler = _reduce
    reason = handler(cg, node, ins, shapes) if handler else f"unknown op {node.op}"
    if reason:
        _block_all(cg, node, ins, reason)
    elif node.op not in ("Shape",):
        cg.passthrough.append(node)


def _block_all(cg, node, ins, reason) -> None:
    for lay in ins:
        if lay is not None:
            cg.block(lay, f"{reason} ({node.name or node.op})")


# --- sources and consumers ---------------------------------------------------------------

def _weight_role(node: gs.Node):
    """('conv'|'gemm'|'matmul'|'depthwise'|'grouped', weight) for weighted nodes, else None."""
    if node.op == "Conv" and len(node.inputs) >= 2:
        w = const_value(node.inputs[1])
        if w is None or w.ndim < 3:
            return None
        group = int(attr(node, "group", 1))
        if group == 1:
            return "conv"
        if group == w.shape[0] and w.shape[1] == 1:
            return "depthwise"
        return "grouped"
    if node.op == "Gemm" and len(node.inputs) >= 2 and const_value(node.inputs[1]) is not None:
        return "gemm"
    if node.op == "MatMul" and const_value(node.inputs[1]) is not None and const_value(node.inputs[1]).ndim == 2:
        return "matmul"
    return None


def _shared(tensor, node) -> bool:
    return any(user is not node for user in tensor.outputs)


def _visit_weighted(cg, node, ins, role, shapes) -> None:
    x, lay = node.inputs[0], ins[0]
    w = const_value(node.inputs[1])
    for extra in ins[1:]:
        if extra is not None:
            cg.block(extra, f"{node.op} reads channels as a weight ({node.name})")
    if role == "depthwise":
        if lay is None:
            return
        if lay.flat or lay.axis != 1 or lay.size != w.shape[0]:
            cg.block(lay, f"depthwise Conv input layout mismatch ({node.name})")
            return
        cg.set_layout(node.outputs[0], Layout(lay.atoms, 1, lay.rank))
        cg.depthwise.append((node, node.outputs[0]))
        cg.params.append(ParamSlice(node, 1, 0, node.outputs[0]))
        if len(node.inputs) > 2 and node.inputs[2] is not None and const_value(node.inputs[2]) is not None:
            cg.params.append(ParamSlice(node, 2, 0, node.outputs[0]))
        cg.passthrough.append(node)
        return
    if role == "grouped":
        if lay is not None:
            cg.block(lay, f"grouped Conv ({node.name})")
        return
    trans_a = int(attr(node, "transA", 0)) if role == "gemm" else 0
    trans_b = int(attr(node, "transB", 0)) if role == "gemm" else 0
    in_axis, out_axis = (1, 0) if role == "conv" else ((1, 0) if trans_b else (0, 1))
    if lay is not None:
        expected_axis = 1 if role == "conv" else lay.rank - 1
        features = w.shape[in_axis]
        reason = None
        if trans_a:
            reason = "Gemm with transA"
        elif lay.axis != expected_axis:
            reason = f"{node.op} reads the channels on another axis"
        elif lay.flat is not None and (role == "conv" or lay.flat[0] * lay.size * lay.flat[1] != features):
            reason = f"{node.op} feature count does not match the flattened channels"
        elif lay.flat is None and lay.size != features:
            reason = f"{node.op} input count mismatch"
        elif _shared(node.inputs[1], node):
            reason = f"{node.op} weight shared with another node"
        if reason:
            cg.block(lay, f"{reason} ({node.name})")
        else:
            cg.consumers.append(Consumer(node, x, role, in_axis))
    if _shared(node.inputs[1], node) or (role == "gemm" and len(node.inputs) > 2 and node.inputs[2] is not None
                                         and const_value(node.inputs[2]) is None):
        return
    out = node.outputs[0]
    rank = len(shapes[out.name]) if out.name in shapes else (w.ndim if role == "conv" else None)
    if rank is None:
        return
    atoms = cg.uf.new(w.shape[out_axis])
    cg.set_layout(out, Layout(atoms, 1 if role == "conv" else rank - 1, rank))
    cg.sources.append(Source(node, role, out_axis))


# --- pass-through and coupling ops ------------------------------------------------------------

def _first(ins):
    return next(lay for lay in ins if lay is not None)


def _unary(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or lay.flat:
        return f"{node.op} on flattened channels" if lay is not None else f"{node.op} reads channels as a parameter"
    if node.op == "Dropout" and len(node.outputs) > 1 and node.outputs[1].outputs:
        return "Dropout mask used"
    if any(lay2 is not None for lay2 in ins[1:]):
        return f"{node.op} reads channels as a parameter"
    cg.set_layout(node.outputs[0], lay)
    return None


def _channel_param(value: np.ndarray, lay: Layout):
    """'scalar' (same for every channel), 'slice' (per-channel along the axis) or None."""
    if value.size == 1:
        return "scalar"
    offset = lay.rank - value.ndim  # numpy broadcasting aligns from the right
    pos = lay.axis - offset
    if value.ndim > lay.rank:
        return None
    if pos < 0 or value.shape[pos] == 1:
        return "scalar"  # constant along the channel axis
    return "slice" if value.shape[pos] == lay.size else None


def _binary(cg, node, ins, shapes):
    lays = [lay for lay in ins if lay is not None]
    ref = lays[0]
    if any(lay.flat for lay in lays):
        return f"{node.op} on flattened channels"
    for lay in lays[1:]:
        if lay.size != ref.size or lay.rank - lay.axis != ref.rank - ref.axis:
            return f"{node.op} operands with different channel layouts"
    rank = max(lay.rank for lay in lays)
    for i, (t, lay) in enumerate(zip(node.inputs, ins)):
        if lay is not None:
            continue
        value = const_value(t)
        if value is None:
            return f"{node.op} with a tensor outside the group"
        kind = _channel_param(value, ref)
        if kind is None:
            return f"{node.op} constant does not broadcast per channel"
        if node.op == "Pow" and kind == "slice":
            return "Pow with per-channel exponent"
        if kind == "slice":
            cg.params.append(ParamSlice(node, i, ref.axis - (ref.rank - value.ndim), node.outputs[0]))
    for lay in lays[1:]:
        for a, b in zip(ref.atoms, lay.atoms):
            cg.uf.union(int(a), int(b))
    out_rank = len(shapes.get(node.outputs[0].name, ())) or rank
    cg.set_layout(node.outputs[0], Layout(ref.atoms, ref.axis + (out_rank - ref.rank), out_rank))
    return None


def _prelu(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or lay.flat or ins[1] is not None:
        return "PRelu slope carries channels"
    slope = const_value(node.inputs[1])
    if slope is None:
        return "PRelu with a non-constant slope"
    kind = _channel_param(slope, lay)
    if kind is None:
        return "PRelu slope does not broadcast per channel"
    if kind == "slice":
        cg.params.append(ParamSlice(node, 1, lay.axis - (lay.rank - slope.ndim), node.outputs[0]))
    cg.set_layout(node.outputs[0], lay)
    return None


def _batchnorm(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or lay.flat or lay.axis != 1 or any(x is not None for x in ins[1:]):
        return "BatchNormalization on another axis"
    if len(node.outputs) != 1 or int(attr(node, "training_mode", 0)):
        return "BatchNormalization in training mode"
    if any(const_value(t) is None for t in node.inputs[1:5]):
        return "BatchNormalization with non-constant parameters"
    for i in range(1, 5):
        cg.params.append(ParamSlice(node, i, 0, node.outputs[0]))
    cg.set_layout(node.outputs[0], lay)
    return None


def _pool(cg, node, ins, shapes):
    lay = ins[0]
    if lay.flat or lay.axis != 1:
        return f"{node.op} on another axis"
    if len(node.outputs) > 1 and node.outputs[1].outputs:
        return "MaxPool indices used"
    cg.set_layout(node.outputs[0], lay)
    return None


def _resize(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or lay.flat or any(x is not None for x in ins[1:]):
        return "Resize reads channels as a parameter"
    out = shapes.get(node.outputs[0].name)
    if out is None or len(out) != lay.rank or out[lay.axis] != lay.size:
        return "Resize changes the channel axis"
    sizes = const_value(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    if sizes is not None and sizes.size:
        cg.params.append(ParamSlice(node, 3, -1, node.outputs[0]))  # sizes: rewrite the channel entry
    elif len(node.inputs) > 3 and node.inputs[3] is not None and const_value(node.inputs[3]) is None:
        return "Resize with computed sizes"
    cg.set_layout(node.outputs[0], lay)
    return None


def _pad(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or lay.flat or any(x is not None for x in ins[1:]):
        return "Pad reads channels as a parameter"
    pads = const_value(node.inputs[1]) if len(node.inputs) > 1 else np.asarray(attr(node, "pads", []))
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        return "Pad with axes"
    if pads is None or pads.size != 2 * lay.rank:
        return "Pad with unknown pads"
    if pads[lay.axis] or pads[lay.axis + lay.rank]:
        return "Pad on the channel axis"
    cg.set_layout(node.outputs[0], lay)
    return None


def _reduce(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None:
        return f"{node.op} reads channels as axes"
    axes = attr(node, "axes")
    if axes is None and len(node.inputs) > 1:
        value = const_value(node.inputs[1])
        axes = None if value is None else value.tolist()
    if lay.flat or axes is None or int(attr(node, "keepdims", 1)) != 1:
        return f"{node.op} over unknown axes or without keepdims"
    if lay.axis in {a % lay.rank for a in axes}:
        return f"{node.op} over the channel axis"
    cg.set_layout(node.outputs[0], lay)
    return None


def _concat(cg, node, ins, shapes):
    ref = _first(ins)
    axis = int(attr(node, "axis")) % ref.rank
    if ref.flat or axis != ref.axis:
        return "Concat on another axis"
    parts = []
    for t, lay in zip(node.inputs, ins):
        if lay is None:
            shape = shapes.get(t.name) if not isinstance(t, gs.Constant) else const_value(t).shape
            if shape is None or len(shape) != ref.rank:
                return "Concat with an input of unknown shape"
            lay = Layout(cg.uf.new(int(shape[axis])), axis, ref.rank)
            cg.block(lay, f"concatenated with channels from outside the group ({node.name})")
            cg.set_layout(t, lay)
        elif lay.flat or lay.axis != axis or lay.rank != ref.rank:
            return "Concat inputs with different layouts"
        parts.append(lay.atoms)
    cg.set_layout(node.outputs[0], Layout(np.concatenate(parts), axis, ref.rank))
    return None


def _transpose(cg, node, ins, shapes):
    lay = ins[0]
    perm = attr(node, "perm") or list(range(lay.rank))[::-1]
    if lay.flat or len(perm) != lay.rank:
        return "Transpose of flattened channels"
    cg.set_layout(node.outputs[0], Layout(lay.atoms, list(perm).index(lay.axis), lay.rank))
    return None


def _flatten_like(cg, node, lay, start, shapes):
    """Merge of dims ``start…`` of the input into one: the channel axis must be among them."""
    in_shape = shapes.get(node.inputs[0].name)
    if in_shape is None or lay.flat:
        return "flatten of unknown shape"
    if lay.axis < start:
        return f"{node.op} mixes the channel axis with the batch axes"
    outer = int(np.prod(in_shape[start:lay.axis], dtype=np.int64))
    inner = int(np.prod(in_shape[lay.axis + 1:], dtype=np.int64))
    flat = None if outer == 1 and inner == 1 else (outer, inner)
    cg.set_layout(node.outputs[0], Layout(lay.atoms, start, start + 1, flat))
    return None


def _flatten(cg, node, ins, shapes):
    lay = ins[0]
    return _flatten_like(cg, node, lay, int(attr(node, "axis", 1)) % max(lay.rank, 1), shapes)


def _reshape(cg, node, ins, shapes):
    lay = ins[0]
    if lay is None or ins[1] is not None:
        return "Reshape reads channels as a shape"
    src, dst = shapes.get(node.inputs[0].name), shapes.get(node.outputs[0].name)
    if src is None or dst is None:
        return "Reshape of unknown shape"
    start = len(dst) - 1
    if lay.flat or list(src[:start]) != list(dst[:start]) or int(np.prod(src[start:])) != dst[-1]:
        return "Reshape that mixes the channel axis"
    target = shapes.get(("value", node.inputs[1].name))
    if target is None or len(target) != len(dst):
        return "Reshape with an unknown target shape"
    if target[start] != -1 and not (target[start] == 0 and lay.axis == start == len(src) - 1):
        if const_value(node.inputs[1]) is None:
            return "Reshape whose computed shape fixes the channel count"
        if int(attr(node, "allowzero", 0)):
            return "Reshape with allowzero and a fixed channel count"
        cg.reshapes.append((node, start))  # target becomes [0, …, 0, -1]
    return _flatten_like(cg, node, lay, start, shapes)


def _shape(cg, node, ins, shapes):
    """Shape is harmless when only dims before the channel axis are used."""
    lay = ins[0]
    end = attr(node, "end")
    if end is not None and int(attr(node, "start", 0)) >= 0 and 0 <= int(end) <= lay.axis:
        return None
    for user in node.outputs[0].outputs:
        if user.op == "Slice" and len(user.inputs) >= 3:
            starts, ends = const_value(user.inputs[1]), const_value(user.inputs[2])
            axes = const_value(user.inputs[3]) if len(user.inputs) > 3 and user.inputs[3] is not None else None
            if starts is not None and ends is not None and (axes is None or list(axes) == [0]) \
                    and len(ends) == 1 and 0 <= int(ends[0]) <= lay.axis and int(starts[0]) >= 0:
                continue
        if user.op == "Gather":
            idx = const_value(user.inputs[1])
            if idx is not None and np.all((idx >= 0) & (idx < lay.axis)):
                continue
        return "Shape of the channels used"
    return None


_HANDLERS = {
    "PRelu": _prelu,
    "BatchNormalization": _batchnorm,
    "Resize": _resize,
    "Pad": _pad,
    "Concat": _concat,
    "Transpose": _transpose,
    "Flatten": _flatten,
    "Reshape": _reshape,
    "Shape": _shape,
}
