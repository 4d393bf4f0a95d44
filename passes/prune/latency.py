"""Measured latency per channel unit, for ``prune(cost=latency)``.

MACs are a poor proxy for ONNX Runtime CPU time: a 1×1 conv runs near peak throughput, while
depthwise convs, BN/activation/elementwise ops and pooling are memory-bound and cost far more
per MAC. So we measure: one ORT session with profiling (1 intra-op thread, graph optimizations
``basic`` so node names survive — ``all`` would fuse Conv+activation under new names) runs the
model ``RUNS`` times on one calibration sample; ``t_n`` = mean kernel time of node ``n``
(the first run is a warm-up and not counted).

A node whose input or output carries channel layout ``L`` costs about ``t_n / |L|`` per channel,
and removing a unit removes that share at every node it touches::

    cost(u) = Σ_{n ∋ u}  t_n / C_n     over sources (C_n = output channels), consumers (input
                                       channels), depthwise convs and pass-through nodes

(a node touching the unit at several positions counts each). The ratio selection then ranks
``score(u) · mean(cost) / cost(u)``: the units with the least importance per saved millisecond
go first.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict

from onnxslim_kit.runtime import make_session, run

RUNS = 6


def node_times(proto, sample: dict, runs: int = RUNS) -> list:
    """Mean kernel seconds of each node of ``proto``'s main graph, by position."""
    names = [node.name for node in proto.graph.node]
    with tempfile.TemporaryDirectory(prefix="slim-prof-") as tmp:
        # nodes named by position while the session's skeleton copy is made, then restored (no
        # copy of the weights); make_session: weights left on disk and models over 2 GB load;
        # pre-packing on, as deployed
        try:
            for i, node in enumerate(proto.graph.node):
                node.name = f"n{i}"
            session = make_session(proto, "basic", 1, profile=os.path.join(tmp, "prof"))
        finally:
            for node, name in zip(proto.graph.node, names):
                node.name = name
        for _ in range(runs):
            run(session, sample)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    per_run: dict = defaultdict(list)
    for event in events:
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time"):
            per_run[name[: -len("_kernel_time")]].append(event["dur"] * 1e-6)
    times = []
    for i in range(len(proto.graph.node)):
        values = per_run.get(f"n{i}", [])
        values = values[1:] if len(values) > 1 else values
        times.append(sum(values) / len(values) if values else 0.0)
    return times


def unit_latency(cg, times: list) -> dict:
    """unit → seconds per inference that removing it saves (see the module docstring)."""
    index = {id(node): i for i, node in enumerate(cg.graph.nodes)}
    costs: dict = defaultdict(float)

    def add(node, name: str) -> None:
        units = cg.units_of(name)
        share = times[index[id(node)]] / max(len(units), 1)
        for unit in units.tolist():
            costs[unit] += share

    for s in cg.sources:
        add(s.node, s.node.outputs[0].name)
    for c in cg.consumers:
        add(c.node, c.tensor.name)
    for node, tensor in cg.depthwise:
        add(node, tensor.name)
    depthwise = {id(node) for node, _ in cg.depthwise}
    for node in cg.passthrough:
        if id(node) in depthwise or id(node) not in index:
            continue
        outs = [t.name for t in node.outputs if t.name in cg.layouts]
        if outs:
            add(node, outs[0])
    return dict(costs)
