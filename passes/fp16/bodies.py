"""Float16 storage for the weights of If/Loop/Scan bodies (the bodies themselves run float32).

The ``fp16`` plan converts main-graph nodes only; a model whose weights all live in subgraph
bodies (silero-vad keeps every weight in the branches of an ``If`` on the sample rate) would
not shrink at all. Inside each body, a float32 constant ``W`` read by the body's nodes becomes

    W:f32  ⇒  W16:f16 → Cast(to=float) → W'        (one Cast per constant and body)

so the file holds ``W16`` (half the bytes) and ONNX Runtime folds the Cast when the session
starts: the body computes in float32 on ``fp32(fp16(W))`` — the same rounding the float16 plan
gives main-graph weights. A constant is left alone (counted reason) when it is small
(< ``MIN_ELEMENTS``: the Cast costs more than it saves), when it would overflow float16, or
when rounding moves it by more than ``MAX_REL_ERROR`` (relative L2; subnormal/zero underflow).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

MIN_ELEMENTS = 64
MAX_REL_ERROR = 1e-3
FP16_MAX = float(np.finfo(np.float16).max)


def _why_not(values: np.ndarray) -> str | None:
    """Why a float32 weight of at least ``MIN_ELEMENTS`` stays float32 (None: it converts)."""
    if not np.all(np.isfinite(values)) or np.abs(values).max() > FP16_MAX:
        return "subgraph weight: overflows float16"
    half = values.astype(np.float16).astype(np.float32)
    norm = float(np.linalg.norm(values))
    if norm > 0 and float(np.linalg.norm(half - values)) > MAX_REL_ERROR * norm:
        return "subgraph weight: float16 rounding error above 1e-3"
    return None


def store_body_weights_fp16(model, result) -> int:
    """Rewrite every subgraph body's float32 weights as float16 + Cast (one float16 copy per
    weight however many bodies read it, one Cast per body); returns bytes saved."""
    saved = 0
    halves: dict = {}  # one float16 constant per weight, shared by the bodies that read it
    for body in list(model.all_graphs())[1:]:
        casts: dict = {}
        new_nodes = []
        for node in body.nodes:
            for i, tensor in enumerate(node.inputs):
                if not isinstance(tensor, gs.Constant):
                    continue
                if id(tensor) not in casts:
                    values = np.asarray(tensor.values)
                    small = values.dtype != np.float32 or values.size < MIN_ELEMENTS
                    reason = None if small else _why_not(values)
                    if small or reason:
                        casts[id(tensor)] = None
                        if reason:
                            result.skip(reason)
                        continue
                    if id(tensor) not in halves:
                        halves[id(tensor)] = gs.Constant(model.fresh_name("fp16/body_weight"), values.astype(np.float16))
                        saved += values.nbytes // 2
                    half = halves[id(tensor)]
                    out = gs.Variable(model.fresh_name("fp16/body_weight_f32"), np.float32, values.shape)
                    new_nodes.append(gs.Node("Cast", model.fresh_name("fp16/body_Cast"),
                                             {"to": onnx.TensorProto.FLOAT}, [half], [out]))
                    casts[id(tensor)] = out
                    result.rewrite("subgraph weight→float16 storage")
                if casts[id(tensor)] is not None:
                    node.inputs[i] = casts[id(tensor)]
        body.nodes = new_nodes + body.nodes
    return saved
