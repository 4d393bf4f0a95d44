"""What a lossy pass is held to (``ctx.fidelity``), and the held-out split of the data.

The split. Without ``--eval`` the calibration samples are split deterministically: the feed (in
its order) is cut into blocks of ``HOLD_OUT_EVERY`` (4) and one sample of each block is *held
out* (of a last, partial block only when the position falls in it), at a position drawn for
that block from a fixed-seed generator (``Generator(PCG64((HOLD_OUT_SEED, b))).integers(4)``);
the passes fit on the others and are judged — their target searched, their drift reported —
on the held-out ones. A fixed position (the 4th of each block, as before) met every periodic
feed at the same phase: a classifier's samples alternating upright / rotated, or four
orientations in turn, were judged on one class only (ppocr_cls_v2's held-out samples were all
rotated ones; the plan kept a prune that held 1−cos 7e-9 there and 0.92 on the other class).
The drawn positions break any period, while each block, so each stretch of a class-sorted
feed, still gives one in four. :func:`held_out_of` lists them. Fewer than ``HOLD_OUT_EVERY``
samples cannot be split: they fit and judge, and the report says so. Under
``MIN_JUDGE_SAMPLES`` judged samples the report
warns that a decision agreement of 0.99 cannot be told from 1.

:class:`Fidelity` carries the target (:mod:`.target`), the fraction of its budget this pass
may reach (``allowed``), the output views (:mod:`.views`), the judged samples and the
original's outputs on them (computed once, shared by the verifier and every pass). A pass asks
``ctx.fidelity.judge(outputs)`` (outputs of its candidate on ``ctx.fidelity.samples``) and
``ctx.fidelity.met(verdict)``. The original's Softmax margins on the fit samples join the
margin estimate of decision agreement (:attr:`Fidelity.margin_pool`, :mod:`.margins`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np
import onnx

from .judge import Verdict, judge, reference_margins
from .target import Target, share
from .views import Views, find_views

HOLD_OUT_EVERY = 4
HOLD_OUT_SEED = 20261203
MIN_JUDGE_SAMPLES = 8
MAX_JUDGE_SAMPLES = 32
MAX_POOL_SAMPLES = 96  # fit samples whose original margins join the estimate's pool


class FeedPart:
    """The samples of ``feed`` whose index ``keep`` accepts; every other attribute (specs,
    ``generated``, input shapes …) is the feed's own."""

    def __init__(self, feed, keep):
        self._feed, self._keep = feed, keep

    def __iter__(self):
        return (sample for i, sample in enumerate(self._feed) if self._keep(i))

    def take(self, n: int) -> list:
        from ..calibration import take

        return take(self, n)

    def count(self) -> int:
        return sum(1 for _ in self)

    def __getattr__(self, name):
        return getattr(self._feed, name)


@lru_cache(maxsize=4096)
def _position(block: int) -> int:
    """The held-out position in block ``block``: the same on every machine and numpy version
    (PCG64's stream is fixed by its seed)."""
    return int(np.random.Generator(np.random.PCG64((HOLD_OUT_SEED, block))).integers(HOLD_OUT_EVERY))


