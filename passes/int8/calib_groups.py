"""The ``int8`` pass's calibration in groups of tensors, at most :data:`CALIB_RUN_BYTES` a run.

One calibration run returns every tensor the pass calibrates (each layer's inputs and output,
Concat inputs, pool inputs) at once, and ONNX Runtime holds them all until the run returns —
fetching a subset of one session's outputs does not lower that (picodet_layout's Conv outputs:
171 MB fetched at once, 198 MB peak in four fetches). On detectors at 640 × 640 that run was the
pass's peak (``benchmarks/trace_int8_memory.py``, 32 samples: yolov8n_doclaynet 966 MB in the
calibration run, ≤ 764 MB in every other step; picodet_layout 727 MB against ≤ 480 MB).

So when the tensors' float32 bytes at the first sample's input shapes add up to more than
:data:`CALIB_RUN_BYTES`, they are cut, in graph order, into groups of at most that many bytes;
each group gets a session of its own (cut to the nodes its tensors depend on) and a pass over
the samples. Every tensor still sees the samples in the same order, computed by the same nodes,
so the statistics are the same numbers; the price is up to one more model run per sample and
group. Sizes: ONNX shape inference at the sample's shapes (no run); a tensor it leaves unknown
counts as the largest known one. Above :data:`EXPORT_MAX_BYTES` of weights, the graph's own
shapes, symbolic dims read from the sample (exporting the model for inference touches every
weight page and copies the graph; a decoder's activations at calibration length are small
beside its weights).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

CALIB_RUN_BYTES = 128 << 20  # float32 activations one calibration run may return at once
EXPORT_MAX_BYTES = 256 << 20  # weights above which sizes come from the graph's own shapes


def calibration_groups(model, names: list, sample: dict) -> list:
    """``names`` as one list when they fit in :data:`CALIB_RUN_BYTES`, else in groups (module docstring)."""
    sizes = tensor_bytes(model, names, sample)
    if sum(sizes.values()) <= CALIB_RUN_BYTES:
        return [list(names)]
    made = {out.name: i for i, node in enumerate(model.graph.nodes) for out in node.outputs}
    groups, current, held = [], [], 0
    for name in sorted(names, key=lambda n: made.get(n, -1)):
        if current and held + sizes[name] > CALIB_RUN_BYTES:
            groups.append(current)
            current, held = [], 0
        current.append(name)
        held += sizes[name]
    return groups + [current]


def tensor_bytes(model, names: list, sample: dict) -> dict:
    """``{name: float32 bytes}`` at ``sample``'s input shapes (module docstring)."""
    from onnxslim_kit.passes.int8.layer_speed import sample_shapes

    weights = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in model.graph.tensors().values()
                  if isinstance(t, gs.Constant) and t.shape is not None)
    shapes = sample_shapes(model, sample, weights > EXPORT_MAX_BYTES, measure=False)
    known = {n: 4 * int(np.prod(shapes[n])) for n in names if n in shapes}
    fill = max(known.values(), default=0)
    return {n: known.get(n, fill) for n in names}
