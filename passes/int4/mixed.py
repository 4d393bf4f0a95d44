"""Mixed precision for ``int4``: the layers whose 4-bit rounding hurts the outputs most become
8-bit, as long as all MatMul weights together stay within a size budget.

    budget:   Σ_layers bytes(layer) ≤ max_ratio · Σ_layers float bytes(layer)
    bytes:    int4 MatMulNBits  N·n_b·bs/2 codes + N·n_b scales (+ N·⌈n_b/2⌉ zero points, asym)
              int8 (bits=8)     N·n_b8·bs8 codes + N·n_b8 scales          (bs8 = 128)
    loss_i:   mean over calibration samples, summed over float outputs, of 1 − cos(y, ŷ_i)
              where ŷ_i = the float model with *only* layer i's weight replaced by its
              dequantized int4 weight (measured, not a proxy)
    greedy:   promote layers by loss_i / (extra bytes of 8 bits) while the budget holds

Why measured: the per-layer output error ‖XΔWᵀ‖²/‖XWᵀ‖² ranks layers badly (all-MiniLM-L6-v2:
the attention value projections matter most for the sentence embedding, yet their relative
error is middling; the FFN output layers have tiny relative error under GPTQ that does not
carry over to held-out sentences). All sensitivity runs share one ONNX Runtime session: the
candidate weights are graph inputs with their float values as defaults (initializers that are
also inputs can be fed), so each run feeds one dequantized weight.

Measured (all-MiniLM-L6-v2, GPTQ act_order asym block 64, fake-quantized float32, 32 held-out
sentences): worst sentence cosine 0.980 → 0.989, token 0.981 → 0.986 with 5 value projections,
one attention output and one FFN input layer at 8 bits (weights 0.143× → 0.159×).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxslim_kit.runtime import make_session, prepare_feed

INT8_BLOCK = 128


def int4_bytes(shape: tuple, block_size: int, symmetric: bool, scale_bytes: int) -> int:
    n, k = shape
    n_blocks = -(-k // block_size)
    zeros = 0 if symmetric else n * ((n_blocks + 1) // 2)
    return n * n_blocks * block_size // 2 + n * n_blocks * scale_bytes + zeros


def int8_block(k: int) -> int:
    """Block of the 8-bit layers: 128, or the smallest power of two ≥ K (≥ 16) for short K."""
    return min(INT8_BLOCK, max(16, 1 << (k - 1).bit_length()))


def int8_bytes(shape: tuple, scale_bytes: int) -> int:
    n, k = shape
    bs = int8_block(k)
    n_blocks = -(-k // bs)
    return n * n_blocks * bs + n * n_blocks * scale_bytes


def sensitivities(proto: onnx.ModelProto, candidates: dict, samples: list) -> dict:
    """``candidates``: {weight initializer name: callable giving the dequantized weight in its
    stored layout} (made one at a time: one float copy alive); returns {name: loss}."""
    proto = _weights_as_inputs(proto, list(candidates))
    session = make_session(proto, "basic", threads=1, arena=False)  # each run's buffers go back
    feeds = [prepare_feed(session, s) for s in samples]
    outputs = [o.name for o in session.get_outputs()]
    refs = [session.run(outputs, f) for f in feeds]
    losses = {}
    for name, make in candidates.items():
        value, loss = make(), 0.0
        for feed, ref in zip(feeds, refs):
            outs = session.run(outputs, {**feed, name: value})
            loss += sum(_one_minus_cos(r, o) for r, o in zip(ref, outs))
        losses[name] = loss / max(len(feeds), 1)
    return losses


def select(costs: dict, losses: dict, budget: int) -> set:
    """Names to promote: greedy by loss per extra byte; ``costs``: {name: (int4 bytes, int8 bytes)};
    ``budget``: bytes allowed above the all-int4 total."""
    chosen, spent = set(), 0
    order = sorted(costs, key=lambda n: -losses.get(n, 0.0) / max(costs[n][1] - costs[n][0], 1))
    for name in order:
        extra = costs[name][1] - costs[name][0]
        if losses.get(name, 0.0) > 0 and spent + extra <= budget:
            chosen.add(name)
            spent += extra
    return chosen


def _weights_as_inputs(proto: onnx.ModelProto, names: list) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    inits = {t.name: t for t in out.graph.initializer}
    existing = {i.name for i in out.graph.input}
    for name in names:
        if name not in existing:
            t = inits[name]
            out.graph.input.append(onnx.helper.make_tensor_value_info(name, t.data_type, list(t.dims)))
    return out


def _one_minus_cos(a: np.ndarray, b: np.ndarray) -> float:
    if a.dtype.kind != "f" or a.shape != b.shape:
        return 0.0
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    if not (np.all(np.isfinite(a64)) and np.all(np.isfinite(b64))):
        return 1.0
    # elementwise sums, not BLAS dot: a BLAS thread pool on a loaded machine took 13 ms a call
    na, nb = np.sqrt(np.square(a64).sum()), np.sqrt(np.square(b64).sum())
    if na == 0 or nb == 0:
        return 0.0 if na == nb else 1.0
    return float(1.0 - (a64 * b64).sum() / (na * nb))

