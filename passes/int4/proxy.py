"""The local proxy of the mixed-precision step of ``int4``: each layer's own output error.

For a layer ``Y = X·Wᵀ`` (``Wt`` [N, K]) and its int4 weight ``Ŵ``, on rows ``X`` [R, K] of its
input over the calibration samples,

    e = ‖X·(W − Ŵ)ᵀ‖² / ‖X·Wᵀ‖²                    (the relative output error of the layer alone)

Rows: one ONNX Runtime pass over the samples exposes every candidate's input (where the samples
stack along axis 0 and the stacked run reproduces the first sample's values bit for bit: two
runs, the first sample alone and all stacked, :func:`_activations`; a run reads every weight, so
issue 16's decoder took 4 runs of 2.75 GB before); each sample
gives ``⌈R / samples⌉`` rows of each input (seeded draw), ``R`` chosen so that all inputs' rows
together take ≤ :data:`ROWS_BYTES` (``R`` ∈ [:data:`MIN_ROWS`, :data:`MAX_ROWS`]). Cost: one
forward pass per sample plus ``2·R·N·K`` flops per layer, against one forward pass per sample
*per candidate* for the measured loss (:func:`.mixed.sensitivities`); the proxy decides the
clear cases and the measurement the few near the size budget's cut (:func:`.mixed.shortlist`).

Classes (:func:`role`): layers whose outputs reach the same op types within ``ROLE_DEPTH``
steps (the walk stops at other candidates) share one scale from proxy to measured loss.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.runtime import give_back

from onnxslim_kit.passes._common.blas import blas_threads

import onnxslim_kit.passes.int4.batched as _int4_batched

ROWS_BYTES = 128 << 20
MIN_ROWS, MAX_ROWS = 64, 256  # 2·R·N·K flops a layer: R = 620 took 5 s of CPU on a 279 MB decoder
ROLE_DEPTH = 6


def role(node, candidates: set, depth: int = ROLE_DEPTH) -> tuple:
    """The class key of a layer: its op, then per step downstream the sorted op types of the
    nodes reached (``*`` for a candidate layer, where the walk stops), ``depth`` steps."""
    key, frontier = [node.op], [node]
    for _ in range(depth):
        reached = {id(user): user for n in frontier for out in n.outputs for user in out.outputs}
        if not reached:
            break
        key.append(tuple(sorted({"*" if i in candidates else user.op for i, user in reached.items()})))
        frontier = [user for i, user in reached.items() if i not in candidates]
        if not frontier:
            break
    return tuple(key)


def rows_per_input(widths: dict) -> int:
    """Rows kept per input tensor: ``widths`` = {input name: K}."""
    total = sum(widths.values()) * 4
    return int(min(MAX_ROWS, max(MIN_ROWS, ROWS_BYTES // max(total, 1))))


def input_rows(model, widths: dict, samples: list, seed: int = 0, threads: int = 1) -> dict:
    """{input name: rows [≤ R, K] float32} of the layers' inputs over ``samples`` (one session,
    ``threads`` intra-op threads)."""
    rows_total = rows_per_input(widths)
    per_sample = -(-rows_total // max(len(samples), 1))
    graph_inputs = {t.name for t in model.graph.inputs}
    exposed = [n for n in widths if n not in graph_inputs]
    acts = _activations(model.to_proto(), exposed, samples, threads) if exposed else ({} for _ in samples)
    rng = np.random.default_rng(seed)
    gathered: dict = {name: [] for name in widths}
    for sample, values in zip(samples, acts):
        for name, k in widths.items():
            x = np.asarray(sample[name] if name in graph_inputs else values[name], dtype=np.float32).reshape(-1, k)
            pick = np.sort(rng.choice(len(x), per_sample, replace=False)) if len(x) > per_sample else slice(None)
            gathered[name].append(np.array(x[pick], dtype=np.float32))  # a copy: the run's tensors go
        values = None
    acts = None
    give_back()
    return {name: np.concatenate(parts)[:rows_total] if parts else np.zeros((0, widths[name]), np.float32)
            for name, parts in gathered.items()}


def _activations(proto, names: list, samples: list, threads: int):
    """Per sample, {name: its value} of the tensors ``names`` — from two runs when the samples
    stack along axis 0 (:func:`.batched.stack`): the first sample alone and all of them stacked;
    the stacked values are used when every tensor has the batch axis and the first sample's part
    equals its own run bit for bit (the kernels depend on the shapes, not on the values:
    :mod:`.batched`), else the samples run one by one (the first one's run reused)."""
    inputs = {i.name: i for i in proto.graph.input}
    feeds = [{k: v for k, v in s.items() if k in inputs} for s in samples]
    symbolic = {n for n, i in inputs.items() if _open_batch(i)}
    stacked, sizes = _int4_batched.stack(feeds, symbolic)
    if stacked is None:
        yield from iter_activations(proto, names, samples, threads=threads)
        return
    runs = iter_activations(proto, names, [feeds[0], stacked], threads=threads)
    first = next(runs)
    parts = _int4_batched.split(next(runs), sizes)
    runs = None
    if parts is not None and _int4_batched.same([first], parts[:1]):
        first = None
        while parts:
            yield parts.pop(0)
        return
    parts = None
    yield first
    yield from iter_activations(proto, names, samples[1:], threads=threads)


def _open_batch(value_info) -> bool:
    """Whether a graph input's first dim is left open (symbolic or unknown)."""
    dims = value_info.type.tensor_type.shape.dim
    return bool(dims) and not dims[0].HasField("dim_value")


def output_error(wt: np.ndarray, deq: np.ndarray, rows: np.ndarray, threads: int = 1) -> float:
    """``‖X·(W − Ŵ)ᵀ‖² / ‖X·Wᵀ‖²`` for ``wt``, ``deq`` [N, K] and ``rows`` X [R, K] (0 when X·Wᵀ = 0)."""
    if not len(rows):
        return 0.0
    with blas_threads(threads):
        y = rows @ wt.T
        err = rows @ (deq - wt).T
    ref = float(np.square(y, dtype=np.float64).sum())
    return float(np.square(err, dtype=np.float64).sum()) / ref if ref > 0 else 0.0
