"""The ``int8`` pass's option mini-languages, read before any pass runs (Option ``parse`` hooks).

* ``target``: the fidelity target (:mod:`onnxslim_kit.fidelity`: ``cos:V``, ``top1:V``,
  ``rel:V``, ``none``; ``cos:1`` / ``top1:1``: nothing may change; empty: the pipeline's
  ``--target`` share). The older int8 spellings still read: ``off`` and ``0`` as ``none``;
* ``ladder``: fallback rungs between static int8 and float, ``;``-separated, from int8 towards
  float, each in :data:`onnxslim_kit.passes._quant.qdq.RUNGS` (``none`` / ``float`` / empty
  ignored) → a list;
* ``rounding``: one of :data:`ROUNDINGS` — ``nearest`` (``round(W / s)``) or ``adaround``
  (learned up / down per weight, :mod:`onnxslim_kit.passes.int8.adaround`);
* ``include`` / ``exclude``: :class:`onnxslim_kit.selection.Selector` texts (their own hook).

The hooks :func:`check_target` and :func:`check_ladder` return the canonical *text* (so the
report and a replayed recipe hold it; the pipeline reads the target text itself,
:meth:`onnxslim_kit.fidelity.Fidelity.for_pass`); the pass reads the ladder again with
:func:`parse_ladder`, which cannot fail then.
"""

from __future__ import annotations

from onnxslim_kit.api import check_target as fidelity_check_target
from onnxslim_kit.errors import UserError

from onnxslim_kit.passes._quant.qdq import RUNGS

ROUNDINGS = ("nearest", "adaround")  # static weight codes (the ``rounding`` option's choices)

def check_target(text: str, where: str = "int8(target=...)") -> str:
    """Option hook: the target text in the fidelity syntax (:func:`onnxslim_kit.api.check_target`;
    empty stays empty: the pipeline's share), the older spellings mapped (module docstring)."""
    return fidelity_check_target(str(text or "").strip(), where)


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
