"""``fuse`` constant rules: constant folding, shape folding, duplicate constants, CSE.

:func:`rules` returns ``(label, function(graph, run) -> rewrites)`` pairs (``run``: the pass run's
:class:`~onnxslim_kit.passes._common.match.RuleRun`), in order:

1. **Constant nodes → initializers** — a ``Constant`` node holding a dense tensor becomes a
   constant tensor (what loading does, for Constant nodes made after loading). At the start of
   each round after one that folded something, shape inference is refreshed here.
2. **Constant folding** — a node all of whose (non-empty) inputs are constants is evaluated
   once and its outputs become constants, when

   a. it is a standard ONNX op (domain ``""``/``ai.onnx``), not ``Constant``, ``Identity`` or
      ``Dropout`` (the cleanup rules remove those without copying data);
   b. it is deterministic (no ``Random*``, ``Multinomial``, ``Bernoulli``) and has no
      subgraph attribute (If/Loop/Scan), and produces tensors (no sequences/optionals);
   c. its outputs together take at most ``size_limit`` bytes (checked before evaluating
      where shapes are known, and after);
   d. its outputs take at most ``GROWTH_ALLOWANCE`` bytes more than its constant inputs — a
      slimming pass does not expand ``ConstantOfShape`` / ``Expand`` / ``Tile`` or fp16→fp32
      casts into big weights (ONNX Runtime folds those itself at load time) — and it is not a
      ``DequantizeLinear`` (folding would turn int8 weights back into float ones);
      d does not apply to a node whose results are read only as layer weights (Conv / Gemm
      weights, BN parameters …: :mod:`onnxslim_kit.passes.fuse.weight_slots`), which are
      materialized so the folds after it can use them — c does: a generated weight above
      ``fold_size_limit`` stays generated (onnx's light_vgg19 would grow from 9 KB to 548 MB);
   e. the results match the element type and static shape the graph declares for them.

   Evaluation: the node alone in a one-node model, run by ONNX Runtime (its kernels are the
   ones verification uses), falling back to ``onnx.reference.ReferenceEvaluator`` when ONNX
   Runtime cannot run it.
3. **Shape folding** (:mod:`onnxslim_kit.passes.fuse.shape_fold`) — ``Shape`` / ``Size`` of statically known
   shapes, ``Gather`` / ``Slice`` of known dims, and Reshape targets made of the reshaped
   tensor's own dims turned into constants with ``0`` ("copy").
4. **If with a constant condition** — the chosen branch's nodes move into the graph in the
   If's place and the If's outputs become the branch's outputs, when no tensor the branch
   makes is named like a tensor elsewhere in the model, and an If output that is a graph
   output can take its name from a tensor the branch makes (not a constant, an outer-scope
   tensor, or one serving two outputs). Both branches are emptied so no rule visits them.
5. **Duplicate constants** (``cse``) — constants read by nodes of the graph with the same
   element type, shape and bytes are merged into one.
6. **Common subexpressions** (``cse``) — nodes of one graph with the same op, domain,
   attributes and identical inputs are merged into the earliest one (the later one is kept
   instead when it feeds a graph output); not for non-deterministic ops, nodes with subgraphs
   or custom domains.

Scoping: every rule works inside one graph; folded values replace the folded node's own
output tensors (so readers in nested subgraphs see the constant), CSE only merges nodes of
the same graph, and outer-scope tensors are never rerouted into a scope that cannot see them.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.model import constant_node_to_tensor

from onnxslim_kit.passes._common.graph import as_array, is_graph_output, is_onnx_op, replace_uses
from onnxslim_kit.passes._common.match import MatchResult, RuleRun
from onnxslim_kit.passes._common.shapes import ShapeTable, elem_type
from onnxslim_kit.passes.fuse.merges import merge_duplicate_constants
from onnxslim_kit.passes.fuse.shape_fold import constant_reshape_targets, fold_shapes
from onnxslim_kit.passes.fuse.weight_slots import feeds_weights_only

NON_DETERMINISTIC = frozenset({
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
    "Dropout",
})
"""Ops whose result is not a function of their inputs (Dropout: in training mode)."""

NOT_TENSOR_RESULT = frozenset({
    "SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SplitToSequence",
    "Optional", "OptionalGetElement", "OptionalHasElement", "SequenceAt", "SequenceLength",
    "ConcatFromSequence",
})
LEFT_TO_CLEANUP = frozenset({"Constant", "Identity", "Dropout"})

TOO_LARGE = "constant folding: result larger than limit"
GROWS = "constant folding: result much larger than its inputs"
GROWTH_ALLOWANCE = 4096
"""Bytes a fold may add beyond what its constant inputs hold (shape tensors, small tables)."""


def rules(size_limit: int, cse: bool) -> list:
    """Rules 1–6 in order (5 and 6 only with ``cse``)."""
    return folding_rules(size_limit) + merging_rules(cse)


def folding_rules(size_limit: int) -> list:
    """Rules 1–4: what makes constants (run before the layer folds, which need them)."""
    return [
        ("Constant node → initializer", constant_nodes_to_tensors),
        ("constant folded", partial(fold_constants, size_limit=size_limit)),
        ("If with constant condition inlined", inline_constant_ifs),
        ("Shape/Size folded", fold_shapes),
        ("reshape target made constant", constant_reshape_targets),
    ]


def merging_rules(cse: bool) -> list:
    """Rules 5–6 (with ``cse``): ``fuse`` runs them after the layer folds of a round, so weights
    equal only by value (old exports fill every weight with one ConstantOfShape value) are not
    yet one shared tensor when BN or a Mul folds into each of their layers."""
    if not cse:
        return []
    return [
        ("duplicate constant merged", merge_duplicate_constants),
        ("common subexpression merged", merge_common_subexpressions),
    ]


# --- 1. Constant nodes ------------------------------------------------------------------------

def constant_nodes_to_tensors(graph, run: RuleRun) -> int:
    if graph is run.model.graph and run.dirty:
        run.dirty = False
        run.ensure_shapes(refresh=True)  # a new round after folding: shapes may be known now
    return sum(constant_node_to_tensor(node) for node in list(graph.nodes))


# --- 2. Constant folding -----------------------------------------------------------------------

def _why_not_foldable(node: gs.Node) -> str | None:
    """A skip reason, "" to pass over silently, or None when the node may be folded."""
    if not is_onnx_op(node, node.op):
        return "constant folding: not a standard ONNX op"
    if node.op in LEFT_TO_CLEANUP:
        return ""
    if node.op == "DequantizeLinear":
        return "constant folding: DequantizeLinear keeps quantized weights"
    if node.op in NON_DETERMINISTIC:
        return "constant folding: non-deterministic op"
    if node.op == "If":
        return ""  # inline_constant_ifs
    if any(_has_graph(v) for v in node.attrs.values()):
        return "constant folding: node has a subgraph"
    if node.op in NOT_TENSOR_RESULT:
        return "constant folding: sequence/optional values"
    if not onnx.defs.has(node.op):
        return "constant folding: not a standard ONNX op"
    return None


def _has_graph(value) -> bool:
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, gs.Graph) for v in value)
    return isinstance(value, gs.Graph)


def _itemsize(tensor, shapes: ShapeTable, default=4) -> int:
    t = shapes.elem_type(tensor)
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t)).itemsize if t else default
    except (KeyError, TypeError, ValueError):
        return default


def _estimate_bytes(node: gs.Node, inputs: list, shapes: ShapeTable) -> int | None:
    """Bytes the outputs will take, when it can be told before evaluating."""
    total = 0
    for out in node.outputs:
        if out.is_empty():
            continue
        shape = shapes.static(out)
        if shape is None:
            break
        total += int(np.prod(shape, dtype=np.int64)) * _itemsize(out, shapes)
    else:
        return total
    first = inputs[0] if inputs else None
    try:
        if node.op == "ConstantOfShape" and first is not None:
            value = node.attrs.get("value")
            size = value.values.dtype.itemsize if isinstance(value, gs.Constant) else 4
            return int(np.prod(first.astype(np.int64), dtype=np.int64)) * size
        if node.op == "Expand" and len(inputs) > 1 and inputs[1] is not None:
            shape = np.broadcast_shapes(first.shape, tuple(int(v) for v in inputs[1].reshape(-1)))
            return int(np.prod(shape, dtype=np.int64)) * first.dtype.itemsize
        if node.op == "Tile" and len(inputs) > 1 and inputs[1] is not None:
            return first.nbytes * int(np.prod(inputs[1].astype(np.int64), dtype=np.int64))
        if node.op == "Range" and len(inputs) == 3:
            start, limit, delta = (np.asarray(v).reshape(-1)[0] for v in inputs)
            count = max(int(np.ceil((limit - start) / delta)), 0) if delta != 0 else 0
            return count * np.asarray(start).dtype.itemsize
    except (ValueError, TypeError, OverflowError, ZeroDivisionError):
        return None
    return None


class FoldError(Exception):
    """The node could not be evaluated (the message says why, in one line)."""


_SESSION_OPTIONS = None


def _session_options():
    global _SESSION_OPTIONS  # built once: creating SessionOptions is not free
    if _SESSION_OPTIONS is None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.log_severity_level = 4
        _SESSION_OPTIONS = so
    return _SESSION_OPTIONS


def one_node_model(node: gs.Node, opset: int, inputs: list) -> tuple:
    """(ModelProto running ``node`` alone on graph inputs ``in<i>``, its output names)."""
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    proto = OnnxExporter.export_node(node)
    proto.name = "fold"
    graph_inputs, in_names = [], []
    for i, (tensor, value) in enumerate(zip(node.inputs, inputs)):
        if value is None:
            in_names.append("")
            continue
        name = f"in{i}"
        in_names.append(name)
        t = elem_type(tensor)
        if t is None:
            raise FoldError("input element type unknown")
        graph_inputs.append(onnx.helper.make_tensor_value_info(name, t, list(value.shape)))
    out_names = ["" if out.is_empty() else f"out{i}" for i, out in enumerate(node.outputs)]
    del proto.input[:]
    proto.input.extend(in_names)
    del proto.output[:]
    proto.output.extend(out_names)
    outputs = [onnx.helper.make_empty_tensor_value_info(n) for n in out_names if n]
    graph = onnx.helper.make_graph([proto], "fold", graph_inputs, outputs)
    opsets = [onnx.helper.make_opsetid("", opset)]
    try:
        ir = onnx.helper.find_min_ir_version_for(opsets, ignore_unknown=True)
    except Exception:  # noqa: BLE001 - older onnx
        ir = 7
    return onnx.helper.make_model(graph, opset_imports=opsets, ir_version=max(ir, 7)), [n for n in out_names if n]


def evaluate(node: gs.Node, opset: int, inputs: list, engines=("ort", "reference")) -> list:
    """Outputs of ``node`` (non-empty ones, in order) for constant ``inputs`` (None = absent)."""
    model, _ = one_node_model(node, opset, inputs)
    feeds = {f"in{i}": v for i, v in enumerate(inputs) if v is not None}
    errors = []
    for engine in engines:
        try:
            if engine == "ort":
                import onnxruntime as ort

                session = ort.InferenceSession(model.SerializeToString(), _session_options(),
                                               providers=["CPUExecutionProvider"])
                values = session.run(None, feeds)
            else:
                from onnx.reference import ReferenceEvaluator

                values = ReferenceEvaluator(model).run(None, feeds)
            return [np.asarray(v) for v in values]
        except Exception as exc:  # noqa: BLE001 - both engines raise many types
            text = str(exc).strip()
            errors.append(f"{engine}: {(text.splitlines()[0] if text else type(exc).__name__)[:160]}")
    raise FoldError("; ".join(errors))


def _input_values(node: gs.Node) -> list | None:
    """Input values (None for an omitted optional input), or None if one is not constant."""
    values = []
    for tensor in node.inputs:
        if tensor.is_empty():
            values.append(None)
        elif isinstance(tensor, gs.Constant):
            if getattr(tensor, "export_dtype", None) not in (None, tensor.dtype):
                return None
            values.append(np.asarray(tensor.values))
        else:
            return None
    return values


def _result_problem(node: gs.Node, values: list, shapes: ShapeTable) -> str | None:
    outs = [o for o in node.outputs if not o.is_empty()]
    if len(values) != len(outs):
        return "constant folding: unexpected number of results"
    for out, value in zip(outs, values):
        if value.dtype.kind in "OUS":
            return "constant folding: string result"
        declared = shapes.elem_type(out)
        try:
            got = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)
        except (KeyError, TypeError, ValueError):
            return "constant folding: unsupported result type"
        if declared is not None and declared != got:
            return "constant folding: result type differs from the declared one"
        shape = shapes.static(out)
        if shape is not None and list(value.shape) != shape:
            return "constant folding: result shape differs from the declared one"
    return None


def fold_constants(graph, run: RuleRun, size_limit: int) -> int:
    shapes = run.ensure_shapes()
    count = 0
    for node in list(graph.nodes):
        values = _constant_inputs(node, graph, run.unfoldable)
        if values is None:
            continue
        found = _fold(node, values, run, shapes, size_limit, feeds_weights_only(node, graph))
        if not found.ok:
            run.unfoldable.add(id(node))
            run.skip(node, found)
            continue
        outs = list(node.outputs)
        node.outputs.clear()
        node.inputs.clear()
        for out, value in zip([o for o in outs if not o.is_empty()], found.value):
            out.to_constant(as_array(value))
        count += 1
    if count:
        run.dirty = True
    return count


def _constant_inputs(node: gs.Node, graph, unfoldable: set) -> list | None:
    """Match: the input values of a live node all of whose inputs are constants, else None."""
    if not node.outputs or id(node) in unfoldable:
        return None
    if not any(not t.is_empty() for t in node.inputs):
        return None
    if not any(o.outputs or is_graph_output(o, graph) for o in node.outputs):
        return None  # dead: graph.cleanup removes it
    return _input_values(node)


def _size_problem(nbytes: int, input_bytes: int, size_limit: int, weight: bool) -> str | None:
    """``weight``: the result is only read as a layer's weight (weight_slots) — materialized
    however much larger than its inputs (ORT builds it at load anyway, and the folds after it
    need it constant), but never above ``fold_size_limit``: a generated 400 MB weight stays a
    ConstantOfShape rather than growing the file (onnx's light_vgg19: 9 KB → 548 MB)."""
    if nbytes > size_limit:
        return TOO_LARGE
    if not weight and nbytes > input_bytes + GROWTH_ALLOWANCE:
        return GROWS
    return None


def _fold(node: gs.Node, values: list, run: RuleRun, shapes: ShapeTable, size_limit: int,
          weight: bool = False) -> MatchResult:
    """Check + evaluate: payload the result arrays, or the reason (``""``: pass over silently)."""
    reason = _why_not_foldable(node)
    if reason is not None:
        return MatchResult.fail(reason)
    input_bytes = sum(int(v.nbytes) for v in values if v is not None)
    estimate = _estimate_bytes(node, values, shapes)
    reason = _size_problem(estimate, input_bytes, size_limit, weight) if estimate is not None else None
    if reason is not None:
        return MatchResult.fail(reason)
    try:
        results = evaluate(node, run.opset, values)
    except FoldError as exc:
        run.note_once(f"constant folding of {node.op} failed: {exc}")
        return MatchResult.fail("constant folding: evaluation failed")
    reason = _size_problem(sum(int(v.nbytes) for v in results), input_bytes, size_limit, weight)
    reason = reason or _result_problem(node, results, shapes)
    return MatchResult.fail(reason) if reason else MatchResult.of(results)


# --- 4. If with a constant condition ----------------------------------------------------------

def _graph_names(graph, skip_ids, names) -> None:
    if id(graph) in skip_ids:
        return
    for name, tensor in graph.tensors().items():
        names.setdefault(name, set()).add(id(tensor))
    for node in graph.nodes:
        for value in node.attrs.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(sub, gs.Graph):
                    _graph_names(sub, skip_ids, names)


def _inline_problem(node, graph, branch, model) -> str | None:
    if len(branch.outputs) != len(node.outputs) or branch.inputs:
        return "if inlining: branch inputs/outputs do not match"
    produced = {id(o) for n in branch.nodes for o in n.outputs if not o.is_empty()}
    others = {}
    _graph_names(model.graph, {id(branch)}, others)
    for n in branch.nodes:
        for o in n.outputs:
            if not o.is_empty() and others.get(o.name, set()) - {id(o)}:
                return "if inlining: name clash"
    used = [id(o) for o in branch.outputs]
    for if_out, br_out in zip(node.outputs, branch.outputs):
        if is_graph_output(if_out, graph) and (id(br_out) not in produced or used.count(id(br_out)) > 1):
            return "if inlining: graph output cannot take its name from the branch"
    return None


def inline_constant_ifs(graph, run: RuleRun) -> int:
    model = run.model
    count = 0
    for node in list(graph.nodes):
        if not node.outputs or not is_onnx_op(node, "If") or not isinstance(node.inputs[0], gs.Constant):
            continue
        cond = np.asarray(node.inputs[0].values)
        if cond.size != 1:
            continue
        taken = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        branch = node.attrs.get(taken)
        other = node.attrs.get("else_branch" if taken == "then_branch" else "then_branch")
        if not isinstance(branch, gs.Graph):
            continue
        problem = _inline_problem(node, graph, branch, model)
        if problem:
            run.skip_once(node, problem)
            continue
        index = next(i for i, n in enumerate(graph.nodes) if n is node)
        graph.nodes[index:index + 1] = list(branch.nodes)
        for if_out, br_out in zip(list(node.outputs), list(branch.outputs)):
            if is_graph_output(if_out, graph):
                for i, t in enumerate(graph.outputs):
                    if t is if_out:
                        graph.outputs[i] = br_out
                name = if_out.name
                if_out.name = model.fresh_name(name + "__inlined")
                br_out.name = name
                br_out.dtype = br_out.dtype or if_out.dtype
                br_out.shape = br_out.shape or if_out.shape
            replace_uses(if_out, br_out)
        node.inputs.clear()
        node.outputs.clear()
        for g in (branch, other):
            if isinstance(g, gs.Graph):
                g.nodes = []
                g.outputs = []
        count += 1
    if count:
        run.dirty = True
    return count


# --- 5. Duplicate constants -----------------------------------------------------------------------

# merge_duplicate_constants lives in merges.py: it hashes and compares in 1 MiB pieces read from
# the weight's file (streaming.value_chunks), never mapping or loading a whole weight


# --- 6. Common subexpressions ---------------------------------------------------------------------

class _Unhashable(Exception):
    pass


def _attr_key(value):
    if isinstance(value, gs.Graph):
        raise _Unhashable
    if isinstance(value, gs.Constant):
        array = np.asarray(value.values)
        if array.dtype.kind == "O":
            return ("T", elem_type(value), array.shape, tuple(array.reshape(-1).tolist()))
        return ("T", elem_type(value), array.shape, array.tobytes())
    if isinstance(value, np.ndarray):
        return ("A", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return ("L", tuple(_attr_key(v) for v in value))
    if isinstance(value, (bool, int, float, str, bytes, np.integer, np.floating)):
        return (type(value).__name__, value)
    raise _Unhashable


def _node_key(node: gs.Node):
    try:
        attrs = tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items()))
    except _Unhashable:
        return None
    inputs = tuple(None if t.is_empty() else id(t) for t in node.inputs)
    outputs = tuple(o.is_empty() for o in node.outputs)
    return (node.op, node.domain or "", inputs, attrs, outputs)


