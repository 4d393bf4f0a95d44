"""What a set of removed channel units saves, counted node by node (the budget of ``alloc=sensitivity``).

A per-unit cost summed over the removed units (:func:`._prune_importance.unit_costs`) counts a
layer whose input *and* output channels are both cut twice: a Conv with ``C_in × C_out``
channel pairs that loses the fractions ``a`` of its inputs and ``b`` of its outputs saves
``1 − (1−a)(1−b) = a + b − ab`` of its work, not ``a + b``. Two selections with the same
per-unit sum can therefore remove very different compute (ppocr_cls_v2 at ``ratio=0.5``: the
sensitivity allocation removed 0.59 of the MACs where the ranked selection it was budgeted on
removed 0.46, and lost every decision). Here the cost of the pruned model is recomputed per
node instead::

    cost(n) = w_n · Π_{d ∈ dims(n)} ⌈k_d⌉_b / ⌈C_d⌉_b

with ``w_n`` the node's full cost, ``dims(n)`` its channel dimensions that carry a layout (a
source's output channels, a consumer's input channels, a depthwise conv's or a pass-through
node's one channel dimension), ``C_d`` their full count, ``k_d`` the count kept, and ``⌈k⌉_b``
``k`` rounded up to a multiple of ``block`` (ONNX Runtime's CPU kernels work on blocks of 8
(AVX2) or 16 (AVX-512) channels: a Conv with 24 output channels costs as much as one with 32,
so cutting it to 16 saves half of it, not a third; ``block=1`` gives exact MACs). ``w_n`` is the node's multiply-accumulates (weighted nodes only),
or its measured kernel time (``cost=latency``, :mod:`onnxslim_kit.passes.prune.latency`; there pass-through
nodes — activations, pooling, elementwise — count too).

:class:`CostModel` keeps the removed count of every tensor, so the change of one group's cut
is evaluated on the few nodes it touches (the greedy allocation tries every group at every
step).
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes._common.graph import const_value


def _ceil(k: float, block: int) -> float:
    return -(-k // block) * block if block > 1 else k


def node_macs(cg, node, kind: str) -> float:
    """Multiply-accumulates of a weighted node per sample, from the analysis run's shapes."""
    w = const_value(node.inputs[1])
    out = cg.shapes.get(node.outputs[0].name)
    if kind == "convT":
        x = cg.shapes.get(node.inputs[0].name)
        return float(np.prod(x[2:])) * w.size if x is not None else float(w.size)
    if out is None:
        return float(w.size)
    return float(np.prod(out[2:] if kind in ("conv", "depthwise") else out[:-1])) * w.size


def weighted_nodes(cg) -> dict:
    """id(node) → [node, kind, channel dims (tensor names)] of every Conv/Gemm/MatMul with a layout."""
    nodes: dict = {}
    for s in cg.sources:
        nodes.setdefault(id(s.node), [s.node, s.kind, []])[2].append(s.node.outputs[0].name)
    for c in cg.consumers:
        entry = nodes.setdefault(id(c.node), [c.node, c.kind, []])
        entry[2].insert(0, c.tensor.name)
    for node, tensor in cg.depthwise:
        nodes[id(node)] = [node, "depthwise", [tensor.name]]
    return nodes


class CostModel:
    """Cost of the pruned model as a function of the removed units (see the module docstring).

    ``weights``: id(node) → full cost; ``None`` → MACs of the weighted nodes."""

    def __init__(self, cg, weights: dict | None = None, block: int = 1):
        self.cg = cg
        self.block = max(int(block), 1)
        entries = weighted_nodes(cg)
        if weights is not None:
            depthwise = {id(n) for n, _ in cg.depthwise}
            for node in cg.passthrough:
                outs = [t.name for t in node.outputs if t.name in cg.layouts]
                if id(node) not in entries and id(node) not in depthwise and outs:
                    entries[id(node)] = [node, "other", outs[:1]]
        self.nodes = []  # (full cost, [tensor names])
        for key, (node, kind, dims) in entries.items():
            w = weights.get(key, 0.0) if weights is not None else node_macs(cg, node, kind)
            if w > 0 and dims:
                self.nodes.append((float(w), list(dict.fromkeys(dims))))
        self.size = {name: cg.layouts[name].size for _, dims in self.nodes for name in dims}
        self.by_tensor: dict = {}
        for i, (_, dims) in enumerate(self.nodes):
            for name in dims:
                self.by_tensor.setdefault(name, []).append(i)
        self.where: dict = {}  # unit → {tensor: channel positions}
        for name in self.size:
            for unit in cg.units_of(name).tolist():
                slot = self.where.setdefault(unit, {})
                slot[name] = slot.get(name, 0) + 1
        self.removed = dict.fromkeys(self.size, 0)

    def full(self) -> float:
        """Cost with nothing removed: Σ w_n."""
        return sum(w for w, _ in self.nodes)

    def _node(self, i: int, counts: dict) -> float:
        w, dims = self.nodes[i]
        for name in dims:
            size = self.size[name]
            w *= _ceil(size - counts.get(name, self.removed[name]), self.block) / _ceil(size, self.block)
        return w

    def counts(self, units) -> dict:
        """tensor → how many of its channel positions belong to ``units``."""
        out: dict = {}
        for unit in units:
            for name, n in self.where.get(unit, {}).items():
                out[name] = out.get(name, 0) + n
        return out

    def saved(self, units) -> float:
        """Cost removed by removing ``units`` (from the unpruned model)."""
        counts = self.counts(units)
        touched = {i for name in counts for i in self.by_tensor.get(name, [])}
        zero = dict.fromkeys(self.size, 0)
        return sum(self._node(i, zero) - self._node(i, {**zero, **counts}) for i in touched)

    def delta(self, change: dict) -> float:
        """Extra cost saved when the removed counts change by ``change`` (tensor → +count)."""
        new = {name: self.removed[name] + n for name, n in change.items()}
        touched = {i for name in change for i in self.by_tensor.get(name, [])}
        return sum(self._node(i, {}) - self._node(i, new) for i in touched)

    def commit(self, change: dict) -> None:
        for name, n in change.items():
            self.removed[name] += n

    def reset(self) -> None:
        """Nothing removed again (before another allocation on the same model)."""
        self.removed = dict.fromkeys(self.size, 0)
