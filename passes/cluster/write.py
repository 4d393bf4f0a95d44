"""Writing the chosen ``cluster`` encodings into the graph, each only where it saves bytes.

For the encodings of one shared codebook (or one weight on its own) — a *group* ``G`` — and
the label stream of one graph made of groups ``G₁ … Gₘ`` (:mod:`onnxslim_kit.passes.cluster.stream`)::

    member pays:   member_bytes(c) < float_bytes(w)
    group pays:    group_bytes(G') + Σ_{c ∈ G'} member_bytes(c) < Σ_{w ∈ G'} float_bytes(w)
                   (G' = the paying members of G)
    stream pays:   Σ_i saved(Gᵢ) > stream_bytes(G₁ … Gₘ)     (the shared unpacking nodes)

Everything that does not pay stays float (one counted skip per weight). ``encode=dense``
encodings are written as plain float constants, no accounting needed.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.api import PassResult

import onnxslim_kit.passes.cluster.stream as stream

NOT_SMALLER = "encoding not smaller than the float weight"


def encode_all(model, kept: list, result: PassResult) -> list:
    """Encode ``(item, Clustered)`` pairs; returns the items encoded. Per tensor: groups of
    weights sharing a codebook (one group per weight otherwise), decoded together
    (:mod:`onnxslim_kit.passes.cluster.stream`), each weight and each group only where it saves bytes."""
    done = []
    groups = {}
    for item, clustered in kept:
        if clustered.dense is not None:
            node = item.node
            node.inputs[item.index] = gs.Constant(model.fresh_name("cluster/dense"),
                                                  np.ascontiguousarray(clustered.dense))
            result.rewrite(f"{node.op} weight → clustered float (k={clustered.k}, dense)")
            done.append(item)
            continue
        key = (id(item.graph), clustered.share, id(clustered.codebook)) if clustered.share else id(clustered)
        groups.setdefault(key, []).append((item, clustered))
    by_graph = _paying_streams(_paying_groups(groups, result), result)
    for graph_groups in by_graph.values():
        done += _write_stream(model, graph_groups, result)
    return done


def _paying_groups(groups: dict, result: PassResult) -> dict:
    """Per graph: ``[(paying (item, Clustered) pairs of a group, bytes they save)]``."""
    by_graph = {}
    for pairs in groups.values():
        half = stream.half_scales([c for _, c in pairs])
        paying = [(i, c) for i, c in pairs if stream.member_bytes(c, half) < stream.float_bytes(i.values)]
        cost = (stream.group_bytes([c for _, c in paying], half) + sum(stream.member_bytes(c, half) for _, c in paying)
                if paying else 0)
        if not paying or cost >= sum(stream.float_bytes(i.values) for i, _ in paying):
            paying = []
        result.skip(NOT_SMALLER, len(pairs) - len(paying))
        if paying:
            saved = sum(stream.float_bytes(i.values) for i, _ in paying) - cost
            by_graph.setdefault(id(paying[0][0].graph), []).append((paying, saved))
    return by_graph


def _paying_streams(by_graph: dict, result: PassResult) -> dict:
    """Per graph: the groups' pairs, for the graphs whose label stream pays for its unpacking."""
    out = {}
    for key, entries in by_graph.items():
        groups = [[c for _, c in pairs] for pairs, _ in entries]
        if sum(saved for _, saved in entries) <= stream.stream_bytes(groups):  # the unpacking would not pay
            result.skip(NOT_SMALLER, sum(len(pairs) for pairs, _ in entries))
        else:
            out[key] = [pairs for pairs, _ in entries]
    return out


def _write_stream(model, graph_groups: list, result: PassResult) -> list:
    """One graph's label stream and decoders; the weights read the decoded tensors."""
    done = []
    graph = graph_groups[0][0][0].graph
    outputs = stream.encode(model, graph, [[c for _, c in pairs] for pairs in graph_groups])
    for pairs, tensors in zip(graph_groups, outputs):
        for (item, clustered), tensor in zip(pairs, tensors):
            item.node.inputs[item.index] = tensor
            bits = "4-bit" if clustered.k <= 16 else "uint8"
            books = "codebooks per row" if clustered.per_channel else "codebook"
            result.rewrite(f"{item.node.op} weight → {books} + {bits} indices")
            done.append(item)
    return done
