"""Intermediate tensors on real data: expose named tensors as extra graph outputs and run.

Used by data-driven passes (int8 calibration, prune importance and re-fit, data-aware SVD,
fp16 overflow search). Only main-graph tensors can be exposed; subgraph-local tensors are
not visible from outside their If/Loop body.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import onnx

from .runtime import add_outputs, give_back, make_session, run


def with_outputs(proto: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``proto`` whose graph also outputs ``names`` (types taken from value_info when known)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    add_outputs(out, names)
    return out


def iter_activations(
    proto: onnx.ModelProto,
    names: list,
    samples: Iterable[dict],
    opt_level: str = "disable",
    threads: int = 0,
) -> Iterator[dict]:
    """For each sample, ``{name: array}`` of the requested tensors (graph outputs included)."""
    # the outputs are added to the session's skeleton proto: no copy of the model's weights
    # no arena (it would keep the largest run's intermediates for the session's life), no
    # packed weight copies (a calibration session: see runtime's module docstring)
    session = make_session(proto, opt_level=opt_level, threads=threads, extra_outputs=names, arena=False,
                           prepack=False)
    wanted = set(names)
    for sample in samples:
        # no local keeps this sample's tensors: a consumer that drops (or clears) the dict it
        # got frees them before the next run allocates its own (halves the peak memory)
        yield {k: v for k, v in run(session, sample).items() if k in wanted}
        give_back()
    del session
    give_back()