def held_out(i: int) -> bool:
    """Whether sample ``i`` of the feed is held out: one per block of ``HOLD_OUT_EVERY``."""
    return i % HOLD_OUT_EVERY == _position(i // HOLD_OUT_EVERY)


def held_out_of(samples) -> list:
    """The samples of a list (or feed) that the split holds out, in order."""
    return [sample for i, sample in enumerate(samples) if held_out(i)]


def split_feed(feed, eval_feed=None) -> tuple:
    """``(fit feed, judged samples, description, warning or None)``."""
    if eval_feed is not None:
        samples = eval_feed.take(MAX_JUDGE_SAMPLES)
        return feed, samples, "held-out evaluation samples", _few(len(samples))
    if getattr(feed, "generated", False):
        samples = feed.take(MAX_JUDGE_SAMPLES)
        return feed, samples, "generated random samples", None
    total = feed.count()
    if total < HOLD_OUT_EVERY:
        samples = feed.take(MAX_JUDGE_SAMPLES)
        warning = (f"{total} calibration sample(s) cannot be split: the lossy passes are judged on the samples "
                   f"they fit; give more (≥ {HOLD_OUT_EVERY * MIN_JUDGE_SAMPLES} to hold out "
                   f"{MIN_JUDGE_SAMPLES}) or --eval")
        return feed, samples, "calibration samples", warning
    judged = FeedPart(feed, held_out).take(MAX_JUDGE_SAMPLES)
    fit = FeedPart(feed, lambda i: not held_out(i))
    what = (f"held-out calibration samples (one in each {HOLD_OUT_EVERY}, at seeded positions; {len(judged)} of "
            f"{total}; the passes fit the rest)")
    return fit, judged, what, _few(len(judged))


def _few(n: int) -> str | None:
    if n >= MIN_JUDGE_SAMPLES:
        return None
    return (f"only {n} held-out sample(s) judge the lossy passes (< {MIN_JUDGE_SAMPLES}): a decision "
            f"agreement near the target cannot be told from 1; give more --calib or --eval samples")


@dataclass
class Fidelity:
    """The target a pass holds, on which views and samples; see the module docstring."""

    original: onnx.ModelProto | None
    target: Target
    views: Views
    samples: list
    judged_on: str = ""
    allowed: float = 1.0
    own_target: bool = False  # the pass's own target= (allowed = all of it)
    metric: object = None  # a judge.UserMetric binding a metric:V target
    _reference: list | None = field(default=None, repr=False)
    _runtime: list | None = field(default=None, repr=False)
    pool_feed: object = field(default=None, repr=False)  # the fit samples: the margin pool's source
    _pool: dict | None = field(default=None, repr=False)

    @classmethod
    def build(cls, original, target, samples: list, judged_on: str = "", reference=None, runtime=None,
              metric=None, pool_feed=None) -> Fidelity:
        target = Target.parse(target)
        if (target.metric == "metric") != (metric is not None) and target.metric != "none":
            from ..errors import UserError

            raise UserError("a metric:V target needs --metric module:function (optimize(metric=...)), and "
                            "--metric needs a metric:V target (default metric:0.99)")
        return cls(original, target, find_views(original), samples, judged_on, metric=metric,
                   _reference=reference, _runtime=runtime, pool_feed=pool_feed)

    @property
    def reference(self) -> list:
        """The original's outputs on :attr:`samples` (computed at the first use)."""
        if self._reference is None:
            self._reference, self._runtime = reference_outputs(self.original, self.samples, self.views)
        return self._reference

    @property
    def runtime(self) -> list | None:
        self.reference  # noqa: B018 - computes both
        return self._runtime

    @property
    def margin_pool(self) -> dict:
        """The original's Softmax margins on up to :data:`MAX_POOL_SAMPLES` fit samples, per view
        (:func:`.judge.reference_margins`; computed at the first use, only with a Softmax or CTC view):
        the margins of samples the pass fits do not depend on it, and a near tie among them is a
        decision the held-out ones may not show."""
        if self._pool is None:
            self._pool = {}
            if self.pool_feed is not None and self.original is not None and any(
                    v.kind == "probs" or v.ctc for v in self.views):
                samples = self.pool_feed.take(MAX_POOL_SAMPLES)
                if samples:
                    reference, runtime = reference_outputs(self.original, samples, self.views)
                    self._pool = reference_margins(self.views, reference, runtime)
        return self._pool

    def judge(self, outputs: list, reference: list | None = None, runtime: list | None = None) -> Verdict:
        """``outputs``: the candidate's, one dict per sample of :attr:`samples` (or of the
        samples ``reference`` was computed on, with their ``runtime`` tensors)."""
        if reference is None:
            reference, runtime = self.reference, self.runtime
        return judge(self.views, reference, outputs, self.target, runtime, self.metric, self.margin_pool)

    def met(self, verdict: Verdict) -> bool:
        return verdict.met(self.allowed)

    def for_pass(self, override: str = "", remaining: int = 1, used: float = 0.0) -> Fidelity:
        """This pipeline's fidelity for one lossy pass: its own ``target=`` when given (all of
        it), else the pipeline target's share (:func:`.target.share`). The margin pool is made
        here, once, so that every pass's copy shares it."""
        self.margin_pool  # noqa: B018 - computed on the pipeline's fidelity, not once per pass
        if str(override or "").strip():
            return replace(self, target=Target.parse(override), allowed=1.0, own_target=True)
        return replace(self, allowed=share(used, remaining), own_target=False)

    def widened(self, extra: list, what: str) -> Fidelity:
        """This fidelity judged on :attr:`samples` and ``extra`` too (the original's outputs on
        ``extra`` computed here, once): more samples for a pass's own search to be held to, so
        that what it keeps is not chosen by a tail the judged samples happen to miss. ``what``
        names the extra samples in :attr:`judged_on`."""
        if not extra or self.original is None:
            return self
        reference, runtime = reference_outputs(self.original, extra, self.views)
        both = None if self.runtime is None else self.runtime + runtime
        judged_on = f"samples: {len(self.samples)} {self.judged_on or 'samples'} and {len(extra)} {what}"
        return replace(self, samples=self.samples + list(extra), _reference=self.reference + reference,
                       _runtime=both, judged_on=judged_on)

    def describe(self) -> str:
        if self.target.metric == "none":
            return "target none"
        what = f"target {self.target}" if self.own_target or self.allowed >= 1.0 else (
            f"{self.allowed:.0%} of the {self.target} budget")
        return f"{what} on {len(self.samples)} {self.judged_on or 'samples'}"


def reference_outputs(original, samples: list, views: Views) -> tuple:
    """The original's outputs on ``samples`` and, when a view needs them, the tail tensors."""
    from ..runtime import give_back, make_session, run

    extra = views.runtime_tensors
    outputs = {o.name for o in original.graph.output}
    session = make_session(original, extra_outputs=[n for n in extra if n not in outputs] or None, arena=False,
                           prepack=False)
    try:
        results = [run(session, sample) for sample in samples]
    finally:
        del session
        give_back()
    reference = [{k: v for k, v in r.items() if k in outputs} for r in results]
    runtime = [{k: v for k, v in r.items() if k in extra} for r in results] if extra else None
    return reference, runtime


def pass_fidelity(ctx, fallback_samples: int = 8) -> Fidelity:
    """``ctx.fidelity``, or — for a pass run outside the pipeline (a test's own PassContext) —
    one built from the pass's ``target`` option (default ``cos:0.99``), judged on the first
    ``fallback_samples`` samples of ``ctx.feed``."""
    if getattr(ctx, "fidelity", None) is not None:
        return ctx.fidelity
    from .target import DEFAULT

    text = str((ctx.options or {}).get("target") or "").strip() or DEFAULT
    return Fidelity.build(ctx.original, text, ctx.feed.take(fallback_samples), "calibration samples")
