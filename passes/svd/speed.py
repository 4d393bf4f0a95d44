"""Is the factorised layer faster in ONNX Runtime? Measured for small shapes, FLOPs for large.

FLOPs of ``Y = X W`` with ``rows`` rows, ``W``: ``k × n``, rank ``r`` (a Conv's ``k`` is
``C·kh·kw`` and its rows are the output positions):

    before = 2 · rows · k · n          after = 2 · rows · r · (k + n)

A layer is factorised only if it is expected to get at least 5 % faster (``MAX_RATIO``).
Large layers (``rows·k·n ≥ MEASURE_BELOW_MACS``) run compute-bound GEMMs on CPU, where time
follows FLOPs, so ``after < MAX_RATIO · before`` decides. Small layers are dominated by
per-node overhead and memory traffic, where a second node can cost more than the FLOPs it
saves; for those the
one-node and two-node versions are built as tiny models with random weights of the real
shapes and timed in ORT (1 thread, all graph optimisations, interleaved rounds —
:func:`onnxslim_kit.bench.timed_rounds`); the layer is factorised only when the median paired
ratio ``t_after / t_before`` is below ``MAX_RATIO``. Results are cached per shape.
"""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxslim_kit.bench import paired_ratio, timed_rounds
from onnxslim_kit.runtime import make_session

MEASURE_BELOW_MACS = 1 << 24
MAX_RATIO = 0.95
ROUNDS, WARMUP, TARGET_SECONDS = 15, 3, 0.002


def flops(rows: int, k: int, n: int, r: int | None = None) -> int:
    return 2 * rows * (k * n if r is None else r * (k + n))


def _model(nodes, x_shape, weights) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(v, name) for name, v in weights.items()]
    graph = helper.make_graph(
        nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _pair(kind: str, x_shape: tuple, w_shape: tuple, r: int, attrs: tuple) -> tuple:
    rng = np.random.default_rng(0)
    rand = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    if kind == "separable":  # attrs: (vertical, horizontal) attribute items
        n, c, kh, kw = w_shape
        first, second = ({k: list(v) for k, v in part} for part in attrs)
        before_attrs = {"kernel_shape": [kh, kw], "strides": [first["strides"][0], second["strides"][1]],
                        "dilations": [first["dilations"][0], second["dilations"][1]],
                        "pads": [first["pads"][0], second["pads"][1], first["pads"][2], second["pads"][3]]}
        before = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **before_attrs)], x_shape,
                        {"w": rand(*w_shape), "b": rand(n)})
        after = _model([helper.make_node("Conv", ["x", "a"], ["m"], **first),
                        helper.make_node("Conv", ["m", "bw", "b"], ["y"], **second)], x_shape,
                       {"a": rand(r, c, kh, 1), "bw": rand(n, r, 1, kw), "b": rand(n)})
    elif kind == "conv":
        n, c = w_shape[:2]
        ones = (1,) * (len(w_shape) - 2)
        before = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **dict(attrs))], x_shape,
                        {"w": rand(*w_shape), "b": rand(n)})
        after = _model([helper.make_node("Conv", ["x", "a"], ["m"], **dict(attrs)),
                        helper.make_node("Conv", ["m", "bw", "b"], ["y"])], x_shape,
                       {"a": rand(r, c, *w_shape[2:]), "bw": rand(n, r, *ones), "b": rand(n)})
    else:
        k, n = w_shape
        before = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], x_shape, {"w": rand(k, n)})
        after = _model([helper.make_node("MatMul", ["x", "a"], ["m"]), helper.make_node("MatMul", ["m", "bw"], ["y"])],
                       x_shape, {"a": rand(k, r), "bw": rand(r, n)})
    return before, after, {"x": rand(*x_shape)}


@lru_cache(maxsize=256)
def measured_ratio(kind: str, x_shape: tuple, w_shape: tuple, r: int, attrs: tuple = ()) -> float:
    """Median of ``t_factorised / t_original`` over interleaved rounds (1-thread ORT)."""
    before, after, feed = _pair(kind, x_shape, w_shape, r, attrs)
    sessions = [make_session(m, opt_level="all", threads=1) for m in (before, after)]
    start = time.perf_counter()
    sessions[0].run(None, feed)
    repeat = int(min(max(TARGET_SECONDS / max(time.perf_counter() - start, 1e-6), 1), 200))

    def runner(session):
        def go(_round):
            for _ in range(repeat):
                session.run(None, feed)
        return go

    times = timed_rounds([runner(s) for s in sessions], ROUNDS, WARMUP)
    ratio, _spread = paired_ratio(times[1], times[0])
    return float(ratio)


def decide(kind: str, x_shape: tuple, w_shape: tuple, rows: int, k: int, n: int, r: int,
           attrs: tuple = (), measure: bool = True, after: int | None = None) -> tuple:
    """``(faster?, how we know)`` for factorising this layer at rank ``r`` (``after``: the
    factorised FLOPs when they are not ``flops(rows, k, n, r)``, e.g. a separable Conv;
    ``kind``: matmul, conv or separable)."""
    if (flops(rows, k, n, r) if after is None else after) >= MAX_RATIO * flops(rows, k, n):
        return False, f"saves < {1 - MAX_RATIO:.0%} of the FLOPs"
    if not measure or rows * k * n >= MEASURE_BELOW_MACS:
        return True, "FLOPs"
    ratio = measured_ratio(kind, tuple(x_shape), tuple(w_shape), r, attrs)
    return ratio < MAX_RATIO, f"measured {ratio:.2f}×"
