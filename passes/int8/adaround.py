"""AdaRound for the ``int8`` pass's static weights (``int8(rounding=adaround)``), numpy only.

Nagel et al. 2020, "Up or Down? Adaptive Rounding for Post-Training Quantization", as AIMET
implements it, on the weight grids of :func:`onnxslim_kit.passes._quant.qdq.weight_grid` (kept:
MatMul / Gemm ``q = 127``, stored uint8 with zero point 128; full / grouped Conv ``q = 63``;
depthwise Conv ``q = 127``) and the per-channel scales ``s_c`` the nearest encoding uses
(the bias-fitted ones included). A layer ``Y = W X`` (Conv: im2col rows; MatMul / Gemm: token
rows; ``W`` as ``groups × n × K``) gets, instead of ``round(W / s)``, the codes::

    t = clip(W / s, −q, q),   W̃ = s · clip(floor(t) + h(V), −q, q),
    h(V) = clip(σ(V) (ζ − γ) + γ, 0, 1)              (rectified sigmoid, ζ = 1.1, γ = −0.1)

with ``V`` learned, per output channel ``c`` (the loss separates by channel), minimising::

    L = Σ_c δ_c G δ_cᵀ / N_c  +  λ · Σ_c Σ_i (1 − |2 h_ci − 1|^β) / K
    δ = floor(t) + h − t,     G = Σ_rows x xᵀ  (per conv group),     N_c = (r − t)_c G (r − t)_cᵀ

— ``‖W X − W̃ X‖²`` through the input Gram matrix ``G`` (the ``s_c²`` cancel), each channel
relative to its nearest-rounding error ``N_c`` (``r``: the nearest codes), so that one ``λ``
serves every layer. ``V`` starts where ``h`` equals the fractional part (``δ = 0``); Adam
(``ADAM_LR``, ``ITERS`` steps); the regulariser is off for the first ``WARM`` of the steps,
then ``β`` decays from ``BETA[0]`` to ``BETA[1]`` (cosine, as AIMET), pushing ``h`` to 0 or 1.
Hard rounding at the end: ``up = h ≥ ½``. Codes at ``floor(t) = q`` (the channel's peak) are
fixed at ``q``. ``λ`` is large next to AIMET's 0.01 because of the normalisation and the few
steps: on 12 PP-OCRv4 det layers (300 steps) λ = 0.01 / 0.1 / 1 / 3 / 10 left 0.83 / 0.60 /
0.34 / 0.30 / 0.29 of the nearest error on the fit rows and the same on 8 other samples'
rows (0.83 / 0.60 / 0.35 / 0.31 / 0.30); 1000 steps at λ = 0.1 gave 0.43.

Guarantee (tested): per channel, the learned codes are kept only when their error on the fit
rows ``δ G δᵀ`` is *below* the nearest one's; otherwise (and for channels with ``N_c = 0``:
weights on the grid, or no signal) the nearest codes stay — so no layer's reconstruction error
on its fit rows grows, every code is ``floor(t)`` or ``ceil(t)``, and a weight already on the
grid stays exactly.

Inputs ``X``: the float model's layer inputs (after CLE / SmoothQuant, before any Q/DQ) on the
pass's fit samples (the first ``SAMPLES`` of the fit feed: layers with one row per sample, a
Gemm after a flatten, need more samples than the bias correction's), at most ``ROWS`` rows per
layer in all (im2col positions / tokens drawn with a seeded generator, an equal share per
sample; :mod:`onnxslim_kit.passes._common.layer_stats`). Memory: only Gram matrices are held
(float64, ``8 · groups · K²`` bytes a layer), the layers in groups of at most ``GRAM_BUDGET``
bytes (a larger one alone), one streamed run over the samples per group, each group's
matrices dropped once its layers are rounded. Time: ``ITERS · Σ n · K²`` multiply-adds (one
``δ G`` product per step; ``G`` replaced by ``B Bᵀ``, ``B`` its top eigenvectors scaled, when
they hold all but ``SPECTRUM_LEFT`` of its trace and number under ``K / 2``: ``2 n K r``), the
channels in blocks of ``BLOCK`` weights (independent problems; the temporaries stay in cache),
with BLAS capped at one thread (same seed → same bytes). 2-D Conv,
MatMul and Gemm only; other layers keep the nearest codes, with the counted reason.

A weight that several MatMul / Gemm layers read on the same grid (an unrolled LSTM's steps, each
on its own input) is one problem: ``G = Σ_readers G_r`` (each reader's rows drawn as above),
one set of codes for all of them (:func:`shared`), so the weight stays one int8 constant and
is learned once, not once per step.

The result is handed to :mod:`onnxslim_kit.passes._quant.qdq` as ``plan.encodings``: the same
encoding tuple as the nearest one (scales, zero point, bias), only the weight codes changed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from onnxslim_kit.passes._common.blas import blas_threads
from onnxslim_kit.passes._common.layer_stats import conv_geometry, conv_rows, matmul_rows
from onnxslim_kit.passes._quant.dynamic import unsigned_weight
from onnxslim_kit.passes._quant.qdq import _encode_weights, weight_grid
from onnxslim_kit.passes._quant.smooth import weight_array
from onnxslim_kit.passes.int8.fallback import activations

ROWS = 2048            # input rows per layer, over all fit samples
SAMPLES = 32           # fit samples read (the first of the feed; fewer when the feed or calib_samples has fewer)
ITERS = 300            # Adam steps per layer
ADAM_LR = 0.05
LAMBDA = 5.0           # weight of the rounding regulariser (module docstring: how it was chosen)
BETA = (20.0, 2.0)     # β annealed from → to
WARM = 0.2             # share of the steps without the regulariser
ZETA, GAMMA = 1.1, -0.1
GRAM_BUDGET = 64 << 20  # bytes of Gram matrices held at once
BLOCK = 1 << 14        # weights optimised together (temporaries of 64 KB: in cache, off mmap)
SPECTRUM_LEFT = 1e-3   # share of tr G the optimisation may leave out (the final check is exact)


@dataclass(eq=False)
class Target:
    """One static layer to round: ``W / s`` and its nearest codes as ``(groups, n, K)``."""

    name: str
    node: object
    kind: str             # conv | matmul
    t: np.ndarray         # W / s clipped to [−q, q], float64, (groups, n, K)
    nearest: np.ndarray   # the nearest codes, same shape (int16)
    qmax: int
    shape: tuple          # the weight's shape
    geometry: object = None
    weight: str = ""      # the weight tensor's name
    readers: list = field(default_factory=list)  # the layers rounded with these codes: this one, and
    # the MatMul / Gemm layers of other inputs that read the same weight on the same grid (:func:`shared`)

    @property
    def input_names(self) -> list:
        return [node.inputs[0].name for node in self.readers]

    @property
    def gram_bytes(self) -> int:
        return 8 * self.t.shape[0] * self.t.shape[2] ** 2


def static_key(plan, spec) -> tuple:
    """The key of a static layer's encoding in ``plan.encodings`` (that of :mod:`._quant.qdq`)."""
    return spec.name, ("static", spec.name in plan.bias_shift)


