"""SmoothQuant for the ``dynamic`` pass: the α chosen by measured fidelity.

Dynamic int8 quantizes each MatMul input per tensor, at run time, over its own range. A few
channels of transformer activations are far larger than the rest (all-MiniLM-L6-v2: the
largest channel peak is 6–10× the median after each LayerNorm), so most of the 256 levels go
unused. SmoothQuant (:mod:`.smooth`, shared with ``int8``) moves that range into the weights,
which are quantized per output column::

    X ──▶ Mul(1/s) ──▶ X' ──▶ MatMul(diag(s)·W),    s_k = max|X_k|^α / max|W_k·|^(1−α)

exact in real arithmetic. ``max|X_k|`` is the peak of input channel k over the calibration
samples the pass fits (at most :data:`PEAK_SAMPLES`, one ONNX Runtime run each, every
smoothed input an extra output).

The α (``smooth=auto``): each of :data:`ALPHAS` is tried on a copy of the model (smoothed,
then quantized as the pass writes it) and judged on the pipeline's held-out samples by the
fidelity contract (:mod:`onnxslim_kit.fidelity`), with ONNX Runtime at level ``all`` (the
fused DynamicQuantizeMatMul kernels users get); the α with the least budget used wins, ties
going to the smaller α (0: no smoothing, no Mul). Measured on all-MiniLM-L6-v2 (32-token
sentences, 32 evaluation samples, padding masked): the worst token cosine 0.987 without smoothing,
0.993 with α = 0.7, at a latency 1 % above. ``smooth=A`` fixes α = A (0: off). Not searched:
with generated random samples (their activation peaks are not the model's; a note says so),
and on models whose MatMul weights exceed :data:`SEARCH_MAX_BYTES` (one quantized copy per α;
α = :data:`LARGE_ALPHA` is used there).
"""

from __future__ import annotations

from dataclasses import dataclass

from onnxslim_kit.passes._quant import smooth as smooth_mod

ALPHAS = (0.0, 0.5, 0.7, 0.85)
LARGE_ALPHA = 0.5
PEAK_SAMPLES = 32
SEARCH_MAX_BYTES = 1 << 30


@dataclass
class SmoothLayer:
    """What :mod:`.smooth` reads and rewires of one MatMul / Gemm (weight at input 1)."""

    node: object
    inputs: list
    weight_index: int = 1


def layers_of(nodes: list) -> list:
    return [SmoothLayer(node, [node.inputs[0]]) for node in nodes]


def input_peaks(model, names: list, samples) -> dict:
    """``{input name: max |x| per channel}`` over ``samples`` (ONNX Runtime, the model as it is)."""
    from onnxslim_kit.api import make_session, run

    proto, arrays = model.session_proto()  # the weights handed to ORT where they lie: no copy
    session = make_session(proto, extra_outputs=names, arena=False, prepack=False, arrays=arrays)
    peaks = {}
    try:
        for sample in samples:
            smooth_mod.update_peaks(peaks, run(session, sample), names)
    finally:
        del session
    return peaks


def apply(model, nodes: list, peaks: dict, alpha: float, result) -> None:
    """Smooth the inputs of ``nodes`` (in ``model.graph``) with ``alpha`` (> 0); the weights
    become lazy ``diag(s)·W`` values (read by the quantizer)."""
    if alpha > 0 and nodes:
        smooth_mod.smooth(model, smooth_mod.smoothable(layers_of(nodes)), peaks, alpha, result)


def judged_used(model, fid) -> float:
    """The budget fraction ``model`` uses on the fidelity's samples, run at ORT level ``all``."""
    from onnxslim_kit.api import make_session, run

    proto, arrays = model.session_proto()
    names = [o.name for o in proto.graph.output]
    session = make_session(proto, "all", threads=1, arena=False, arrays=arrays)
    try:
        outputs = [{k: v for k, v in run(session, s).items() if k in names} for s in fid.samples]
    finally:
        del session
    return fid.judge(outputs).used


def choose_alpha(trial, fid, alphas=ALPHAS) -> tuple:
    """``(α, {α: used})``: ``trial(α)`` builds a quantized copy; the α with the least budget
    used (ties: the smaller) wins."""
    used = {alpha: judged_used(trial(alpha), fid) for alpha in alphas}
    best = min(used, key=lambda a: (round(used[a], 9), a))
    return best, used
