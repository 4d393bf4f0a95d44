"""The ``int8`` pass's option mini-languages, read before any pass runs (Option ``parse`` hooks).

* ``target``: ``METRIC:VALUE`` with ``METRIC ∈ {cos, top1}`` and ``0 < VALUE ≤ 1`` (the
  fidelity target against the original; ``none`` / ``off`` / empty: no target) →
  ``(metric, value)`` or None;
* ``ladder``: fallback rungs between static int8 and float, ``;``-separated, from int8 towards
  float, each in :data:`onnxslim_kit.passes._quant.qdq.RUNGS` (``none`` / ``float`` / empty
  ignored) → a list;
* ``include`` / ``exclude``: :class:`onnxslim_kit.selection.Selector` texts (their own hook).

The hooks :func:`check_target` and :func:`check_ladder` return the canonical *text* (so the
report and a replayed recipe hold what the user wrote); the pass reads it again with
:func:`parse_target` / :func:`parse_ladder`, which cannot fail then.
"""

from __future__ import annotations

from onnxslim_kit.errors import UserError

from onnxslim_kit.passes._quant.qdq import RUNGS

METRICS = ("cos", "top1")
OFF = ("", "none", "off")


def parse_target(text: str, where: str = "int8(target=...)"):
    """``"cos:0.99"`` → ("cos", 0.99); empty / ``none`` / ``off`` → None."""
    text = (text or "").strip()
    if text in OFF:
        return None
    metric, _, value = text.partition(":")
    try:
        number = float(value)
    except ValueError:
        number = None
    if metric not in METRICS or number is None or not 0 < number <= 1:
        raise UserError(f"{where}: {text!r}: expected cos:VALUE or top1:VALUE with 0 < VALUE ≤ 1, or none")
    return metric, number


def check_target(text: str, where: str = "int8(target=...)") -> str:
    """Option hook: the stripped text, once :func:`parse_target` reads it."""
    parse_target(text, where)
    return text.strip()


def parse_ladder(text: str, where: str = "int8(ladder=...)") -> list:
    """``"dynamic;weights"`` → ["dynamic", "weights"]; ``none`` / empty → []."""
    rungs = [r.strip() for r in (text or "").split(";") if r.strip() not in ("", "none", "float")]
    bad = [r for r in rungs if r not in RUNGS]
    if bad:
        raise UserError(f"{where}: unknown rung {bad[0]!r} in {text!r}; use {', '.join(RUNGS)} or none, ';'-separated")
    return rungs


def check_ladder(text: str, where: str = "int8(ladder=...)") -> str:
    """Option hook: the stripped text, once :func:`parse_ladder` reads it."""
    parse_ladder(text, where)
    return text.strip()
