"""Data of the channel analysis (:mod:`onnxslim_kit.passes.prune.groups`): layouts, roles, units, groups.

An *atom* is one output channel of a source; atoms coupled by an op are united into one
*unit* (union-find). A *layout* lists, for one tensor, the atom at each channel position.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs


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
    kind: str  # conv | convT | gemm | matmul
    out_axis: int  # axis of the weight that indexes output channels


@dataclass
class Consumer:
    node: gs.Node
    tensor: gs.Tensor
    kind: str  # conv | convT | gemm | matmul
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
        self.unions = 0  # merges made (part of the state :meth:`ChannelGraph.cached` keys on)

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
            self.unions += 1
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
    shapes: dict = field(default_factory=dict)  # tensor name -> concrete shape (one sample)
    memo: dict = field(default_factory=dict, repr=False)  # query -> (state, answer), see :meth:`cached`
    edits: int = 0  # layouts set and layouts blocked (part of that state)

    # --- building -------------------------------------------------------------
    def set_layout(self, tensor, layout: Layout) -> None:
        self.layouts[tensor.name] = layout
        self.tensors[tensor.name] = tensor
        self.edits += 1

    def block(self, layout: Layout, reason: str) -> None:
        for a in layout.atoms:
            self.block_atoms.setdefault(int(a), reason)
        self.edits += 1

    # --- queries ----------------------------------------------------------------
    def cached(self, key, make):
        """``make()``, computed once per state of the analysis (layouts set or blocked, atoms
        made, unions): the queries below walk every atom, and a search asks them hundreds of
        times of a finished analysis. Answers are shared: callers do not modify them."""
        state = (self.edits, len(self.uf.parent), self.uf.unions)
        hit = self.memo.get(key)
        if hit is None or hit[0] != state:
            hit = self.memo[key] = (state, make())
        return hit[1]

    def unit(self, atom: int) -> int:
        return self.uf.find(int(atom))

    def units_of(self, name: str) -> np.ndarray:
        return self.cached(("units_of", name), lambda: np.array(
            [self.unit(a) for a in self.layouts[name].atoms], dtype=np.int64))

    def blocked_units(self) -> dict:
        def make():
            out = {}
            for atom, reason in self.block_atoms.items():
                out.setdefault(self.unit(atom), reason)
            return out
        return self.cached("blocked_units", make)

    def all_units(self) -> set:
        return self.cached("all_units", lambda: {self.unit(a) for lay in self.layouts.values() for a in lay.atoms})

    def groups(self) -> list:
        """Connected sets of units: units that appear in the same tensor are in one group."""
        return self._components(list(self.layouts))

    def source_groups(self) -> list:
        """Units linked through a source's output (and the couplings behind it), not Concat.

        The unit of selection for ``ratio``: each group's kept count is one source's (or one
        residual chain's) channel count, so ``multiple`` applies to real layer widths.
        """
        return self.cached("source_groups", lambda: self._components([s.node.outputs[0].name for s in self.sources]))

    def _components(self, names: list) -> list:
        """Units linked when they appear in the same tensor of ``names``."""
        uf = UnionFind()
        index = {u: i for i, u in enumerate(sorted(self.all_units()))}
        uf.new(len(index))
        for name in names:
            units = self.units_of(name)
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
