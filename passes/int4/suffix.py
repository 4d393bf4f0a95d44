"""Suffix runs for ``int4``'s sensitivity: only the part of the graph a changed weight reaches.

A measured candidate changes one weight ``w``; every node not downstream of it computes what the
float model computes. With ``D(w)`` the nodes reachable from the readers of ``w`` (the readers
included, and the input-less ``Constant`` nodes they read; the proto's topological order kept) and

    cut(w) = { t : t read by a node of D(w), t made by a node outside D(w) }

the candidate's outputs are those of the *suffix* graph ``D(w)`` fed the float model's values
of ``cut(w)`` on the sample, the graph inputs and weights its nodes read, and ``w``'s changed
value; the outputs (and view tensors) ``D(w)`` does not make are the reference's.

Why bit-identical to a whole-model run: the cut values come from the reference session, in
which every cut tensor is an extra graph output, so ONNX Runtime fuses no node outside ``D(w)``
with one inside it there either; the nodes of ``D(w)`` meet the same kernels on the same
values in both sessions (same optimisation level, threads and flags) — provided the suffix
session knows the same shapes statically: ORT fuses ``MatMul`` + bias ``Add`` into
``Gemm`` only where the shapes are static, and for K > 1024 the two round differently
(all-MiniLM-L6-v2's FFN output layers, whose inputs the samples give as e.g. [1, 64, 1536] but the
model as [batch, sequence, 1536]). So each cut input is declared with the dims ONNX's shape
inference gives it in the whole model (:func:`static_types`), symbolic elsewhere
(:func:`input_types`) — one suffix session then runs every sample — and the ``Constant``
nodes ``D(w)`` reads are copied into it (constants stay constants). Checked exactly in
``tests/passes/int4/test_int4_suffix.py`` (suffix losses ``==`` whole-model losses, static
and symbolic lengths, a K = 1536 bias) and on the real models by
``benchmarks/check_int4_suffix.py``.

Cost: a suffix session per measured candidate (graph only: the weights are fed where they lie),
and the cut tensors of every sample held from the reference run — at most ``budget`` bytes
(:func:`admit`: the candidates with the smallest suffix first, a cut tensor shared by several
candidates counted once; the others run the whole model). A run reads the weights of ``D(w)``
only: on issue 16's decoder a candidate in layer ``i`` of 24 reads ``(24 − i) / 24`` of them.
Off in the pass by default (:data:`.mixed.SUFFIX_RUNS`: the peak RSS it cost on issue 16's decoder).
Not used (every candidate runs the whole model) when a node has a subgraph (If/Loop/Scan read
outer tensors implicitly, which ``D(w)`` and ``cut(w)`` would miss).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxslim_kit.streaming import copy_fields

SMALL_INITIALIZER = 1024  # elements: shape-like constants keep their values for the shape inference


def has_subgraphs(graph: onnx.GraphProto) -> bool:
    """Whether a node of ``graph`` carries a graph attribute (If/Loop/Scan bodies)."""
    kinds = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    return any(a.type in kinds for n in graph.node for a in n.attribute)


def downstream(graph: onnx.GraphProto, name: str) -> list:
    """Indices (in order) of the nodes reachable from the readers of tensor ``name``, readers
    included, and of the input-less nodes (``Constant``) whose outputs those read."""
    reached, live = [], {name}
    for i, node in enumerate(graph.node):
        if live.intersection(node.input):
            reached.append(i)
            live.update(o for o in node.output if o)
    read = {t for i in reached for t in graph.node[i].input}
    sources = [i for i, n in enumerate(graph.node) if not any(n.input) and read.intersection(n.output)]
    return sorted(set(reached) | set(sources))


def cut(graph: onnx.GraphProto, indices: list) -> list:
    """Tensors the nodes ``indices`` read that other nodes make (sorted)."""
    inside = set(indices)
    made_inside = {o for i in inside for o in graph.node[i].output}
    made_outside = {o for i, n in enumerate(graph.node) if i not in inside for o in n.output}
    return sorted({t for i in inside for t in graph.node[i].input if t and t not in made_inside and t in made_outside})


def admit(parts: dict, cuts: dict, sizes: dict, budget: int) -> list:
    """The candidates (names of ``cuts``) run as suffixes: fewest suffix nodes first (``parts``:
    {name: node indices}; ties by name), each taken while the union of the admitted cut tensors'
    ``sizes`` (bytes over all samples) stays ≤ ``budget``."""
    held, used, out = set(), 0, []
    for name in sorted(cuts, key=lambda n: (len(parts[n]), n)):
        new = set(cuts[name]) - held
        extra = sum(sizes[t] for t in new)
        if used + extra <= budget:
            held |= new
            used += extra
            out.append(name)
    return out


def static_types(proto: onnx.ModelProto, names: list) -> dict:
    """{name: ValueInfoProto} for the tensors ``names`` as ONNX's shape inference (with data
    propagation) types them in ``proto``'s graph — what a session of the whole model knows
    statically; the weights (initializers over :data:`SMALL_INITIALIZER` elements or on disk)
    as typed inputs, so nothing large is copied. {} when the inference fails."""
    skeleton = onnx.ModelProto()
    copy_fields(proto, skeleton, skip=("graph",))
    copy_fields(proto.graph, skeleton.graph, skip=("initializer",))
    for t in proto.graph.initializer:
        if int(np.prod(t.dims)) <= SMALL_INITIALIZER and t.data_location != onnx.TensorProto.EXTERNAL:
            skeleton.graph.initializer.append(t)
        elif t.name not in {i.name for i in skeleton.graph.input}:
            skeleton.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, data_prop=True)
    except Exception:  # noqa: BLE001 — an inference failure only costs the static dims
        return {}
    wanted = set(names)
    return {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output] if v.name in wanted}


def input_types(values: dict, static: dict) -> dict:
    """{tensor name: ValueInfoProto} for ``values`` = {name: [its value on each sample]}: the
    samples' dtype; each dim as ``static`` (:func:`static_types`) has it — its value where the
    whole model's session knows it (and the samples agree), else symbolic (the same name)."""
    out = {}
    for name, arrays in values.items():
        first = np.asarray(arrays[0])
        known = static.get(name)
        shape = known.type.tensor_type.shape.dim if known is not None and known.type.tensor_type.HasField("shape") else []
        dims = []
        for i, d in enumerate(first.shape):
            agreed = all(np.shape(a)[i] == d for a in arrays)
            given = shape[i] if len(shape) == first.ndim else None
            if given is not None and given.HasField("dim_value") and given.dim_value == d and agreed:
                dims.append(d)
            else:
                dims.append(given.dim_param if given is not None and given.dim_param else f"{name}__d{i}")
        out[name] = onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(first.dtype), dims)
    return out


