"""Chains of constant Mul / Add become one Mul and one Add (``mul/add chain merged``).

Before / after (each ``kᵢ``, ``cᵢ`` a constant, each intermediate tensor read by the next node
only and not a graph output)::

    x ─ Mul(k₁) ─ Add(c₁) ─ Mul(k₂) ─ Add(c₂) ─ y        x ─ Mul(A) ─ Add(B) ─ y

Algebra (float64, cast back to the tensors' dtype once): starting from ``A = 1, B = 0``, a
``Mul(k)`` maps ``(A, B) → (A·k, B·k)`` and an ``Add(c)`` maps ``(A, B) → (A, B + c)``, so
``y = x·A + B``. Broadcasting is associative, so ``x·A + B`` has the shape the chain had
(the shapes of ``A`` and ``B`` are broadcasts of the chain's constants). Where a BN becomes
Mul + Add in front of a scale layer's Mul + Add (DenseNet, old Caffe2 exports), four nodes
become two.

Conditions:

1. every node is a standard-domain ``Mul`` or ``Add`` with exactly one constant input, all
   constants of one float dtype, the chain's data input float too;
2. each intermediate tensor is read by the next node of the chain alone, in the same graph;
3. the rewrite removes nodes: the chain has more nodes than ``[Mul] + [Add]`` it becomes (a lone
   ``Add → Mul`` is left as it is: swapping it removes nothing);
4. ``A`` and ``B`` take no more elements than the largest constant of the chain (no growth).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import const_value, is_graph_output, is_onnx_op, new_constant


def _step(node, ids):
    """(data input, constant) of a Mul/Add with exactly one constant input, else None."""
    if id(node) not in ids or not node.outputs or len(node.inputs) != 2 or not is_onnx_op(node, "Mul", "Add"):
        return None
    values = [const_value(t) for t in node.inputs]
    if (values[0] is None) == (values[1] is None):
        return None
    index = 0 if values[0] is not None else 1
    if values[index].dtype.kind != "f":
        return None
    return node.inputs[1 - index], values[index]


def _chain(last, graph, ids):
    """The chain ending at ``last``, first node first: [(node, constant)], data input."""
    found = _step(last, ids)
    if found is None:
        return [], None
    chain = [(last, found[1])]
    data = found[0]
    while len(data.inputs) == 1 and len(data.outputs) == 1 and not is_graph_output(data, graph):
        prev = data.inputs[0]
        step = _step(prev, ids)
        if step is None or step[1].dtype != chain[0][1].dtype:
            break
        chain.insert(0, (prev, step[1]))
        data = step[0]
    return chain, data


def _combined(chain):
    a, b = np.ones((), np.float64), np.zeros((), np.float64)
    for node, value in chain:
        if node.op == "Mul":
            a, b = a * value, b * value
        else:
            b = b + value
    return a, b


def _worth_it(chain, a, b) -> bool:
    ops = [n.op for n, _ in chain]
    kept = ("Mul" in ops) + ("Add" in ops)
    largest = max(v.size for _, v in chain)
    return len(chain) > kept and a.size <= largest and b.size <= largest


def merge_affine_chains(graph, run) -> int:
    count = 0
    ids = {id(n) for n in graph.nodes}
    for last in reversed(list(graph.nodes)):
        chain, data = _chain(last, graph, ids)
        if len(chain) < 2 or getattr(data, "dtype", None) not in (None, chain[0][1].dtype):
            continue
        a, b = _combined(chain)
        if not _worth_it(chain, a, b):
            continue
        dtype = chain[0][1].dtype
        ops = {n.op for n, _ in chain}
        out = last.outputs[0]
        base = f"fuse_{chain[0][0].name or 'affine'}"
        new_nodes, current = [], data
        if "Mul" in ops:
            mid = out if "Add" not in ops else gs.Variable(run.model.fresh_name(base + "_scaled"), dtype=out.dtype)
            new_nodes.append(gs.Node("Mul", name=run.model.fresh_name(base + "_mul"),
                                     inputs=[current, new_constant(run.model, base + "_scale", a.astype(dtype))],
                                     outputs=[mid]))
            current = mid
        if "Add" in ops:
            new_nodes.append(gs.Node("Add", name=run.model.fresh_name(base + "_add"),
                                     inputs=[current, new_constant(run.model, base + "_shift", b.astype(dtype))],
                                     outputs=[out]))
        index = next(i for i, n in enumerate(graph.nodes) if n is chain[0][0])
        for node, _ in chain:
            node.inputs.clear()
            node.outputs.clear()
            ids.discard(id(node))
        graph.nodes[index:index] = new_nodes
        count += 1
    return count


RULES = [("mul/add chain merged", merge_affine_chains)]
