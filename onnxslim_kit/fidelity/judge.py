"""A candidate's outputs judged against the reference's, view by view (:mod:`.views`).

Per view, over the judged samples s (reference y, candidate ŷ restricted to the view):

    cosine     = min_s  ⟨y_s, ŷ_s⟩ / (‖y_s‖ ‖ŷ_s‖)                      (float views)
    rel        = max_s  max|y_s − ŷ_s| / max|y_s|                        (float views)
    agreement  = Σ_s |A_s ∩ Â_s| / Σ_s |A_s ∪ Â_s|,  A = {i : y_i > 0.25}   (scores)
               = min(share of softmax rows whose arg-max agrees, over all samples,
                     the margin estimate of :mod:`.margins`)                (probs)
               = share of equal elements, over all samples                (exact)
               = min(share of sequences whose greedy-CTC strings agree,
                     the strings' margin estimate of :mod:`.strings`)      (ctc)

A non-finite value where the reference is finite (or the other way round) makes that sample's
cosine 0 and its relative error infinite. The verdict's budget fraction ``used`` is the
target's (:meth:`.target.Target.used`) over the worst view of each metric; the view and
metric that set it are the *binding* view. ``worst_sample`` is the index of the sample with
the lowest cosine (agreement for decision-only views) in the judged list.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .margins import estimated_agreement, margins_and_shifts, reads_as_logits
from .strings import ctc_layout, decode, estimated_string_agreement, sequences, string_margins
from .target import Target
from .views import SCORE_THRESHOLD, View, Views


@dataclass
class ViewScore:
    view: str
    kind: str
    cosine: float | None = None
    rel: float | None = None
    agreement: float | None = None
    worst_sample: int = 0
    observed: float | None = None  # probs: the counted share, before the margin estimate
    margin_shift: float | None = None  # probs, ctc: the most a top-vs-runner-up margin was closed (nats)
    min_margin: float | None = None  # probs: the original's smallest such margin on the judged rows
    masked_by: str | None = None  # the mask input whose marked positions alone were judged

    def to_dict(self) -> dict:
        out = {"view": self.view, "kind": self.kind, "worst_sample": self.worst_sample}
        if self.masked_by:
            out["masked_by"] = self.masked_by
        for key in ("cosine", "rel", "agreement", "observed", "margin_shift", "min_margin"):
            value = getattr(self, key)
            if value is not None:
                out[key] = round(value, 6) if math.isfinite(value) else str(value)
        return out


@dataclass
class Verdict:
    target: Target
    scores: list = field(default_factory=list)
    used: float = 0.0
    binding: str = ""  # "output[scores] agreement 0.93"
    samples: int = 0

    def met(self, allowed: float = 1.0) -> bool:
        return self.used <= allowed + 1e-9

    def worst(self, metric: str = "cosine") -> float:
        """The worst value of ``metric`` over the views that have it (1.0 / 0.0 when none)."""
        values = [getattr(s, metric) for s in self.scores if getattr(s, metric) is not None]
        if metric == "rel":
            return max(values, default=0.0)
        return min(values, default=1.0)

    def to_dict(self) -> dict:
        return {"target": str(self.target), "used": round(self.used, 6) if math.isfinite(self.used) else "inf",
                "binding": self.binding, "samples": self.samples, "views": [s.to_dict() for s in self.scores]}

    def summary(self) -> str:
        return f"{self.binding} ({self.used:.0%} of the {self.target} budget, {self.samples} samples)"


def judge(views: Views, reference: list, candidate: list, target: Target, runtime: list | None = None,
          metric=None, margin_pool: dict | None = None) -> Verdict:
    """Score ``candidate`` (a list of output dicts, one per sample) against ``reference``;
    ``runtime``: per sample, the original's tensors :attr:`.views.Views.runtime_tensors`
    names (needed only when a view has a layout tail). ``metric``: a :class:`UserMetric`; its
    score binds a ``metric:V`` target (the views are still scored, for the report).
    ``margin_pool``: view name → the original's margins on samples not judged (the fit ones:
    :func:`reference_margins`), pooled with the judged rows' margins in the estimate."""
    pool = margin_pool or {}
    scores = [_score(view, views, reference, candidate, runtime, pool.get(view.name)) for view in views]
    if metric is not None:
        scores.append(ViewScore(f"metric {metric.name}", "metric", agreement=metric(reference, candidate)))
    losses, binding = {}, {}
    for score in scores:
        if score.kind == "metric":
            losses["metric"], binding["metric"] = 1.0 - score.agreement, score
            continue
        for metric, loss in (("cos", None if score.cosine is None else 1.0 - score.cosine),
                             ("rel", score.rel),
                             ("decision", None if score.agreement is None else 1.0 - score.agreement)):
            if loss is not None and (metric not in losses or loss > losses[metric]):
                losses[metric], binding[metric] = loss, score
    if target.metric == "top1" and "decision" not in losses:  # no decision output: cosine stands in
        losses["decision"], binding["decision"] = losses.get("cos", 0.0), binding.get("cos")
    used = target.used(losses)
    verdict = Verdict(target, scores, used, samples=len(reference))
    verdict.binding = _binding_text(target, losses, binding)
    return verdict