def suffix_proto(proto: onnx.ModelProto, indices: list, types: dict, wanted: list) -> tuple:
    """``(the model of the nodes indices, [its outputs among wanted])``: the graph inputs and
    initializers those nodes read, the tensors of ``types`` ({cut tensor: ValueInfoProto}) as
    inputs; outputs: the tensors of ``wanted`` the nodes make."""
    graph = proto.graph
    nodes = [graph.node[i] for i in indices]
    read = {t for n in nodes for t in n.input if t}
    made = {o for n in nodes for o in n.output if o}
    out = onnx.ModelProto()
    copy_fields(proto, out, skip=("graph",))
    copy_fields(graph, out.graph, skip=("node", "input", "output", "initializer", "value_info"))
    out.graph.node.extend(nodes)
    out.graph.input.extend(i for i in graph.input if i.name in read)
    out.graph.initializer.extend(t for t in graph.initializer if t.name in read)
    out.graph.input.extend(types.values())
    out.graph.value_info.extend(v for v in graph.value_info if v.name in made)
    known = {v.name: v for v in graph.value_info}
    known.update((o.name, o) for o in graph.output)
    outputs = [n for n in wanted if n in made]
    out.graph.output.extend(known.get(n, onnx.ValueInfoProto(name=n)) for n in outputs)
    return out, outputs
