"""One copy of each constant in models with subgraphs (If / Loop / Scan bodies).

onnx-graphsurgeon exports every outer-scope constant a subgraph reads as an initializer of
*that subgraph*: a weight read by two Loop bodies is written twice, and a weight of the main
graph read inside a branch is written again in the branch. :func:`share_subgraph_constants`
undoes that on the exported proto:

1. bottom-up, an initializer that two or more direct child subgraphs of a graph G hold under
   the same name with the same bytes moves to G (visible to both from there), provided no
   node output or input of G's whole subtree uses that name;
2. top-down, a subgraph initializer whose name an enclosing graph already defines as an
   initializer is dropped (the outer one is in scope and is the same tensor).
"""

from __future__ import annotations

from collections import defaultdict

import onnx


def share_subgraph_constants(graph: onnx.GraphProto) -> None:
    _hoist_shared(graph)
    _drop_outer_copies(graph, set())


def _children(graph: onnx.GraphProto):
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield attribute.g
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                yield from attribute.graphs


def _defined_names(graph: onnx.GraphProto, names: set) -> set:
    """Names produced by nodes or declared as inputs anywhere in ``graph``'s subtree."""
    names.update(i.name for i in graph.input)
    for node in graph.node:
        names.update(node.output)
    for child in _children(graph):
        _defined_names(child, names)
    return names


def _hoist_shared(graph: onnx.GraphProto) -> None:
    children = list(_children(graph))
    for child in children:
        _hoist_shared(child)
    holders = defaultdict(list)  # name -> [(child, tensor)]
    for child in children:
        for tensor in child.initializer:
            holders[tensor.name].append((child, tensor))
    shared = {name: found for name, found in holders.items() if len(found) > 1}
    if not shared:
        return
    taken = _defined_names(graph, set()) | {t.name for t in graph.initializer}
    moved = set()
    for name, found in shared.items():
        first = found[0][1]
        if name in taken or any(t.SerializeToString() != first.SerializeToString() for _, t in found[1:]):
            continue
        graph.initializer.append(first)
        moved.add(name)
    if moved:
        for child in children:
            _remove(child, moved)


def _drop_outer_copies(graph: onnx.GraphProto, outer: set) -> None:
    if outer:
        _remove(graph, outer)
    scope = outer | {t.name for t in graph.initializer}
    for child in _children(graph):
        _drop_outer_copies(child, scope)


def _remove(graph: onnx.GraphProto, names: set) -> None:
    keep = [t for t in graph.initializer if t.name not in names]
    if len(keep) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep)
