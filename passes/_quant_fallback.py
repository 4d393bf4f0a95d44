"""Fidelity target and per-layer fallback of the ``int8`` pass.

Target ``METRIC:VALUE`` (``cos:0.99`` or ``top1:0.99``), measured against the *original*
model's outputs on the evaluation samples (ORT, optimisations off):

* ``cos``  — the worst cosine similarity over outputs and samples;
* ``top1`` — the argmax agreement over all rows of all samples, worst output (outputs
  without a class axis are judged by cosine instead).

Search (each step builds the model with a set of int8 layers and scores it):

1. all candidate layers int8 — done if the target holds;
2. sensitivity, ``sensitivity=e2e``: each layer alone in int8, ``1 − score`` at the outputs
   (one build and run per layer); ``sensitivity=local``: one run of the float model carrying
   a fake-quantized twin of every layer, ``1 − cos(layer output, twin output)`` averaged over
   the samples (how much 8 bits hurt the layer itself — cheaper, but a coarser ranking: on
   PP-OCRv4 rec it sent 33 layers back to float where e2e sent 3);
   e2e ranks on the first ``rank_samples`` samples only;
3. the most sensitive ``k`` layers go back to float for ``k = 1, 2, 4, …`` until the target
   holds, then a bisection between the last two ``k`` finds the smallest such ``k``.
   ``k = n`` is the float model itself, so the search always ends.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.errors import UserError
from onnxslim_kit.metrics import compare, cosine
from onnxslim_kit.runtime import make_session, run, session_options

from ._quant_qdq import add_quantized_twins

METRICS = ("cos", "top1")


def parse_target(text: str):
    """``"cos:0.99"`` → ("cos", 0.99); empty / ``none`` → None."""
    text = (text or "").strip()
    if text in ("", "none", "off"):
        return None
    metric, _, value = text.partition(":")
    try:
        number = float(value)
    except ValueError:
        number = None
    if metric not in METRICS or number is None or not 0 < number <= 1:
        raise UserError(f"int8(target={text}): expected cos:VALUE or top1:VALUE with 0 < VALUE ≤ 1")
    return metric, number


class SharedWeights:
    """The large float constants every trial model keeps unchanged, handed to ORT once.

    A trial proto's copies of them are replaced by in-memory external-data stubs and the
    session gets the arrays through ``add_external_initializers`` (no copy, no parsing): the
    search builds one session per trial, and for an 88 MB model this is most of its cost.
    """

    def __init__(self, graph, min_size: int = 4096):
        self.arrays = {}
        for tensor in graph.tensors().values():
            values = getattr(tensor, "values", None)
            if isinstance(values, np.ndarray) and values.dtype == np.float32 and values.size >= min_size:
                self.arrays[tensor.name] = (values, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(values)))

    def session(self, proto):
        used = []
        for init in proto.graph.initializer:
            entry = self.arrays.get(init.name)
            if entry is None or tuple(init.dims) != entry[0].shape or init.data_type != onnx.TensorProto.FLOAT:
                continue
            init.ClearField("raw_data")
            init.ClearField("float_data")
            init.data_location = onnx.TensorProto.EXTERNAL
            del init.external_data[:]
            init.external_data.add(key="location", value="in-memory")
            used.append(init.name)
        so = session_options("disable", 1)
        if used:
            so.add_external_initializers(used, [self.arrays[n][1] for n in used])
        return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


class Scorer:
    """Scores candidate protos against the reference outputs on fixed samples."""

    def __init__(self, original, samples: list, metric: str, shared: SharedWeights | None = None):
        self.samples = samples
        self.metric = metric
        self.shared = shared
        session = make_session(original, threads=1)
        self.reference = [run(session, s) for s in samples]
        self.builds = 0

    def __call__(self, proto) -> float:
        self.builds += 1
        session = self.shared.session(proto) if self.shared is not None else make_session(proto, threads=1)
        outputs = [run(session, s) for s in self.samples]
        scores = []
        for name, ref0 in self.reference[0].items():
            if np.asarray(ref0).dtype.kind != "f" or name not in outputs[0]:
                continue
            refs = [r[name] for r in self.reference]
            gots = [o[name] for o in outputs]
            scores.append(self._score(refs, gots))
        return min(scores) if scores else 1.0

    def _score(self, refs: list, gots: list) -> float:
        def cos(r, g):
            finite = np.isfinite(r)
            return cosine(r, g) if finite.all() else cosine(r[finite], g[finite])

        if self.metric == "top1":
            agree = [compare(r, g).top1 for r, g in zip(refs, gots)]
            rows = [int(np.prod(np.shape(r)[:-1])) or 1 for r in refs]
            if all(a is not None for a in agree):
                return float(np.average(agree, weights=rows))
        return min(cos(r, g) for r, g in zip(refs, gots))


def local_sensitivity(model, plan, samples: list) -> dict:
    """``{layer: mean over samples of 1 − cos(float output, fake-quantized twin output)}``.

    ``model`` is a throw-away copy of the float model (twins are added to it)."""
    pairs = add_quantized_twins(model, plan)
    names = [n for _, a, b in pairs for n in (a, b)]
    errors = {layer: 0.0 for layer, _, _ in pairs}
    for acts in iter_activations(model.to_proto(), names, samples, threads=1):
        for layer, a, b in pairs:
            errors[layer] += (1.0 - cosine(acts[a], acts[b])) / len(samples)
    return errors


def choose_float_layers(names: list, build, score, target: float, progress=lambda it, **_: it, log=None,
                        local=None, rank_score=None):
    """Smallest set of layers (most sensitive first) to keep float so ``score ≥ target``.

    ``build(enabled: set) -> proto``; ``local()`` gives local sensitivities (None: end to end,
    scored by ``rank_score``, default ``score``). Returns (float layer names, final score,
    sensitivities).
    """
    rank_score = rank_score or score
    everything = set(names)
    full = score(build(everything))
    if full >= target:
        return [], full, {}
    if local is not None:
        sens = local()
    else:
        sens = {}
        for name in progress(names, desc="int8 sensitivity", total=len(names)):
            sens[name] = 1.0 - rank_score(build({name}))
    order = sorted(names, key=lambda n: -sens[n])
    cache = {}

    def score_k(k: int) -> float:
        if k not in cache:
            cache[k] = score(build(everything - set(order[:k]))) if k < len(order) else 1.0
        return cache[k]

    k_ok, k_bad = None, 0
    k = 1
    while k_ok is None:
        k = min(k, len(order))
        if score_k(k) >= target:
            k_ok = k
        else:
            k_bad = k
            k *= 2
    while k_ok - k_bad > 1:
        mid = (k_ok + k_bad) // 2
        if score_k(mid) >= target:
            k_ok = mid
        else:
            k_bad = mid
    if log:
        log(f"int8: {k_ok} of {len(order)} layers kept float for the target")
    return order[:k_ok], score_k(k_ok), sens
