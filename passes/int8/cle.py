"""Cross-layer equalization (Nagel et al., "Data-Free Quantization", 2019) for the ``int8`` pass.

Per-channel weight scales do not help the *activation* between two convolutions: when the
output channels of a depthwise conv span ranges of 1 and 100, one per-tensor scale for
them wastes most of its levels. ReLU is positively homogeneous (``relu(x / s) = relu(x) / s``
for ``s > 0``), so channel ``c`` can be scaled down in the first conv and up in the second::

    Conv1(W1, b1) ─▶ [Relu] ─▶ Conv2(W2)     ≡     Conv1(W1 / s, b1 / s) ─▶ [Relu] ─▶ Conv2(W2 · s)

    r1_c = max|W1[c, …]|   (output channel c of Conv1)
    r2_c = max|W2[:, c, …]| (input channel c of Conv2; W2[c, 0, …] when Conv2 is depthwise)
    s_c  = sqrt(r1_c / r2_c)   →   both ranges become sqrt(r1_c · r2_c)

Conditions (each failure is a counted reason):

1. Conv1's output is read by one node only — a Relu (whose output is read by one node) or
   Conv2 directly — and is no graph output;
2. both convs have constant float weights read by them alone (bias of Conv1 too);
3. Conv2 is a plain conv (``group = 1``) or depthwise (``group`` = its input channels, one
   filter per channel); Conv1 may be grouped or not (its output channels are its rows);
4. ``s_c`` is clipped to [1e-3, 1e3]; channels where either range is 0 keep ``s_c = 1``;
5. neither conv is one the selectors leave alone (``skip``: excluded, or not included).

Exact in real arithmetic (float rounding only). Applied once per pair in graph order; a
conv in the middle of a chain is first Conv2 then Conv1, as the paper iterates.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.passes._common.graph import (
    attr,
    const_value,
    consumers,
    exclusive_constant,
    is_graph_output,
    is_onnx_op,
)


def _pair(node, graph):
    """(conv2, reason): the conv that ``node``'s output channels feed, or why none."""
    users = consumers(node.outputs[0])
    if len(users) != 1 or is_graph_output(node.outputs[0], graph):
        return None, "conv output read by several nodes"
    nxt = users[0]
    if is_onnx_op(nxt, "Relu"):
        after = consumers(nxt.outputs[0])
        if len(after) != 1 or is_graph_output(nxt.outputs[0], graph):
            return None, "relu output read by several nodes"
        nxt = after[0]
    if not is_onnx_op(nxt, "Conv"):
        return None, "not followed by (Relu →) Conv"
    return nxt, None


def _weights_ok(conv) -> bool:
    w = const_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    bias_ok = len(conv.inputs) < 3 or exclusive_constant(conv.inputs[2], conv)
    return w is not None and w.dtype == np.float32 and exclusive_constant(conv.inputs[1], conv) and bias_ok


def equalize(graph, result, skip=frozenset()) -> int:
    """Equalize every (Conv → [Relu] →) Conv pair of ``graph`` (none with a conv named in
    ``skip``); returns the count."""
    count = 0
    for conv1 in [n for n in graph.nodes if is_onnx_op(n, "Conv")]:
        conv2, reason = _pair(conv1, graph)
        if conv2 is None:
            result.skip(f"cle: {reason}")
            continue
        if conv1.name in skip or conv2.name in skip:
            result.skip("cle: excluded conv")
            continue
        if not (_weights_ok(conv1) and _weights_ok(conv2)):
            result.skip("cle: weight not a float constant of the conv alone")
            continue
        w1, w2 = conv1.inputs[1].values, conv2.inputs[1].values
        channels = w1.shape[0]
        group = attr(conv2, "group", 1)
        if group == 1 and w2.shape[1] == channels:
            r2 = np.abs(np.moveaxis(w2, 1, 0)).reshape(channels, -1).max(axis=1)
        elif group == channels and w2.shape[0] == channels and w2.shape[1] == 1:
            r2 = np.abs(w2).reshape(channels, -1).max(axis=1)
        else:
            result.skip("cle: second conv grouped (not depthwise)")
            continue
        r1 = np.abs(w1).reshape(channels, -1).max(axis=1)
        s = np.where((r1 > 0) & (r2 > 0), np.sqrt(r1 / np.maximum(r2, 1e-30)), 1.0)
        s = np.clip(s, 1e-3, 1e3).astype(np.float32)
        conv1.inputs[1].values = (w1 / s.reshape(-1, *[1] * (w1.ndim - 1))).astype(np.float32)
        if len(conv1.inputs) > 2:
            conv1.inputs[2].values = (conv1.inputs[2].values / s).astype(np.float32)
        shape = [channels, 1] if group != 1 else [1, channels]
        conv2.inputs[1].values = (w2 * s.reshape(*shape, *[1] * (w2.ndim - 2))).astype(np.float32)
        result.rewrite("cle: conv pair equalized")
        count += 1
    return count
