"""Bias correction for the ``int8`` pass.

Quantizing a layer's input and weights shifts the mean of its output:
``E[y − ŷ] ≠ 0`` per output channel (rounding of small weights does not cancel, most visibly
in depthwise convolutions). The shift is measured on the calibration samples with the float
model carrying a fake-quantized twin of every layer (:func:`._quant_qdq.add_quantized_twins`,
one run for all layers) and added to the bias before it is quantized::

    b' = b + mean over samples, batch and spatial positions of (y_float − y_twin)

Channel axis: 1 for Conv, the last axis for Gemm. Conv and Gemm without a bias get one;
MatMul has no bias input and is left as is. This is the local (per-layer) form: it corrects
each layer for its own error, not for the error arriving from the layers before it.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.activations import iter_activations

from ._quant_qdq import add_quantized_twins


def bias_shifts(model, plan, samples: list) -> dict:
    """``{layer name: float32 vector}`` to add to each Conv / Gemm bias."""
    specs = {s.name: s for s in plan.layers if s.op in ("Conv", "Gemm") and s.weight_index is not None}
    if not specs:
        return {}
    sub = type(plan)([s for s in plan.layers if s.name in specs], plan.params, plan.per_channel)
    pairs = add_quantized_twins(model, sub)
    names = [n for _, a, b in pairs for n in (a, b)]
    sums, count = {}, 0
    for acts in iter_activations(model.to_proto(), names, samples, threads=1):
        count += 1
        for layer, a, b in pairs:
            diff = acts[a].astype(np.float64) - acts[b].astype(np.float64)
            axis = 1 if specs[layer].op == "Conv" else diff.ndim - 1
            mean = np.moveaxis(diff, axis, 0).reshape(diff.shape[axis], -1).mean(axis=1)
            sums[layer] = sums.get(layer, 0.0) + mean
    return {layer: (total / count).astype(np.float32) for layer, total in sums.items()} if count else {}