def drift_scores(views: Views, reference: list, candidate: list, runtime: list | None = None) -> list:
    """Each view's worst cosine and relative error over the samples, as :func:`judge` scores
    them, without its decisions and margin estimates (a trial's bound after each sample reads
    these only; the CTC judge decodes every sequence and re-rates the margin pool)."""
    scores = []
    for view in views:
        layout = ctc_layout([out.get(view.output) for out in reference]) if view.ctc else None
        view = view if layout is not None else _as_logits(view, reference)
        if layout is None and view.kind == "exact":
            continue
        cosines, rels = [], []
        for i, (ref_out, got_out) in enumerate(zip(reference, candidate)):
            ref, got = ref_out[view.output], got_out.get(view.output)
            if got is not None and layout is None and np.shape(got) == np.shape(ref):
                ref, got, _ = _part(view, views, ref, got, runtime[i] if runtime else None)
            if got is None or np.shape(got) != np.shape(ref):
                cosines.append(0.0), rels.append(math.inf)
                continue
            cos, rel = _float_drift(np.asarray(ref), np.asarray(got))
            cosines.append(cos), rels.append(rel)
        scores.append(ViewScore(view.name, view.kind, cosine=min(cosines, default=1.0), rel=max(rels, default=0.0)))
    return scores


FOREGROUND_MIN_ROWS = 8  # softmax rows per sample from which the most frequent class is background


class UserMetric:
    """A user's fidelity function ``fn(reference, candidate) -> float``: both lists of output
    dicts (name → array), one per judged sample; 1.0 means as good as the original (NNCF's
    ``validate_fn``, but relative to the original's outputs, not to labels). Non-finite or
    non-numeric scores are an error naming the function."""

    def __init__(self, fn, name: str | None = None):
        if not callable(fn):
            raise TypeError(f"metric must be callable, not {type(fn).__name__}")
        self.fn, self.name = fn, name or getattr(fn, "__name__", "metric")

    def __call__(self, reference: list, candidate: list) -> float:
        from ..errors import UserError

        value = self.fn(reference, candidate)
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise UserError(f"metric {self.name} returned {type(value).__name__}, not a number") from None
        if not math.isfinite(value):
            raise UserError(f"metric {self.name} returned {value}")
        return value


