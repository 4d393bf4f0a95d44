"""Intermediate tensors on real data: expose named tensors as extra graph outputs and run.

Used by data-driven passes (int8 calibration, prune importance and re-fit, data-aware SVD,
fp16 overflow search). Only main-graph tensors can be exposed; subgraph-local tensors are
not visible from outside their If/Loop body.

``absmax=True`` (a range observation, fp16's): each observed tensor ``x`` gets
``m = ReduceMax(Abs(x), keepdims=0)`` and ``z = ReduceSum(Sub(x, x), keepdims=0)`` (no axes: over
every element; any ai.onnx opset) and only ``m`` and ``z`` are outputs — two scalars per tensor
instead of the tensor, so ORT frees ``x`` as soon as its readers ran instead of holding every
observed tensor until the run ends. The value returned, a Python float (exact: float64 holds
every float16/float32 value), is

1. ``max_i |x_i|`` when every ``x_i`` is finite (``z = 0``) or some is ±∞ (``m = ∞``: ∞);
2. NaN when ``x`` holds a NaN — ReduceMax alone may skip one (ORT 1.32: ``[nan, 1] → nan`` but
   ``[1, nan] → 1``); ``x − x`` is NaN exactly where ``x`` is NaN or ±∞, so ``z`` is NaN with
   ``m`` finite only when a NaN is there (with a ±∞ too, ∞ is returned);
3. 0.0 for an empty ``x`` (ReduceMax of nothing is −∞; ``|x| ≥ 0``).

Float and 32/64-bit integer tensors only (ORT has no Abs for bool or strings, no ReduceSum
for 8-bit integers).
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator

import onnx

from .runtime import add_outputs, give_back, make_session, run


def with_outputs(proto: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``proto`` whose graph also outputs ``names`` (types taken from value_info when known)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    add_outputs(out, names)
    return out


def absmax_nodes(proto: onnx.ModelProto, names: list) -> tuple:
    """``(nodes, outputs)``: the nodes observing ``names`` (module docstring) and ``{name: (m, z)}``
    their two output tensors; the new names collide with none of ``proto``'s main graph."""
    graph = proto.graph
    taken = {t for node in graph.node for t in list(node.input) + list(node.output)}
    taken.update(v.name for v in list(graph.input) + list(graph.output) + list(graph.initializer))
    nodes, outputs = [], {}
    for index, name in enumerate(dict.fromkeys(names)):
        base, suffix = f"{name}::absmax", 0
        while any(f"{base}{suffix or ''}{part}" in taken for part in ("", ".abs", ".z", ".zero")):
            suffix += 1
        base = f"{base}{suffix or ''}"
        taken.update(base + part for part in ("", ".abs", ".z", ".zero"))
        make = onnx.helper.make_node
        nodes += [make("Abs", [name], [base + ".abs"], name=f"slim_absmax_abs_{index}"),
                  make("ReduceMax", [base + ".abs"], [base], name=f"slim_absmax_max_{index}", keepdims=0),
                  make("Sub", [name, name], [base + ".zero"], name=f"slim_absmax_sub_{index}"),
                  make("ReduceSum", [base + ".zero"], [base + ".z"], name=f"slim_absmax_sum_{index}", keepdims=0)]
        outputs[name] = (base, base + ".z")
    return nodes, outputs


def _absmax(m, z) -> float:
    m, z = float(m), float(z)
    if m == -math.inf:
        return 0.0
    return math.nan if math.isnan(z) and m != math.inf else m


def iter_activations(
    proto: onnx.ModelProto,
    names: list,
    samples: Iterable[dict],
    opt_level: str = "disable",
    threads: int = 0,
    absmax: bool = False,
    arrays: dict | None = None,
) -> Iterator[dict]:
    """For each sample, ``{name: array}`` of the requested tensors (graph outputs included);
    with ``absmax``, ``{name: max|x|}`` as floats (module docstring). ``arrays``: the values of
    ``proto``'s in-memory stubs (:meth:`.model.Model.session_proto`, see :func:`.runtime.make_session`)."""
    # the outputs are added to the session's skeleton proto: no copy of the model's weights
    # no arena (it would keep the largest run's intermediates for the session's life), no
    # packed weight copies (a calibration session: see runtime's module docstring)
    nodes, observed = absmax_nodes(proto, names) if absmax else (None, {n: (n,) for n in names})
    session = make_session(proto, opt_level=opt_level, threads=threads, arena=False, prepack=False,
                           extra_outputs=[t for pair in observed.values() for t in pair], extra_nodes=nodes,
                           arrays=arrays)
    for sample in samples:
        # no local keeps this sample's tensors: a consumer that drops (or clears) the dict it
        # got frees them before the next run allocates its own (halves the peak memory)
        if absmax:
            values = run(session, sample)
            yield {name: _absmax(values[m], values[z]) for name, (m, z) in observed.items()}
            del values
        else:
            yield {k: v for k, v in run(session, sample).items() if k in observed}
        give_back()
    del session
    give_back()
