"""Task metrics: what a model's outputs mean for its job, on the evaluation samples.

Every metric is a hook for :func:`onnxslim_kit.bench.benchmark` built by a ``*_metric``
factory that closes over the labels: ``hook(reference_outputs, outputs) -> dict``, both
lists of ``{output name: array}`` (one per evaluation sample, the reference being the
original model's). Each returns ``score`` (the headline, higher is better), the same score
of the reference (``score_original``) and ``agreement`` with the reference's decisions, so
a compressed model is judged against both the truth and the model it replaces.

Outputs are looked up by name, falling back to position (a tool may rename outputs).
"""

from __future__ import annotations

import numpy as np


def output(sample_outputs: dict, name: str, index: int) -> np.ndarray:
    if name in sample_outputs:
        return np.asarray(sample_outputs[name])
    return np.asarray(list(sample_outputs.values())[index])


def _mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else float("nan")


def decision_metric(task: str, decide, labels: list, extra=None):
    """The common hook: ``decide(outputs) -> [decision per sample]`` scored against the labels
    (``score``, ``score_original``) and against the original's decisions (``agreement``);
    ``extra(decisions) -> dict`` adds task-specific numbers for the variant."""
    def hook(reference, outputs):
        ref, got = decide(reference), decide(outputs)
        result = {"task": task, "score": _mean(g == t for g, t in zip(got, labels)),
                  "score_original": _mean(r == t for r, t in zip(ref, labels)),
                  "agreement": _mean(g == r for g, r in zip(got, ref))}
        return {**result, **(extra(got) if extra else {})}
    return hook


# --- recognition (CTC) -------------------------------------------------------------------

def ctc_decode(probs: np.ndarray, charset: list) -> list:
    """Greedy CTC: argmax per step, merge repeats, drop blank (index 0), strip the spaces
    the padding decodes to. probs: [N, T, C]."""
    texts = []
    for row in np.argmax(probs, axis=-1):
        keep = np.ones(len(row), bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != 0
        texts.append("".join(charset[i] for i in row[keep] if i < len(charset)).strip())
    return texts


def edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def char_accuracy(pred: str, truth: str) -> float:
    return max(0.0, 1.0 - edit_distance(pred, truth) / max(1, len(truth)))


def recognition_metric(labels: list, charset: list, name: str, index: int = 0):
    """Exact string accuracy (CTC-decoded vs the rendered string) and character accuracy."""
    def texts(outputs):
        return [t for o in outputs for t in ctc_decode(output(o, name, index), charset)]

    def extra(got):
        return {"char_accuracy": _mean(char_accuracy(p, t) for p, t in zip(got, labels))}
    return decision_metric("string accuracy", texts, labels, extra)


# --- classification ----------------------------------------------------------------------

def classification_metric(labels: list, name: str, index: int = 0, task: str = "accuracy",
                          positive: int | None = None, threshold: float | None = None):
    """Accuracy of argmax (or ``prob[positive] > threshold``) against integer labels."""
    def decide(outputs):
        out = []
        for o in outputs:
            probs = output(o, name, index).reshape(-1, output(o, name, index).shape[-1])
            if positive is None:
                out.extend(np.argmax(probs, axis=-1).tolist())
            else:
                out.extend((probs[:, positive] > threshold).astype(int).tolist())
        return out

    return decision_metric(task, decide, labels)


# --- maps: text detection, face proposals ------------------------------------------------

def _iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def map_metric(name: str, index: int, threshold: float, extract, boxes: list | None = None):
    """Binarise a probability map (``extract(output) -> 2-D array``) at ``threshold``: IoU of
    the masks vs the original's and, with ground-truth ``boxes`` per sample (map pixels), the
    fraction of boxes found — a box is found when ≥ 30 % of its pixels are above the threshold."""
    def masks(outputs):
        return [extract(output(o, name, index)) > threshold for o in outputs]

    def found(sample_masks):
        rates = []
        for mask, sample_boxes in zip(sample_masks, boxes):
            for x0, y0, x1, y1 in sample_boxes:
                region = mask[int(y0):int(np.ceil(y1)), int(x0):int(np.ceil(x1))]
                rates.append(bool(region.size) and float(region.mean()) >= 0.3)
        return _mean(rates)

    def hook(reference, outputs):
        ref, got = masks(reference), masks(outputs)
        iou = _mean(_iou(r, g) for r, g in zip(ref, got))
        if boxes is None:
            return {"task": "mask IoU vs original", "score": iou, "score_original": 1.0, "agreement": iou}
        return {"task": "text boxes found", "score": found(got), "score_original": found(ref), "agreement": iou}
    return hook


# --- voice activity ------------------------------------------------------------------------

def vad_metric(labels: list, name: str = "output", index: int = 0, threshold: float = 0.5):
    """Speech/non-speech decisions (probability > 0.5) per 32 ms chunk against the labels."""
    def decide(outputs):
        return [int(float(output(o, name, index).ravel()[0]) > threshold) for o in outputs]

    return decision_metric("speech/non-speech accuracy", decide, labels)


# --- sentence embeddings ------------------------------------------------------------------------

def retrieval_metric(partners: list, name: str = "sentence_embedding", index: int = 1):
    """Paraphrase retrieval: for each sentence, is its nearest other sentence (cosine) its
    paraphrase partner? Also nearest-neighbour agreement with the original embeddings."""
    def neighbours(outputs):
        emb = np.concatenate([output(o, name, index).reshape(1, -1) for o in outputs]).astype(np.float64)
        emb /= np.linalg.norm(emb, axis=1, keepdims=True) + 1e-12
        sim = emb @ emb.T
        np.fill_diagonal(sim, -np.inf)
        return np.argmax(sim, axis=1).tolist()

    return decision_metric("paraphrase retrieval", neighbours, partners)
