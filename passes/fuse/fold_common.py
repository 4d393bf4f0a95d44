"""What the BN and affine folds share: finding the layer an affine map folds into, and
rewriting that layer's weight and bias.

A *target* is a node whose output channel ``c`` is a linear function of its input with its
own weight slice and bias entry, so that ``y[:, c, ...] · s[c] + t[c]`` is the same node with
scaled weights and bias ``b·s + t``:

=============  ===============================  ===============  ==========================
op             weight layout                    output channels  channel axis of the output
=============  ===============================  ===============  ==========================
Conv           W [C_out, C_in/g, k…]            W.shape[0]       1 (output rank = W.ndim)
ConvTranspose  W [C_in, C_out/g, k…]            W.shape[1]·g     1 (output rank = W.ndim)
Gemm           B [K, N], or [N, K] with transB  N                1 (output is 2-D)
MatMul         W [K, N] (second input)          N                last; = 1 only for 2-D
=============  ===============================  ===============  ==========================

ConvTranspose with groups: output channel ``o = gi·(C_out/g) + j`` reads
``W[gi·C_in/g : (gi+1)·C_in/g, j, …]``, so the scale is applied to the view
``W.reshape(g, C_in/g, C_out/g, k…)`` along its third axis.

Gemm: ``Y = α·A'·B' + β·C``. Scaling column ``n`` by ``s[n]`` and adding ``t[n]`` gives
``B' ← B'·s`` (columns of B, rows of Bᵀ) and ``C ← β·C·s + t`` with ``β ← 1``; α is unchanged.
A MatMul target is rewritten into such a Gemm (input known to be 2-D).

All arithmetic is done in float64 and cast back to the dtype of the tensor it replaces, one
rounding per value (:func:`folded_bias`, :func:`_scaled_weight`); in float16 that one rounding
can still be too much for the lossless bound, which :func:`guarded` checks
(:func:`half_rounding`, the model in :mod:`onnxslim_kit.passes.fuse.fp16_guard`). Arrays
held by constants are never modified in place: a constant read only by the target gets a new
array; a bias read by other nodes too is copied into a new constant; a weight read by other
nodes is *not* copied (that would double the weight): the caller skips with "shared weight".
A tensor that is both weight and bias of a Gemm (``Gemm(x, W, W)``, also what the duplicate
merge makes of two equal constants) is read before anything is written, and the new weight
goes to a new constant, so the bias is ``W·s + t`` and not ``W·s²`` (issue 15, item 1).

Quantized models (issue 15, item 13): a quantizer rounds — QuantizeLinear ``q = round(x/s) + z``,
DynamicQuantizeLinear the same with ``s = (max x − min x)/255`` from ``x`` itself — so a fold,
exact in real numbers but not bit for bit, that moves ``x`` by an ulp can move an integer by a
step and the output by ``s``. :func:`apply_each` therefore leaves a node whose output reaches a
quantizer's float input as it is (:func:`feeds_quantizer`, counted reason :data:`FEEDS_QUANTIZER`).

Helpers here never raise for "does not apply": they return a failed
:class:`~onnxslim_kit.passes._common.match.MatchResult` with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import as_array, attr, const_value, is_onnx_op, new_constant, only_consumer, producer
from onnxslim_kit.passes._common.match import MatchResult, RuleRun
import onnxslim_kit.passes.fuse.fp16_guard as fp16_guard

TARGET_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
FLOAT_KINDS = "f"


def is_op(node, *ops: str) -> bool:
    """``node`` exists and is an ai.onnx op among ``ops``."""
    return node is not None and is_onnx_op(node, *ops)


def read_only_by(tensor, node) -> bool:
    return all(user is node for user in tensor.outputs)


def local_producer(tensor, node_ids: set):
    """The node of this graph that produces ``tensor`` (None for inputs, constants, outer scope)."""
    node = producer(tensor)
    return node if node is not None and id(node) in node_ids else None


def sole_reader(tensor, graph: gs.Graph, node) -> bool:
    """``node`` is the only reader of ``tensor``, which is not a graph output."""
    return only_consumer(tensor, graph) is node


def split_constant(node) -> tuple:
    """For a binary node: (constant value, its input index, the other input) or (None, None, None)."""
    if len(node.inputs) != 2:
        return None, None, None
    for index in (1, 0):
        value = const_value(node.inputs[index])
        if value is not None and const_value(node.inputs[1 - index]) is None:
            return value, index, node.inputs[1 - index]
    return None, None, None


def per_channel(values: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``values`` as a float64 vector of length ``channels`` if, broadcast against an output of
    ``rank`` with channels on axis 1, it varies only along that axis and keeps the output's
    shape (a scalar, [C], [C,1,1], [1,C,1,1], …); None otherwise."""
    values = np.asarray(values)
    if values.ndim > rank or rank < 2:
        return None
    shape = (1,) * (rank - values.ndim) + values.shape
    if any(d != 1 for i, d in enumerate(shape) if i != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(values.reshape(-1).astype(np.float64), (channels,)).copy()


# --- rank of a tensor without shape inference ----------------------------------------------

_SAME_RANK = {
    "Abs", "AveragePool", "BatchNormalization", "Cast", "Ceil", "Celu", "Clip", "Dropout", "Elu",
    "Erf", "Exp", "Floor", "Gelu", "GlobalAveragePool", "GlobalMaxPool", "HardSigmoid",
    "HardSwish", "Identity", "InstanceNormalization", "LayerNormalization", "LeakyRelu", "Log",
    "LogSoftmax", "LpNormalization", "LRN", "MaxPool", "Mish", "Neg", "PRelu", "Reciprocal",
    "Relu", "Round", "Selu", "Sigmoid", "Sign", "Softmax", "Softplus", "Softsign", "Sqrt", "Tanh",
    "ThresholdedRelu", "Transpose",
}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where"}


def rank_of(tensor, depth: int = 32) -> int | None:
    """The rank of ``tensor``: from its recorded shape, else worked out from its producers
    (exporters such as paddle2onnx record no intermediate shapes). None when unknown."""
    if tensor.shape is not None:
        return len(tensor.shape)
    value = const_value(tensor)
    if value is not None:
        return value.ndim
    node = producer(tensor)
    if node is None or depth <= 0 or not is_onnx_op(node, node.op):
        return None
    rule = _RANK_RULES.get(node.op)
    if rule is None and node.op in _SAME_RANK:
        rule = _same_rank
    elif rule is None and node.op in _BROADCAST:
        rule = _broadcast_rank
    return rule(node, tensor, depth - 1) if rule is not None else None


def _conv_rank(node, tensor, depth):
    if len(node.inputs) < 2:
        return None
    weight = const_value(node.inputs[1])
    return weight.ndim if weight is not None else rank_of(node.inputs[0], depth)


def _reshape_rank(node, tensor, depth):
    shape = const_value(node.inputs[1]) if len(node.inputs) > 1 else None
    return int(shape.size) if shape is not None else None


def _same_rank(node, tensor, depth):
    if node.inputs and node.outputs and node.outputs[0] is tensor:
        return rank_of(node.inputs[0], depth)
    return None


def _broadcast_rank(node, tensor, depth):
    ranks = [rank_of(t, depth) for t in node.inputs]
    return max(ranks) if ranks and None not in ranks else None


def _matmul_rank(node, tensor, depth):
    if len(node.inputs) != 2:
        return None
    a, b = (rank_of(t, depth) for t in node.inputs)
    if a is None or b is None:
        return None
    if a == 1 or b == 1:
        return max(a, b) - 1
    return max(a, b)


def _concat_rank(node, tensor, depth):
    """Every input of a Concat has the output's rank: the first one known. Inputs that are not
    Concat outputs are tried first, so a chain of Concats (DenseNet) is walked once."""
    ordered = sorted(node.inputs, key=lambda t: is_onnx_op(producer(t), "Concat") if producer(t) else False)
    for inp in ordered:
        rank = rank_of(inp, depth)
        if rank is not None:
            return rank
    return None


_RANK_RULES = {
    "Concat": _concat_rank,
    "Flatten": lambda node, tensor, depth: 2,
    "Gemm": lambda node, tensor, depth: 2,
    "Conv": _conv_rank,
    "ConvTranspose": _conv_rank,
    "Reshape": _reshape_rank,
    "MatMul": _matmul_rank,
}
"""op → rank rule ``(node, tensor, depth) -> rank | None``; then :data:`_SAME_RANK`, :data:`_BROADCAST`."""


# --- targets -------------------------------------------------------------------------------

@dataclass
class Target:
    """A layer an affine map on its output channels folds into."""

    node: gs.Node
    weight: np.ndarray
    channels: int
    rank: int  # rank of the output

    @property
    def op(self) -> str:
        return self.node.op

    @property
    def weight_tensor(self):
        return self.node.inputs[1]

    @property
    def bias_tensor(self):
        inputs = self.node.inputs
        return inputs[2] if len(inputs) > 2 and inputs[2].name != "" else None

    def weight_shared(self) -> bool:
        return not read_only_by(self.weight_tensor, self.node)


def match_target(node) -> MatchResult:
    """``node`` as a fold target (payload :class:`Target`), or the reason it is not one."""
    if len(node.inputs) < 2:
        return MatchResult.fail("no weight")
    weight = const_value(node.inputs[1])
    if weight is None or const_value(node.inputs[0]) is not None:
        return MatchResult.fail("weight not constant")
    if weight.dtype.kind not in FLOAT_KINDS:
        return MatchResult.fail("weight not float")
    bias_tensor = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name != "" else None
    if bias_tensor is not None and const_value(bias_tensor) is None:
        return MatchResult.fail("bias not constant")
    shaped = _TARGET_SHAPES.get(node.op)
    if shaped is None:
        return MatchResult.fail("not a conv/gemm")
    found = shaped(node, weight)
    return MatchResult.fail(found) if isinstance(found, str) else MatchResult.of(found)


def _conv_target(node, weight):
    return "bad weight shape" if weight.ndim < 3 else Target(node, weight, weight.shape[0], weight.ndim)


def _conv_transpose_target(node, weight):
    group = int(attr(node, "group", 1))
    if weight.ndim < 3 or weight.shape[0] % group:
        return "bad weight shape"
    return Target(node, weight, weight.shape[1] * group, weight.ndim)


def _gemm_target(node, weight):
    if weight.ndim != 2:
        return "bad weight shape"
    return Target(node, weight, weight.shape[0 if attr(node, "transB", 0) else 1], 2)


def _matmul_target(node, weight):
    if weight.ndim != 2:
        return "matmul weight not 2-D"
    rank = rank_of(node.inputs[0])
    if rank is None:
        return "matmul input rank unknown"
    if rank != 2:
        return "matmul input not 2-D"
    return Target(node, weight, weight.shape[1], 2)


_TARGET_SHAPES = {"Conv": _conv_target, "ConvTranspose": _conv_transpose_target, "Gemm": _gemm_target,
                  "MatMul": _matmul_target}
"""op → ``(node, weight) -> Target | reason`` (the per-op layout of the table above)."""


@dataclass(frozen=True)
class FoldPlan:
    """What :func:`fold_into` does: ``target`` computes ``y·scale + shift`` and the ``consumed`` nodes go."""

    target: Target
    scale: np.ndarray | None
    shift: np.ndarray | None
    consumed: tuple = ()


def _store(model, node, index: int, tensor, values: np.ndarray, base: str) -> None:
    """Give input ``index`` of ``node`` the value ``values``: a new array for a constant only
    input ``index`` of ``node`` reads, else a new constant (the old one stays for its other
    readers — other nodes, or another input of ``node``: ``Gemm(x, W, W)`` reads W as both
    weight and bias, which get different values)."""
    once = sum(t is tensor for t in node.inputs) == 1
    if isinstance(tensor, gs.Constant) and once and read_only_by(tensor, node):
        tensor.values = as_array(values)
    else:
        node.inputs[index] = new_constant(model, base, values)


def _scaled_weight(target: Target, scale: np.ndarray) -> np.ndarray:
    w = target.weight.astype(np.float64)
    op = target.op
    if op == "Conv":
        w = w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    elif op == "ConvTranspose":
        group = int(attr(target.node, "group", 1))
        view = w.reshape((group, w.shape[0] // group) + w.shape[1:])
        w = (view * scale.reshape((group, 1, -1) + (1,) * (w.ndim - 2))).reshape(w.shape)
    elif op == "Gemm" and attr(target.node, "transB", 0):
        w = w * scale[:, None]
    else:  # Gemm, MatMul: B is [K, N]
        w = w * scale[None, :]
    return w.astype(target.weight.dtype)


def folded_bias(target: Target, scale, shift) -> np.ndarray | None:
    """The folded bias ``b' = β·C·s + t`` (Gemm; ``b·s + t`` otherwise) in float64, before the
    cast back; None when there is neither bias nor shift."""
    bias_tensor = target.bias_tensor
    bias = const_value(bias_tensor) if bias_tensor is not None else None
    new = None if bias is None else bias.astype(np.float64)
    if new is not None and target.op == "Gemm":
        new = new * float(attr(target.node, "beta", 1.0))  # β·C, then β ← 1 in fold_into
    if new is not None and scale is not None:
        new = new * scale
    if shift is not None:
        new = shift if new is None else new + shift
    return new


def fold_into(target: Target, model, graph, scale, shift, out, consumed: list) -> None:
    """Make ``target`` compute ``y·scale + shift`` (per output channel; either may be None)
    and write it to ``out``, the output of the last of the ``consumed`` nodes, which go.

    The caller has checked that the weight is not shared when ``scale`` is given.
    """
    node = target.node
    base = f"fuse_{node.name or node.op.lower()}"
    for dead in consumed:
        dead.inputs.clear()
        dead.outputs.clear()
    if node.op == "MatMul":
        node = _matmul_to_gemm(node, graph, model)
        target = Target(node, target.weight, target.channels, 2)
    bias_tensor = target.bias_tensor
    bias = const_value(bias_tensor) if bias_tensor is not None else None  # read before any store
    new = folded_bias(target, scale, shift)
    if scale is not None:
        _store(model, node, 1, target.weight_tensor, _scaled_weight(target, scale), base + "_weight")
    dtype = bias.dtype if bias is not None else target.weight.dtype
    if new is not None and (scale is not None or shift is not None):
        new = new.astype(dtype)
        if node.op == "Gemm":
            node.attrs["beta"] = 1.0
        if bias_tensor is None and len(node.inputs) > 2:  # empty optional input
            node.inputs[2] = new_constant(model, base + "_bias", new)
        elif bias_tensor is None:
            node.inputs.append(new_constant(model, base + "_bias", new))
        else:
            _store(model, node, 2, bias_tensor, new, base + "_bias")
    if node.outputs:
        node.outputs[0] = out
    else:
        node.outputs.append(out)


def _channel_rows(target: Target, w: np.ndarray) -> np.ndarray:
    """``w`` as ``[output channel, the weights of that channel]`` (the layouts of the table above)."""
    if target.op == "Conv":
        return w.reshape(w.shape[0], -1)
    if target.op == "ConvTranspose":
        group = int(attr(target.node, "group", 1))
        view = w.reshape((group, w.shape[0] // group) + w.shape[1:])
        return np.swapaxes(view, 1, 2).reshape(target.channels, -1)
    if target.op == "Gemm" and attr(target.node, "transB", 0):
        return w
    return w.T  # Gemm, MatMul: B is [K, N]


def _per_channel_rows(values, channels: int) -> np.ndarray:
    """A bias (scalar, [C], [1, C], [M, C]) as ``[rows, C]`` in float64."""
    v = np.asarray(values, np.float64)
    return np.broadcast_to(v, np.broadcast_shapes(v.shape, (channels,))).reshape(-1, channels)


def half_rounding(target: Target, scale, shift, out_shape, reach=None) -> MatchResult | None:
    """The float16 check of a fold into ``target`` (:mod:`.fp16_guard`: the model, the error
    ``ε_c`` and the spread ``σ_c`` per output channel): None when it may go ahead (or the layer
    is not float16), else the failure with the reason."""
    if not fp16_guard.is_half(target.weight.dtype):
        return None
    alpha = float(attr(target.node, "alpha", 1.0)) if target.op == "Gemm" else 1.0
    rows = _channel_rows(target, target.weight.astype(np.float64))
    s = np.ones(target.channels) if scale is None else np.asarray(scale, np.float64)
    exact = rows * s[:, None]
    delta2 = (fp16_guard.rounding_error(exact) ** 2).sum(axis=1) if scale is not None else 0.0
    bias_tensor = target.bias_tensor
    old = np.zeros(target.channels) if bias_tensor is None else _per_channel_rows(
        const_value(bias_tensor) * (float(attr(target.node, "beta", 1.0)) if target.op == "Gemm" else 1.0),
        target.channels)
    new = folded_bias(target, scale, shift)
    new = np.zeros((1, target.channels)) if new is None else _per_channel_rows(new, target.channels)
    bias_error2 = (fp16_guard.rounding_error(new) ** 2).mean(axis=0)
    norm2 = (rows ** 2).sum(axis=1)
    error = np.sqrt(alpha ** 2 * delta2 + bias_error2
                    + fp16_guard.UNIT ** 2 / 3 * s ** 2 * (alpha ** 2 * norm2 + (old ** 2).mean(axis=0)))
    spread = abs(alpha) * np.sqrt((exact ** 2).sum(axis=1))
    per_channel = fp16_guard.elements_per_channel(out_shape, target.channels)
    return fp16_guard.check(new.mean(axis=0), spread, error, per_channel, reach)


def smallest_output(graph: gs.Graph, tensor, shapes) -> int | None:
    """The fewest elements of a graph output that ``tensor`` reaches (one sample; outputs with an
    unknown dimension past the batch are left out; None when none is left): a later reduction
    may mix the fold's channels into it. The walk stops at a :data:`BOUNDED` op: its output's
    scale does not fall with its input's (a Softmax's largest value is at least 1/n, a
    Sigmoid's is about 1/2 where its input is 0)."""
    outputs = {id(t) for t in graph.outputs}
    seen, todo, sizes = set(), [tensor], []
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        size = fp16_guard.known_elements(shapes.shape(t), strict=True) if id(t) in outputs else None
        if size:  # 0: an empty output, nothing to judge
            sizes.append(size)
        todo.extend(out for node in t.outputs if not is_onnx_op(node, *BOUNDED) for out in node.outputs)
    return min(sizes) if sizes else None


BOUNDED = ("Softmax", "LogSoftmax", "Sigmoid", "HardSigmoid")


def half_check(run: RuleRun, graph: gs.Graph, out, found: MatchResult, estimate, prefix: str) -> MatchResult:
    """``found`` unless the float16 check ``estimate(out_shape, reach)`` (None or a failure)
    fails; ``out``: the tensor the rewrite writes."""
    shapes = run.ensure_shapes()
    problem = estimate(shapes.shape(out), smallest_output(graph, out, shapes))
    return found if problem is None else problem.prefixed(prefix)


def guarded(plan, run: RuleRun, prefix: str):
    """``plan`` (a :func:`apply_each` plan returning a :class:`FoldPlan`) followed by the
    float16 check of :func:`half_rounding`, judged on the shape of the tensor the fold writes
    (the node's output) and the smallest graph output it reaches; its failure is prefixed with
    ``prefix``."""
    def checked(node, graph, node_ids) -> MatchResult:
        found = plan(node, graph, node_ids)
        if not found.ok or not fp16_guard.is_half(found.value.target.weight.dtype):
            return found
        fold = found.value
        return half_check(run, graph, node.outputs[0], found, partial(
            half_rounding, fold.target, fold.scale, fold.shift), prefix)
    return checked


def _matmul_to_gemm(matmul, graph, model) -> gs.Node:
    """Replace ``MatMul(x, W)`` (x 2-D) by ``Gemm(x, W)`` in the same place; returns the Gemm."""
    x, w = matmul.inputs[0], matmul.inputs[1]
    gemm = gs.Node(
        "Gemm", name=model.fresh_name(f"fuse_gemm_{matmul.name or 'matmul'}"),
        attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0}, inputs=[x, w], outputs=[],
    )
    index = next(i for i, n in enumerate(graph.nodes) if n is matmul)
    graph.nodes[index] = gemm
    matmul.inputs.clear()
    matmul.outputs.clear()
    return gemm


QUANTIZERS = ("QuantizeLinear", "DynamicQuantizeLinear")
FEEDS_QUANTIZER = "feeds a quantizer: rewrite not bit-exact (an integer could move a step)"


def feeds_quantizer(graph: gs.Graph) -> set:
    """``id(node)`` of every node of ``graph`` from whose outputs the float input of a
    QuantizeLinear / DynamicQuantizeLinear is reachable (empty for a float model)."""
    seen: set = set()
    todo = [n.inputs[0] for n in graph.nodes if is_onnx_op(n, *QUANTIZERS) and n.inputs]
    while todo:
        for node in todo.pop().inputs:  # a gs tensor's inputs: its producer
            if id(node) not in seen:
                seen.add(id(node))
                todo.extend(node.inputs)
    return seen


def apply_each(graph: gs.Graph, run: RuleRun, op_types: tuple, plan, rewrite) -> int:
    """Match/check, then rewrite, for every node of ``op_types`` in ``graph``.

    ``plan(node, graph, node_ids)`` returns a :class:`MatchResult`: not ``ok`` with an empty
    reason (the rule does not concern this node), not ``ok`` with a reason (counted once per
    node in ``result.skipped``), or ``ok`` with a payload, which ``rewrite(node, payload)``
    carries out. Returns the number of rewrites.
    """
    node_ids = {id(n) for n in graph.nodes}
    guarded = feeds_quantizer(graph)
    count = 0
    for node in [n for n in graph.nodes if is_op(n, *op_types)]:
        if not node.outputs:  # removed by an earlier rewrite of this sweep
            continue
        found = plan(node, graph, node_ids)
        if found.ok and id(node) in guarded:
            found = MatchResult(reason=FEEDS_QUANTIZER)
        if not found.ok:
            run.skip(node, found)
            continue
        rewrite(node, found.value)
        node_ids = {id(n) for n in graph.nodes}
        count += 1
    return count
