"""Where the plan's work runs: in this process (``local``) or as Ray tasks (``ray``).

An executor does the plan's two kinds of work; the plan (:mod:`onnxslim_kit.plan`) does the
rest (duplicates, cache look-ups, the choice) the same way for both, so with the same inputs and
timing cache both executors choose the same candidate and write the same bytes:

1. ``candidates(model, pipelines, settings, budget_s, progress, log)``: run every pipeline
   through :func:`onnxslim_kit.optimize` (its fidelity judgement is inside its report); returns
   ``(candidates in the order of pipelines, whether the budget stopped the search)``;
2. ``bench(model, protos, names, samples, machine, timing)``: one interleaved benchmark of the
   original and ``protos`` (:func:`onnxslim_kit.bench.benchmark`); returns its rows.

``local`` (:mod:`.local`) runs the pipelines one after the other in this process, and the
benchmark here.
``ray`` (:mod:`.ray_executor`) runs each pipeline as a Ray task and the benchmark as one task on
this machine's node; Ray is imported only then, and without it ``--executor ray`` is a one-line
error naming the extra to install.
"""

from __future__ import annotations

from ..errors import UserError

EXECUTORS = ("local", "ray")
INSTALL = "pip install onnxslim_kit[ray]"


def make_executor(name: str, address: str | None = None):
    """The executor called ``name``; ``ray`` imports Ray here (a one-line error without it).
    ``address``: an existing Ray cluster (``HOST:6379``); None starts a local one."""
    import importlib

    if name not in EXECUTORS:
        raise UserError(f"--executor {name!r}: one of {', '.join(EXECUTORS)}")
    if name == "local":
        if address is not None:
            raise UserError("--ray-address is for --executor ray")
        from .local import LocalExecutor

        return LocalExecutor()
    try:
        ray = importlib.import_module("ray")
    except ImportError:
        raise UserError(f"--executor ray: Ray is not installed; {INSTALL}") from None
    from .ray_executor import RayExecutor

    return RayExecutor(ray, address)
