"""Which tensors of which nodes may become float16, and which nodes must stay float32.

Slots. From the op schema (``onnx.defs``, at the model's opset), every input/output of a node
has a formal type: a type variable (``T``) or a fixed type (``tensor(float)``). A *slot* is
convertible when

1. its formal type is a variable whose allowed types include ``tensor(float16)``,
2. the tensor in it is float32 now, and
3. for an output: the variable also types some input (outputs typed by an attribute — Cast,
   ConstantOfShape, RandomNormal … — are not convertible).

All slots of one variable are tied: a node is *eligible* for float16 when every variable
bound to float32 allows float16 and the dtypes of all its tied slots are known.

Float32 is kept (with a counted reason) for: ops with subgraphs (If/Loop/Scan: their bodies
are not converted), custom-domain ops, the default block list :data:`DEFAULT_BLOCK_OPS`, the
nodes the user's ``exclude=`` selector or the global ``--exclude`` selects (by name: the
``excluded`` map of :func:`build_plan`), and shape computations (nodes whose non-constant
inputs all derive from Shape/Size: their float values are sizes, kept exact).

Cast count (what :func:`merge_islands` minimises): for each float32 tensor on convertible
slots, one Cast when its producer's precision differs from that of at least one reader
(graph inputs/outputs count with the precision ``keep_io`` gives them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import ONNX_DOMAINS

F32 = np.dtype(np.float32)
F16_TYPE = "tensor(float16)"

# Why each is blocked: shape/index producers (exact integers needed downstream), random
# generators (dtype fixed by an attribute), long accumulations, coordinate transforms whose
# float scales/ROIs are sizes, and the type-boundary ops themselves.
DEFAULT_BLOCK_OPS = frozenset({
    "Range", "TopK", "NonMaxSuppression", "RoiAlign", "ArgMax", "ArgMin",
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
    "CumSum", "Resize", "Upsample", "GridSample",
    "Cast", "CastLike", "EyeLike", "ConstantOfShape",
})
SHAPE_SOURCES = ("Shape", "Size")


@dataclass
class NodeInfo:
    index: int
    node: gs.Node
    ins: list = field(default_factory=list)  # indices of convertible input slots
    outs: list = field(default_factory=list)  # indices of convertible output slots
    reason: str | None = None  # why it must stay float32 (None: eligible)

    @property
    def float_const_elements(self) -> int:
        return sum(int(np.prod(self.node.inputs[i].shape)) for i in self.ins
                   if isinstance(self.node.inputs[i], gs.Constant))


def build_plan(graph: gs.Graph, dtypes: dict, excluded: dict, default_block: bool) -> list:
    """A :class:`NodeInfo` for every node of ``graph`` that touches float32 tensors.
    ``excluded``: node name → the reason it stays float32 (the user's selections)."""
    shape_nodes = _shape_computation(graph)
    blocked_ops = DEFAULT_BLOCK_OPS if default_block else frozenset()
    infos = []
    for index, node in enumerate(graph.nodes):
        info = _slots(index, node, graph.opset, dtypes)
        if info is None:
            continue
        info.reason = _static_reason(node, blocked_ops, excluded, shape_nodes) or info.reason
        infos.append(info)
    return infos


def _dtype(tensor, dtypes: dict):
    if isinstance(tensor, gs.Constant):
        return np.dtype(tensor.dtype)
    if not tensor.name:
        return None
    found = dtypes.get(tensor.name)
    if found is not None:
        return np.dtype(found)
    return np.dtype(tensor.dtype) if tensor.dtype is not None else None


def _formal(params, index):
    if index < len(params):
        return params[index]
    if params and params[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
        return params[-1]
    return None


def _slots(index: int, node: gs.Node, opset: int, dtypes: dict) -> NodeInfo | None:
    """Convertible slots of ``node``, or None when it touches no float32 tensor."""
    ins = [i for i, t in enumerate(node.inputs) if t.name and _dtype(t, dtypes) == F32]
    outs = [i for i, t in enumerate(node.outputs) if t.name and _dtype(t, dtypes) == F32]
    if not ins and not outs:
        return None
    info = NodeInfo(index, node)
    schema, info.reason = _schema(node, opset)
    if schema is None:
        return info
    in_vars = {i: getattr(_formal(schema.inputs, i), "type_str", None) for i in range(len(node.inputs))}
    out_vars = {i: getattr(_formal(schema.outputs, i), "type_str", None) for i in range(len(node.outputs))}
    float_vars, info.reason = _float_vars(node, schema, (ins, in_vars), (outs, out_vars), dtypes)
    if info.reason is not None:
        return info
    info.ins = [i for i in ins if in_vars[i] in float_vars]
    info.outs = [i for i in outs if out_vars[i] in float_vars]
    if not info.ins and not info.outs:
        info.reason = "float32 only in fixed-type slots"
    return info


def _schema(node: gs.Node, opset: int) -> tuple:
    """``(the node's ONNX schema at ``opset``, None)`` or ``(None, why there is none)``."""
    if (node.domain or "") not in ONNX_DOMAINS:
        return None, "custom-domain op"
    try:
        return onnx.defs.get_schema(node.op, opset, ""), None
    except onnx.defs.SchemaError:
        return None, "no ONNX schema at this opset"


def _float_vars(node: gs.Node, schema, inputs: tuple, outputs: tuple, dtypes: dict) -> tuple:
    """``(type variables bound to float32, None)`` — conditions 1–3 of the module docstring —
    or ``(set(), reason)`` when one of them cannot be float16. ``inputs`` / ``outputs``:
    (float32 slot indices, {slot index: type variable})."""
    (ins, in_vars), (outs, out_vars) = inputs, outputs
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    float_vars = {in_vars[i] for i in ins if in_vars[i] in allowed}
    float_vars |= {out_vars[i] for i in outs if out_vars[i] in allowed and out_vars[i] in set(in_vars.values())}
    for var in float_vars:
        if F16_TYPE not in allowed[var]:
            return set(), "no float16 in the op schema"
        tied = [t for i, t in enumerate(node.inputs) if in_vars[i] == var and t.name]
        tied += [t for i, t in enumerate(node.outputs) if out_vars[i] == var and t.name]
        if any(_dtype(t, dtypes) is None for t in tied):
            return set(), "unknown tensor type"
    return float_vars, None


def _static_reason(node, blocked_ops, excluded: dict, shape_nodes) -> str | None:
    if any(isinstance(v, gs.Graph) for v in node.attrs.values()) or node.op in ("If", "Loop", "Scan"):
        return "If/Loop/Scan kept float32 (bodies not converted)"
    if node.op in blocked_ops:
        return f"block list: {node.op}"
    if node.name and node.name in excluded:
        return excluded[node.name]
    if id(node) in shape_nodes:
        return "shape computation"
    return None


def _shape_computation(graph: gs.Graph) -> set:
    """Nodes (not Shape/Size themselves) whose variable inputs all derive from Shape/Size."""
    derived, nodes = set(), set()
    for node in graph.nodes:
        variables = [t for t in node.inputs if isinstance(t, gs.Variable) and t.name]
        if node.op in SHAPE_SOURCES:  # reads any dtype: free to follow its producer
            derived.update(id(t) for t in node.outputs)
        elif variables and all(id(t) in derived for t in variables) and node.op != "ConstantOfShape":
            nodes.add(id(node))
            derived.update(id(t) for t in node.outputs)
    return nodes


# --- cast accounting --------------------------------------------------------------------

class CastModel:
    """Counts the Casts an assignment (set of float16 node indices) needs."""

    def __init__(self, graph: gs.Graph, infos: list, keep_io: bool):
        self.keep_io = keep_io
        self.slot_of = {}  # (id(node), input index) -> info index, for convertible input slots
        self.producer = {}  # id(tensor) -> info index of the node producing it on a convertible slot
        self.tensors = {}  # id(tensor) -> tensor, every float32 variable on a convertible slot
        self.infos = infos
        for k, info in enumerate(infos):
            for i in info.ins:
                self.slot_of[(id(info.node), i)] = k
                t = info.node.inputs[i]
                if isinstance(t, gs.Variable):
                    self.tensors[id(t)] = t
            for i in info.outs:
                t = info.node.outputs[i]
                self.producer[id(t)] = k
                self.tensors[id(t)] = t
        self.graph_inputs = {id(t) for t in graph.inputs}
        self.graph_outputs = {id(t) for t in graph.outputs}
        self.neighbours = {k: [id(t) for t in _touching(info)] for k, info in enumerate(infos)}

    def producer_half(self, tensor, half: set) -> bool:
        if id(tensor) in self.graph_inputs:
            return not self.keep_io
        k = self.producer.get(id(tensor))
        return k is not None and k in half

    def reader_precisions(self, tensor, half: set) -> set:
        out = set()
        for user in tensor.outputs:
            for i, t in enumerate(user.inputs):
                if t is tensor:
                    k = self.slot_of.get((id(user), i))
                    out.add(k is not None and k in half)
        if id(tensor) in self.graph_outputs:
            out.add(not self.keep_io)
        return out

    def casts_for(self, tensor, half: set) -> int:
        return int(any(p != self.producer_half(tensor, half) for p in self.reader_precisions(tensor, half)))

    def total(self, half: set) -> int:
        return sum(self.casts_for(t, half) for t in self.tensors.values())


def _touching(info: NodeInfo):
    for i in info.ins:
        if isinstance(info.node.inputs[i], gs.Variable):
            yield info.node.inputs[i]
    for i in info.outs:
        yield info.node.outputs[i]


def merge_islands(cast_model: CastModel, half: set, max_const_elements: int) -> set:
    """Move float16 nodes to float32 while that removes Casts (merges neighbouring float32 islands).

    Only nodes with at most ``max_const_elements`` float weights move (heavy layers stay half
    so the file still shrinks; a negative limit disables merging). Returns the new float16 set.
    """
    half = set(half)
    changed = True
    while changed:
        changed = False
        for k in sorted(half):
            if cast_model.infos[k].float_const_elements > max_const_elements:
                continue
            tensors = [cast_model.tensors[i] for i in cast_model.neighbours[k] if i in cast_model.tensors]
            before = sum(cast_model.casts_for(t, half) for t in tensors)
            half.discard(k)
            if sum(cast_model.casts_for(t, half) for t in tensors) < before:
                changed = True
            else:
                half.add(k)
    return half
