"""Student activations for the re-fit (:mod:`onnxslim_kit.passes.prune.refit`), with as few ONNX Runtime runs as possible.

Two savings over "run the whole model once per re-fitted layer":

* **truncation** — a run that only needs tensors ``T`` executes only their ancestors: the model is
  cut to the nodes reachable backwards from ``T`` (whole model when one of them carries a
  subgraph, which may read outer names implicitly);
* **waves** — consecutive consumers (in topological order) go into one run while none of them
  reads, directly or through other nodes, the output of an earlier one of the same wave: a
  re-fit changes only what lies downstream of the re-fitted node, so each of them still sees
  exactly the student it would have seen alone.
"""

from __future__ import annotations

import onnx


def _producers(proto) -> dict:
    return {out: i for i, node in enumerate(proto.graph.node) for out in node.output}


def truncate(proto: onnx.ModelProto, names: list) -> onnx.ModelProto:
    """A copy of ``proto`` with only the nodes needed to compute ``names`` and no graph outputs
    (:func:`onnxslim_kit.activations.with_outputs` adds ``names``)."""
    producer = _producers(proto)
    keep, stack = set(), list(names)
    while stack:
        i = producer.get(stack.pop())
        if i is None or i in keep:
            continue
        node = proto.graph.node[i]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return proto
        keep.add(i)
        stack.extend(node.input)
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    del out.graph.node[:]
    out.graph.node.extend(proto.graph.node[i] for i in sorted(keep))
    del out.graph.output[:]
    used = {name for node in out.graph.node for name in node.input}
    kept_inits = [t for t in proto.graph.initializer if t.name in used]
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept_inits)
    return out


def ancestors(proto: onnx.ModelProto, name: str, producer: dict | None = None) -> set:
    """Names of all tensors ``name`` is computed from (``name`` included)."""
    producer = producer if producer is not None else _producers(proto)
    seen, stack = set(), [name]
    while stack:
        tensor = stack.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        i = producer.get(tensor)
        if i is not None:
            stack.extend(proto.graph.node[i].input)
    return seen


def waves(proto: onnx.ModelProto, items: list, node_of) -> list:
    """Split ``items`` (in topological order) into runs of independent consumers; ``node_of(item)``
    gives the consumer's gs node."""
    producer = _producers(proto)
    out, current, outputs = [], [], set()
    for item in items:
        node = node_of(item)
        if current and ancestors(proto, node.inputs[0].name, producer) & outputs:
            out.append(current)
            current, outputs = [], set()
        current.append(item)
        outputs.add(node.outputs[0].name)
    if current:
        out.append(current)
    return out