def load_metric(text: str, where: str = "--metric") -> UserMetric:
    """``module:function`` (the module importable from the working folder) as a :class:`UserMetric`."""
    import importlib
    import sys

    from ..errors import UserError

    module_name, colon, function = str(text).partition(":")
    if not colon or not module_name.strip() or not function.strip():
        raise UserError(f"{where}: expected module:function, got {text!r}")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name.strip())
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module
        raise UserError(f"{where}: cannot import {module_name.strip()!r}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, function.strip(), None)
    if not callable(fn):
        raise UserError(f"{where}: {module_name.strip()} has no function {function.strip()!r}")
    return UserMetric(fn, f"{module_name.strip()}:{function.strip()}")


def _binding_text(target: Target, losses: dict, binding: dict) -> str:
    if target.metric == "none" or not binding:
        score = binding.get("cos") or binding.get("decision")
        return f"{score.view} cosine {score.cosine:.6f}" if score and score.cosine is not None else "no views"
    if target.metric in ("rel", "metric"):
        metric = target.metric
    elif target.metric == "top1":
        metric = "decision"
    else:
        metric = max(("cos", "decision"), key=lambda m: losses.get(m, -1.0))
    score = binding.get(metric)
    if score is None:
        return "no views"
    if metric == "metric":
        return f"{score.view} score {score.agreement:.4f}"
    if metric == "decision" and score.agreement is not None:
        return f"{score.view} agreement {score.agreement:.4f}"
    if metric == "rel":
        return f"{score.view} rel err {score.rel:.3g}"
    return f"{score.view} {cosine_text(score.cosine)}" if score.cosine is not None else score.view


def cosine_text(cos: float) -> str:
    """``cosine 0.987654``, or ``1−cos 3.2e-07`` where six decimals would print 1.000000."""
    return f"1−cos {1.0 - cos:.2g}" if cos > 0.999995 and cos < 1.0 else f"cosine {cos:.6f}"


def _part(view: View, views: Views, ref: np.ndarray, got: np.ndarray, runtime: dict | None):
    """The view's elements of one sample's output (flat), and its labels (or None); a masked
    view's (:attr:`.views.View.mask`) rows of the positions its mask marks, ``[positions, …]``."""
    ref, got = np.asarray(ref), np.asarray(got)
    if view.mask is not None:
        return (*_masked(ref, got, (runtime or {}).get(view.mask)), None)
    labels = views.labels(view.output, runtime) if runtime is not None and view.output in views._tails else None
    if labels is None or labels["branch"].shape != ref.shape:
        return ref, got, None
    if view.branch is None:
        return ref, got, labels
    mask = labels["branch"] == labels["kinds"].index(view.branch)
    return ref[mask], got[mask], {key: labels[key][mask] for key in ("row", "cls")}


def _masked(ref: np.ndarray, got: np.ndarray, mask) -> tuple:
    """``ref`` and ``got`` at the positions ``mask`` (``[batch, sequence]``) marks non-zero; both
    whole when the mask is missing, of another shape, or marks nothing."""
    if mask is None or ref.shape != got.shape or ref.ndim < 2 or np.shape(mask) != ref.shape[:2]:
        return ref, got
    keep = np.asarray(mask) != 0
    return (ref[keep], got[keep]) if keep.any() else (ref, got)


def reference_margins(views: Views, reference: list, runtime: list | None) -> dict:
    """View name → the original's margins (:mod:`.margins`) over the counted rows of each Softmax
    view, on ``reference`` (the original's outputs on other samples)."""
    pool = {}
    for view in views:
        view = _as_logits(view, reference)
        layout = ctc_layout([out.get(view.output) for out in reference]) if view.ctc else None
        if layout is not None:
            pool[view.name] = [string_margins(seq, seq, layout[1])[0] for out in reference
                               for seq in sequences(out[view.output], layout[0], _softmax_valued(view))]
            continue
        if view.kind != "probs":
            continue
        found = []
        for i, out in enumerate(reference):
            if view.output not in out:
                continue
            ref, _, labels = _part(view, views, out[view.output], out[view.output], runtime[i] if runtime else None)
            if ref.ndim == 0 and labels is None:
                continue
            rows, _ = _softmax_rows(view, ref, ref, labels)
            if rows is None:
                continue
            winners = np.argmax(rows, axis=1)
            counted = rows[_foreground(winners, winners)]
            found.append(margins_and_shifts(counted, counted, view.logits)[0])
        if found:
            pool[view.name] = np.concatenate(found)
    return pool


def _score(view: View, views: Views, reference: list, candidate: list, runtime: list | None,
           pool=None) -> ViewScore:
    """The view's score: by decoded strings where it reads as CTC (:mod:`.strings`), else by rows."""
    layout = ctc_layout([out.get(view.output) for out in reference]) if view.ctc else None
    if layout is not None:
        return _score_strings(view, reference, candidate, layout, pool if isinstance(pool, list) else [])
    view = _as_logits(view, reference)
    # a CTC pool of the fit samples, while the judged ones do not read as CTC, is no row pool
    return _score_rows(view, views, reference, candidate, runtime, None if isinstance(pool, list) else pool)


def _as_logits(view: View, reference: list) -> View:
    """A projection's ``values`` view (a CTC candidate, :mod:`.views`) as the ``probs`` view of raw
    logits where the original's outputs read as a classifier's (:func:`.margins.reads_as_logits`)."""
    if view.kind != "values" or not view.ctc or view.mask is not None:
        return view
    if not reads_as_logits([out.get(view.output) for out in reference]):
        return view
    return replace(view, kind="probs", axis=-1, logits=True, ctc=False)


def _score_rows(view: View, views: Views, reference: list, candidate: list, runtime: list | None,
                pool: np.ndarray | None) -> ViewScore:
    decides = view.kind in ("scores", "probs", "exact")
    score = ViewScore(view.name, view.kind, masked_by=view.mask if runtime and any(
        view.mask in r for r in runtime) else None)
    cosines, rels, hits, total = [], [], 0, 0
    per_sample_agreement, margins, shifts = [], [], []
    for i, (ref_out, got_out) in enumerate(zip(reference, candidate)):
        if view.output not in got_out:
            cosines.append(0.0), rels.append(math.inf), per_sample_agreement.append(0.0)
            continue
        ref, got, labels = _part(view, views, ref_out[view.output], got_out[view.output],
                                 runtime[i] if runtime else None)
        if ref.shape != got.shape:
            cosines.append(0.0), rels.append(math.inf), per_sample_agreement.append(0.0)
            total += 1
            continue
        if view.kind != "exact":
            cos, rel = _float_drift(ref, got)
            cosines.append(cos)
            rels.append(rel)
        if decides:
            agree, count, margin, shift = _decisions(view, ref, got, labels)
            hits, total = hits + agree, total + count
            per_sample_agreement.append(agree / count if count else 1.0)
            margins.append(margin), shifts.append(shift)
    if cosines:
        score.cosine, score.rel = min(cosines), max(rels)
        score.worst_sample = int(np.argmin(cosines))
    if decides:
        score.agreement = hits / total if total else 1.0
        margins, shifts = (np.concatenate(margins), np.concatenate(shifts)) if margins else (np.zeros(0),) * 2
        if view.kind == "probs" and margins.size:
            score.observed = score.agreement
            score.margin_shift, score.min_margin = max(float(shifts.max()), 0.0), float(margins.min())
            rated = np.concatenate([margins, pool]) if pool is not None and pool.size else margins
            score.agreement = min(score.agreement, estimated_agreement(rated, margins, shifts))
        if not cosines and per_sample_agreement:
            score.worst_sample = int(np.argmin(per_sample_agreement))
    return score


def _score_strings(view: View, reference: list, candidate: list, layout: tuple, pool: list) -> ViewScore:
    """A CTC view (:mod:`.strings`): cosine and relative error per sample as any float view,
    agreement over the sequences' decoded strings, bounded by the strings' margin estimate
    over the judged sequences and the fit samples' (``pool``)."""
    axis, blank = layout
    score, probs = ViewScore(view.name, "ctc"), _softmax_valued(view)
    cosines, rels, agree, total, strings, shifts = [], [], 0, 0, [], []
    for ref_out, got_out in zip(reference, candidate):
        ref, got = np.asarray(ref_out[view.output]), got_out.get(view.output)
        if got is None or np.shape(got) != ref.shape:
            cosines.append(0.0), rels.append(math.inf)
            total += ref.shape[axis]
            continue
        cos, rel = _float_drift(ref, np.asarray(got))
        cosines.append(cos), rels.append(rel)
        for ref_seq, got_seq in zip(sequences(ref, axis, probs), sequences(got, axis, probs)):
            same = decode(np.argmax(ref_seq, axis=1), blank) == decode(np.argmax(got_seq, axis=1), blank)
            agree, total = agree + int(same), total + 1
            margin, shift = string_margins(ref_seq, got_seq, blank)
            strings.append(margin), shifts.append(shift)
    score.cosine, score.rel = min(cosines), max(rels)
    score.worst_sample = int(np.argmin(cosines))
    score.observed = score.agreement = agree / total if total else 1.0
    shifts = np.concatenate(shifts) if shifts else np.zeros(0)
    margins = np.concatenate(strings) if strings else np.zeros(0)
    if shifts.size and margins.size:
        score.margin_shift, score.min_margin = max(float(shifts.max()), 0.0), float(margins.min())
        score.agreement = min(score.agreement, estimated_string_agreement(strings + list(pool), margins, shifts))
    return score


def _softmax_valued(view: View) -> bool:
    """Whether the view's values are probabilities (a Softmax's), not raw logits."""
    return view.kind == "probs" and not view.logits


def _float_drift(ref: np.ndarray, got: np.ndarray) -> tuple:
    a, b = np.ravel(ref), np.ravel(got)
    if np.array_equal(a, b):
        return 1.0, 0.0
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not (fa.all() and fb.all()):  # the masks only where something is not finite
        if not np.array_equal(fa, fb) or np.any(a[~fa] != b[~fb]):
            return 0.0, math.inf
        a, b = a[fa], b[fb]
    a = a.astype(np.float64, copy=False)
    b = b.astype(np.float64, copy=False)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    cos = 1.0 if na == 0 and nb == 0 else 0.0 if na == 0 or nb == 0 else float(np.dot(a, b) / (na * nb))
    scale = float(np.abs(a).max()) if a.size else 0.0
    diff = float(np.abs(a - b).max()) if a.size else 0.0
    rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
    return min(cos, 1.0), rel


def _decisions(view: View, ref: np.ndarray, got: np.ndarray, labels: dict | None) -> tuple:
    """(agreeing, counted, margins, shifts) of one sample's decisions; margins and shifts
    (:mod:`.margins`) of the counted softmax rows, empty for other kinds."""
    none = np.zeros(0)
    if view.kind == "exact":
        return int(np.sum(ref == got)), int(ref.size), none, none
    if view.kind == "scores":
        a, b = ref > SCORE_THRESHOLD, got > SCORE_THRESHOLD
        return int(np.sum(a & b)), int(np.sum(a | b)), none, none
    if ref.ndim == 0 and labels is None:
        return 1, 1, none, none
    ref_rows, got_rows = _softmax_rows(view, ref, got, labels)
    if ref_rows is None:  # rows of unequal length (a tail that mixes them): arg-max by labels only
        a, b = _row_winners(ref.ravel(), got.ravel(), labels["row"].ravel(), labels["cls"].ravel())
        keep = _foreground(a, b)
        return int(np.sum(a[keep] == b[keep])), int(keep.sum()), none, none
    a, b = np.argmax(ref_rows, axis=1), np.argmax(got_rows, axis=1)
    keep = _foreground(a, b)
    margin, shift = margins_and_shifts(ref_rows[keep], got_rows[keep], view.logits)
    return int(np.sum(a[keep] == b[keep])), int(keep.sum()), margin, shift


def _softmax_rows(view: View, ref: np.ndarray, got: np.ndarray, labels: dict | None) -> tuple:
    """The sample's softmax rows as ``[rows, classes]`` arrays (reference, candidate), or
    ``(None, None)`` when labelled rows differ in length."""
    if labels is None:
        axis = view.axis if view.axis is not None and view.mask is None else -1  # masked: [positions, classes]
        classes = ref.shape[axis]
        return (np.moveaxis(ref, axis, -1).reshape(-1, classes), np.moveaxis(got, axis, -1).reshape(-1, classes))
    rows, cls = labels["row"].ravel(), labels["cls"].ravel()
    order = np.lexsort((cls, rows))
    _, counts = np.unique(rows, return_counts=True)
    if counts.size == 0 or np.any(counts != counts[0]):
        return None, None
    shape = (counts.size, int(counts[0]))
    return ref.ravel()[order].reshape(shape), got.ravel()[order].reshape(shape)


def _foreground(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rows whose arg-max decisions count. With several softmax rows (a map, a sequence: at
    least :data:`FOREGROUND_MIN_ROWS`) the rows where both pick the reference's most frequent
    class — background, CTC blank — are not counted: 20 flipped face pixels of 85 hide at 0.9994
    among a face map's background pixels (MTCNN P-Net), a changed character among a line's blanks."""
    if a.size < FOREGROUND_MIN_ROWS:
        return np.ones(a.size, bool)
    values, counts = np.unique(a, return_counts=True)
    background = values[np.argmax(counts)]
    return (a != background) | (b != background)


def _row_winners(ref, got, rows, cls) -> tuple:
    def winners(values):
        order = np.lexsort((-values, rows))
        first = np.ones(order.size, bool)
        first[1:] = rows[order][1:] != rows[order][:-1]
        return cls[order][first]
    return winners(ref), winners(got)
