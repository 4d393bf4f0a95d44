"""The fidelity target: one syntax for the pipeline and every lossy pass, and its budget.

Syntax (``--target``, ``optimize(target=...)``, a lossy pass's ``target=`` override)::

    cos:V    every view's worst-sample cosine ≥ V, every decision view's agreement ≥ V
    top1:V   every decision view's agreement ≥ V (the float views are reported, not bound)
    rel:V    every float view's worst relative error max|y − ŷ| / max|y| ≤ V
    metric:V the user's metric (``--metric module:function``) scores ≥ V (1: the original's outputs)
    none     anything goes (the drift is still reported)

A bare number (``0.995``) reads as ``cos:0.995``: the older ``cluster(target=0.995)`` and
``svd(target=0.99)`` keep working; ``off`` and a bare ``0`` (the passes' older "no search")
read as ``none``.

The budget. A target leaves a loss budget; a measured model uses the fraction

    u = max over the bound views v of  loss_v / budget,

    cos:V:  loss = 1 − worst cosine (decision views: 1 − agreement),  budget = 1 − V
    top1:V: loss = 1 − agreement,                                     budget = 1 − V
    rel:V:  loss = worst relative error,                              budget = V
    metric:V: loss = 1 − the user metric's score,                     budget = 1 − V

so the target holds iff u ≤ 1. In ``fuse,prune,int8`` the pipeline hands each lossy pass a
share of what the passes before it left: the i-th of n lossy passes (0-based) may take the
model, judged against the original, to

    allowed_i = used + (1 − used) / (n − i)          (used: u of the model it was given)

so the last one may spend everything left and the pipeline ends at the target, not each pass
at it. A pass given its own ``target=`` holds that one instead (allowed = 1 of it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UserError

METRICS = ("cos", "top1", "rel", "metric")
SYNTAX = "cos:V, top1:V, rel:V, metric:V (with --metric) or none (cos:0.99: every output view's cosine ≥ 0.99)"
DEFAULT = "cos:0.99"
OFF = ("none", "off")  # and a bare number equal to 0


@dataclass(frozen=True)
class Target:
    """A parsed target; ``metric`` is ``cos``, ``top1``, ``rel`` or ``none``."""

    metric: str
    value: float = 0.0

    @classmethod
    def parse(cls, text, where: str = "--target") -> Target:
        if isinstance(text, Target):
            return text
        raw = str(text).strip()
        if _is_off(raw):
            return cls("none")
        metric, colon, number = raw.partition(":")
        if not colon:  # a bare number: the older float targets (cosine)
            metric, number = "cos", raw
        metric = metric.strip().lower()
        if metric not in METRICS:
            raise UserError(f"{where}: unknown target {raw!r}; expected {SYNTAX}")
        try:
            value = float(number)
        except ValueError:
            raise UserError(f"{where}: {raw!r}: {number.strip()!r} is not a number; expected {SYNTAX}") from None
        if not math.isfinite(value):
            raise UserError(f"{where}: {raw!r}: the value must be finite")
        if metric == "rel" and not value > 0:
            raise UserError(f"{where}: {raw!r}: a relative error target must be > 0")
        if metric != "rel" and not 0 < value <= 1:
            raise UserError(f"{where}: {raw!r}: a {metric} target must lie in (0, 1]")
        return cls(metric, value)

    def __str__(self) -> str:
        return "none" if self.metric == "none" else f"{self.metric}:{self.value:.12g}"

    @property
    def budget(self) -> float:
        """The loss the target allows (0 for ``none``: it is never spent)."""
        if self.metric == "none":
            return 0.0
        return self.value if self.metric == "rel" else 1.0 - self.value

    def used(self, losses: dict) -> float:
        """The budget fraction ``u`` for ``losses`` (metric → worst loss over the views it binds:
        ``cos`` (1 − cosine), ``decision`` (1 − agreement), ``rel``); 0 for ``none``."""
        if self.metric == "none":
            return 0.0
        if self.metric == "cos":
            loss = max(losses.get("cos", 0.0), losses.get("decision", 0.0))
        elif self.metric == "top1":
            loss = losses.get("decision", 0.0)
        elif self.metric == "metric":
            loss = losses.get("metric", 0.0)
        else:
            loss = losses.get("rel", 0.0)
        if not math.isfinite(loss):
            return math.inf
        if self.budget <= 0:  # cos:1 / top1:1: nothing may change
            return 0.0 if loss <= 0 else math.inf
        return max(loss, 0.0) / self.budget


def _is_off(raw: str) -> bool:
    if raw.lower() in OFF:
        return True
    try:
        return float(raw) == 0
    except ValueError:
        return False


def check_target(text: str, where: str) -> str:
    """A pass option's parse hook: the text validated before any pass runs, kept as written
    (empty: the pipeline's share), ``none`` for every spelling of it."""
    if not str(text or "").strip():
        return text
    return "none" if Target.parse(text, where).metric == "none" else text


def share(used: float, remaining: int) -> float:
    """``allowed`` for a lossy pass with ``remaining`` lossy passes (itself included) left,
    given the model's ``used`` fraction: an equal share of what is left, the last takes all."""
    used = max(0.0, used)
    if used >= 1.0:
        return used  # spent already: the pass may not make it worse
    return used + (1.0 - used) / max(1, remaining)