def _cse_problem(node: gs.Node) -> str | None:
    if not is_onnx_op(node, node.op):
        return "cse: custom-domain op (determinism unknown)"
    if node.op in NON_DETERMINISTIC:
        return "cse: non-deterministic op"
    return None


def _index(graph, node) -> int:
    return next(i for i, n in enumerate(graph.nodes) if n is node)


def merge_common_subexpressions(graph, run: RuleRun) -> int:
    seen = {}
    count = 0
    for node in list(graph.nodes):
        if not node.outputs:
            continue
        key = _node_key(node)
        if key is None:
            continue
        other = seen.get(key)
        if other is None:
            seen[key] = node
            continue
        problem = _cse_problem(node)
        if problem:
            run.skip_once(node, problem)
            continue
        keep, drop = other, node
        if any(is_graph_output(o, graph) for o in drop.outputs):
            if any(is_graph_output(o, graph) for o in keep.outputs):
                run.skip_once(node, "cse: both results are graph outputs")
                continue
            # keep the one feeding the graph output, at the earlier one's place
            keep, drop = node, other
            graph.nodes.pop(_index(graph, keep))
            graph.nodes.insert(_index(graph, drop), keep)
            seen[key] = keep
        for o_drop, o_keep in zip(drop.outputs, keep.outputs):
            if not o_drop.is_empty():
                replace_uses(o_drop, o_keep)
        drop.inputs.clear()
        drop.outputs.clear()
        count += 1
    return count
