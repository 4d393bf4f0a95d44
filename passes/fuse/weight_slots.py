"""Weight slots: the inputs of layer ops that hold their parameters (used by constant folding).

A constant that a node only ever computes for a layer's parameter input — old model-zoo exports
(onnx's ``light_*`` models, IR 3) make every Conv / Gemm weight and BatchNormalization
parameter with ``ConstantOfShape`` from a 4-element shape — is a weight stored compressed:

1. ONNX Runtime materializes it when it loads the model (its constant folding runs before the
   layer kernels pre-pack their weights), so the memory of a run is the same either way;
2. the folds of ``fuse`` need the weight as a tensor (BN into Conv: ``W' = W·s``), and without
   them the model keeps a BatchNormalization and its four parameters per layer;
3. it is how every other exporter stores the same layer, and what OnnxSlim writes.

So constant folding materializes a node's outputs whatever their size relative to its inputs
(the growth rule, condition 2d of :mod:`onnxslim_kit.passes.fuse.const_fold`) and whatever
``fold_size_limit`` says (2c), when every reader of every output reads it in one of the slots
below — directly or through Reshape / Flatten / Squeeze / Unsqueeze / Transpose
(inception_v1's classifier weight is ``ConstantOfShape → Reshape → Gemm``) — and none is a
graph output. Anywhere else (an Add of a large ``ConstantOfShape``, an
``Expand`` of a mask) the growth rule and the size limit apply unchanged.

Slots (input positions), standard ONNX domain only::

    Conv, ConvTranspose                  1 (W), 2 (B)
    Gemm                                 1 (B), 2 (C)
    MatMul                               1
    BatchNormalization                   1–4 (scale, B, mean, var)
    InstanceNormalization                1, 2
    LayerNormalization, GroupNormalization   1, 2
    PRelu                                1 (slope)
    LSTM, GRU, RNN                       1 (W), 2 (R), 3 (B)
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import is_graph_output, is_onnx_op

WEIGHT_SLOTS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (1,),
    "BatchNormalization": (1, 2, 3, 4), "InstanceNormalization": (1, 2),
    "LayerNormalization": (1, 2), "GroupNormalization": (1, 2), "PRelu": (1,),
    "LSTM": (1, 2, 3), "GRU": (1, 2, 3), "RNN": (1, 2, 3),
}


LAYOUT_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"})
"""Ops that only rearrange their first input: a weight read through them is still a weight."""


def _read_as_weight(tensor, reader: gs.Node, graph, depth: int) -> bool:
    if not is_onnx_op(reader, reader.op):
        return False
    positions = [i for i, t in enumerate(reader.inputs) if t is tensor]
    if not positions:
        return False
    if reader.op in LAYOUT_OPS:
        return positions == [0] and depth > 0 and feeds_weights_only(reader, graph, depth - 1)
    slots = WEIGHT_SLOTS.get(reader.op)
    return slots is not None and all(i in slots for i in positions)


def feeds_weights_only(node: gs.Node, graph, depth: int = 4) -> bool:
    """True when every output of ``node`` is read, and only in weight slots (directly or through
    up to ``depth`` layout ops), never a graph output."""
    outs = [o for o in node.outputs if not o.is_empty()]
    if not outs:
        return False
    for out in outs:
        if is_graph_output(out, graph) or not out.outputs:
            return False
        if not all(_read_as_weight(out, reader, graph, depth) for reader in out.outputs):
            return False
    return True
