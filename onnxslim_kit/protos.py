"""Walking a ModelProto's graphs (no onnx-graphsurgeon): shared by the model's load/export, the
non-tensor value types and the report."""

from __future__ import annotations

import onnx


def proto_graphs(graph: onnx.GraphProto):
    """``graph`` and every graph inside its nodes' attributes (If/Loop/Scan bodies), outermost first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            for sub in [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs:
                yield from proto_graphs(sub)