def _signed(wq: np.ndarray, zero, axis: int | None) -> np.ndarray:
    """The codes ``w_q − zero`` (zero point per channel along ``axis``), int16."""
    if zero is None:
        return wq.astype(np.int16)
    zero = np.asarray(zero).astype(np.int16)
    if axis is not None and zero.ndim == 1:
        shape = [1] * wq.ndim
        shape[axis] = -1
        zero = zero.reshape(shape)
    return wq.astype(np.int16) - zero


def _as_groups(w: np.ndarray, node, spec) -> np.ndarray | None:
    """``w`` as ``(groups, n, K)`` (output channels along ``n``), or None (not 2-D conv / 2-D weight)."""
    if spec.op == "Conv":
        if w.ndim != 4:
            return None
        groups = int(node.attrs.get("group", 1))
        return w.reshape(groups, w.shape[0] // groups, -1)
    if w.ndim != 2:
        return None
    return (w.T if spec.weight_axis == 1 else w)[None]


def _from_groups(codes: np.ndarray, shape: tuple, spec) -> np.ndarray:
    if spec.op == "Conv":
        return codes.reshape(shape)
    return codes[0].T if spec.weight_axis == 1 else codes[0]


def targets(model, plan, result) -> list:
    """The static layers of ``plan`` to round (module docstring), with their nearest encoding."""
    nodes = {node.name: node for node in model.graph.nodes}
    found = []
    for spec in plan.layers:
        node = nodes.get(spec.name)
        if node is None or spec.weight_index is None or not spec.inputs or spec.op not in ("Conv", "MatMul", "Gemm"):
            continue
        wq, scales, axis, zero, _ = _encode_weights(node, spec, plan)
        codes = _as_groups(_signed(wq, zero, axis), node, spec)
        if codes is None or (spec.op == "Conv" and conv_geometry(node, (1, 1, 1, 1)) is None):
            result.skip("adaround: not a 2-D Conv / 2-D weight (nearest rounding)")
            continue
        w = weight_array(node.inputs[spec.weight_index])
        qmax = weight_grid(node, w)[0]
        shape = [1] * w.ndim
        if axis is not None:
            shape[axis] = -1
        t = np.clip(w.astype(np.float64) / np.asarray(scales, np.float64).reshape(shape), -qmax, qmax)
        found.append(Target(spec.name, node, "conv" if spec.op == "Conv" else "matmul",
                            _as_groups(t, node, spec), codes, qmax, w.shape,
                            weight=node.inputs[spec.weight_index].name, readers=[node]))
    return shared(found)


def shared(found: list) -> list:
    """``found`` with the MatMul / Gemm layers that read one weight on one grid (equal ``W / s``
    and nearest codes: an unrolled RNN's steps) as one target, its ``readers`` all of them. One
    set of codes serves them all, learned on the sum of their Gram matrices — the loss
    ``Σ_readers ‖(W − W̃) X_r‖²`` — so the rounded weight stays one constant (per-reader codes
    would store a copy per step) and is learned once instead of once per step."""
    out, first = [], {}
    for target in found:
        lead = first.get(target.weight) if target.kind == "matmul" else None
        if lead is not None and lead.qmax == target.qmax and np.array_equal(lead.t, target.t) \
                and np.array_equal(lead.nearest, target.nearest):
            lead.readers.append(target.node)
            continue
        if target.kind == "matmul":
            first.setdefault(target.weight, target)
        out.append(target)
    return out


def _chunks(found: list, budget: int) -> list:
    groups, current, held = [], [], 0
    for target in found:
        if current and held + target.gram_bytes > budget:
            groups.append(current)
            current, held = [], 0
        current.append(target)
        held += target.gram_bytes
    return groups + ([current] if current else [])


def grams(model, chunk: list, samples: list, rng) -> dict:
    """``{target name: G}`` (``(groups, K, K)`` float64) from one run over ``samples``."""
    per_sample = max(1, -(-ROWS // max(1, len(samples))))
    out = {}
    names = sorted({name for t in chunk for name in t.input_names})
    for acts in activations(model, names, samples):
        for target in chunk:
            for name in target.input_names:  # a shared weight: the sum of its readers' Gram matrices
                g = _gram(target, acts[name], rng, per_sample)
                out[target.name] = g if target.name not in out else out[target.name] + g
        acts.clear()
    return out


def _gram(target, x: np.ndarray, rng, per_sample: int) -> np.ndarray:
    """``Σ_rows x xᵀ`` per group, ``(groups, K, K)`` float64, of rows drawn from one layer input."""
    groups, _, k = target.t.shape
    if target.kind == "conv":
        if target.geometry is None:
            target.geometry = conv_geometry(target.node, x.shape)
        rows = conv_rows(x, target.geometry, rng, per_sample)[0]
    else:
        rows = matmul_rows(x, k, rng, per_sample)[0]
    r = rows.astype(np.float64).reshape(len(rows), groups, k)
    return np.einsum("rgi,rgj->gij", r, r) if groups > 1 else (r[:, 0].T @ r[:, 0])[None]


def _errors(delta: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``δ_c G δ_cᵀ`` per channel, ``(groups, n)``."""
    return np.einsum("gnk,gnk->gn", delta @ g, delta)


def _factor(g: np.ndarray) -> tuple:
    """``(G,)`` in float32, or ``(B, Bᵀ)`` with ``B = U_r Λ_r^½`` (``K × r``) when the top ``r``
    eigenvalues hold all but ``SPECTRUM_LEFT`` of ``tr G`` and ``2r < K`` (one group only):
    ``δ G`` as ``(δ B) Bᵀ``, ``2 n K r`` instead of ``n K²`` multiply-adds a step."""
    if g.shape[0] != 1 or g.shape[1] < 64:
        return (g.astype(np.float32),)
    values, vectors = np.linalg.eigh(g[0])
    values = np.clip(values[::-1], 0.0, None)
    kept = np.cumsum(values)
    r = int(np.searchsorted(kept, (1.0 - SPECTRUM_LEFT) * kept[-1])) + 1
    if 2 * r >= g.shape[1]:
        return (g.astype(np.float32),)
    b = (vectors[:, ::-1][:, :r] * np.sqrt(values[:r])).astype(np.float32)
    return b[None], b.T[None].copy()


def _steps(v: np.ndarray, fixed: np.ndarray, norm: np.ndarray, factor: tuple, k: int, iters: int) -> np.ndarray:
    """``V`` after ``iters`` Adam steps on one block of channels (module docstring), in place."""
    m, s2 = np.zeros_like(v), np.zeros_like(v)
    warm, span = int(WARM * iters), ZETA - GAMMA
    for it in range(iters):
        sig = np.exp(-v)
        sig += 1.0
        np.reciprocal(sig, out=sig)
        raw = sig * span
        raw += GAMMA
        h = np.clip(raw, 0.0, 1.0)
        delta = fixed + h
        grad = (delta @ factor[0]) @ factor[1] if len(factor) == 2 else delta @ factor[0]
        grad *= norm
        grad *= 2.0
        if it >= warm:
            beta = BETA[1] + 0.5 * (BETA[0] - BETA[1]) * (1 + math.cos((it - warm) / max(1, iters - warm) * math.pi))
            u = h * 2.0
            u -= 1.0  # d/dh (1 − |u|^β) = −2β·u·|u|^(β−2)
            grad -= (2.0 * beta * LAMBDA / k) * u * np.abs(u) ** (beta - 2.0)
        grad *= (raw > 0) & (raw < 1)
        grad *= sig * (1.0 - sig) * span
        m *= 0.9
        m += 0.1 * grad
        s2 *= 0.999
        s2 += 0.001 * grad * grad
        step = it + 1
        np.sqrt(s2 / (1 - 0.999**step), out=grad)
        grad += 1e-8
        v -= (ADAM_LR / (1 - 0.9**step)) * m / grad
    return v


def _blocks(shape: tuple) -> list:
    """Index tuples cutting ``(groups, n, K)`` into blocks of about ``BLOCK`` weights (along
    the groups, or along ``n`` for one group): each channel's problem is its own, so the
    blocks are solved one after the other with the temporaries in cache."""
    groups, n, k = shape
    if groups > 1:
        step = max(1, BLOCK // (n * k))
        return [(slice(i, i + step), slice(None)) for i in range(0, groups, step)]
    step = max(1, BLOCK // k)
    return [(slice(None), slice(i, i + step)) for i in range(0, n, step)]


def learn(t: np.ndarray, nearest: np.ndarray, g: np.ndarray, qmax: int, iters: int = ITERS) -> tuple:
    """``(codes, channels changed, fit error ratio Σ adaround / Σ nearest)`` for one layer
    (module docstring); ``t``, ``nearest``: ``(groups, n, K)``, ``g``: ``(groups, K, K)``.
    Block by block (:func:`_blocks`): no temporary of the whole weight's size."""
    codes = np.empty(t.shape, np.int16)
    changed, err_ada, err_near = 0, 0.0, 0.0
    whole = _factor(g) if g.shape[0] == 1 else None
    for rows in _blocks(t.shape):
        gram = g[rows[0]]
        codes[rows], ada, near = _learn_block(t[rows], nearest[rows], gram, whole or (gram.astype(np.float32),),
                                              qmax, iters)
        changed += int((ada < near).sum())
        err_ada += float(np.minimum(ada, near).sum())
        err_near += float(near.sum())
    return codes, changed, err_ada / err_near if err_near > 0 else 1.0


def _learn_block(t, nearest, g, factor, qmax: int, iters: int) -> tuple:
    """``(codes, learned errors, nearest errors)`` of one block of channels: the learned codes
    where their fit error is below nearest's, else the nearest ones."""
    base = np.floor(t)
    free = base < qmax                                 # the peak's code stays q: h held at 0
    rest = np.clip(t - base, 1e-6, 1 - 1e-6)
    v = np.where(free, -np.log(span_ratio(rest)), -30.0).astype(np.float32)
    near_err = _errors(nearest - t, g)
    active = near_err > 0
    norm = np.where(active, 1.0 / np.maximum(near_err, 1e-300), 0.0)[..., None].astype(np.float32)
    v = _steps(v, (base - t).astype(np.float32), norm, factor, t.shape[2], iters)
    learned = np.clip(base + ((np.clip(span_sigmoid(v), 0.0, 1.0) >= 0.5) & free), -qmax, qmax)
    ada_err = np.where(active, _errors(learned - t, g), near_err)
    better = ada_err < near_err
    return np.where(better[..., None], learned, nearest), ada_err, near_err


def span_ratio(h: np.ndarray) -> np.ndarray:
    """``e^{−V}`` for the ``V`` where the rectified sigmoid equals ``h``: ``(ζ − γ)/(h − γ) − 1``."""
    return (ZETA - GAMMA) / (h - GAMMA) - 1.0


def span_sigmoid(v: np.ndarray) -> np.ndarray:
    """``σ(V)(ζ − γ) + γ``, the rectified sigmoid before its clip."""
    return (ZETA - GAMMA) / (1.0 + np.exp(-v.astype(np.float64))) + GAMMA


def adaround(model, plan, samples: list, result, seed: int = 0, iters: int = ITERS, progress=None) -> dict:
    """``{layer: signed codes in the weight's shape}`` for the static layers of ``plan`` (module
    docstring); the metrics ``adaround_layers``, ``adaround_channels`` and
    ``adaround_error_ratio`` (Σ fit error adaround / nearest over the rounded layers) go to
    ``result``."""
    rng = np.random.default_rng(seed)
    found = targets(model, plan, result)
    learned, changed, err_ada, err_near = {}, 0, 0.0, 0.0
    specs = {spec.name: spec for spec in plan.layers}
    with blas_threads(1):
        for chunk in _chunks(found, GRAM_BUDGET):
            chunk_grams = grams(model, chunk, samples, rng)
            todo = progress(chunk, desc="int8 adaround", total=len(chunk)) if progress else chunk
            for target in todo:
                g = chunk_grams.pop(target.name)
                codes, n, ratio = learn(target.t, target.nearest, g, target.qmax, iters)
                near = float(_errors(target.nearest - target.t, g).sum())
                err_near += near
                err_ada += ratio * near
                changed += n
                for reader in target.readers:
                    learned[reader.name] = _from_groups(codes, target.shape, specs[reader.name])
    result.metrics["adaround_layers"] = len(learned)
    result.metrics["adaround_channels"] = changed
    result.metrics["adaround_error_ratio"] = round(err_ada / err_near, 4) if err_near > 0 else 1.0
    return learned


def store(model, plan, learned: dict) -> int:
    """Put the learned codes into ``plan.encodings`` under each layer's current static key
    (:func:`static_key`), the rest of the nearest encoding (scales, zero point, bias) kept;
    channels whose scale differs from the learned one's (the bias correction raised it to fit
    int32) keep their nearest codes. Returns the layers stored."""
    nodes = {node.name: node for node in model.graph.nodes}
    count = 0
    for spec in plan.layers:
        codes = learned.get(spec.name)
        if codes is None or spec.name not in nodes:
            continue
        key = static_key(plan, spec)
        wq, scales, axis, zero, bias = _encode_weights(nodes[spec.name], spec, plan)
        base = plan.encodings.get((spec.name, ("static", False)))
        same = np.ones(np.shape(scales), bool) if base is None else np.asarray(base[1]) == np.asarray(scales)
        shape = [1] * wq.ndim
        if axis is not None:
            shape[axis] = -1
        signed = np.where(same.reshape(shape) if same.ndim else same, codes, _signed(wq, zero, axis)).astype(np.int8)
        if zero is not None:
            signed = unsigned_weight(signed, np.zeros(np.shape(zero), np.int8))[0]
        plan.encodings[key] = (signed, scales, axis, zero, bias)
        count += 1
    return count
