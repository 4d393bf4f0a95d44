"""Does int8 pay off? The speed check of the ``int8`` pass.

Static int8 is only worth its accuracy cost when ONNX Runtime runs the result faster. On
small MobileNetV3-style nets it often does not: QLinearConv saves little on 1×1 / depthwise
convolutions of few channels, while every HardSwish, SE block (global pool, Mul) and other
op without an integer kernel sits between a DequantizeLinear and a QuantizeLinear that ORT
must run as separate float round trips. Measured: PP-OCR's cls_v2 ran 1.4× *slower* in int8.

The check times the float model (after any exact rewrite such as SmoothQuant) and the int8
candidate the way users deploy them — ORT CPU, graph optimizations on (the QDQ → QLinear
fusion happens there), 1 intra-op thread — interleaved round by round on the first sample,
and takes the median of the per-round ratios::

    ratio = median_r  t_int8(r) / t_float(r)

where ``t(r)`` is the fastest of a few runs in round ``r`` (about :data:`ROUND_S` of runs, at
most :data:`MAX_REPS`): on a loaded machine a run that another process preempts only gets
slower, so the fastest of a few is the kernel's time (single runs gave spreads of 0.04–48
at load 11 on 2 cores). Int8 is kept when ``ratio ≤ margin`` (default 1: not slower than float). Otherwise the
pass keeps the model float and says so (``int8 would be 1.40× the float latency here: kept
float; pass speed=off to force``). Rounds: at least 3, at most ``runs``, stopping
once ``budget`` seconds (1.5) are spent (a detector at 0.1 s a run gets ~7 rounds).

This is ``speed=model``, and the last step of ``speed=layers``
(:mod:`onnxslim_kit.passes.int8.layer_speed`), whose per-layer timings cannot see what joins
the layers (a Q/DQ pair costs a pass over the tensor where an int8 layer meets a float one);
there the ratio is cached under both models' sha256. ``speed=off`` leaves the choice to users
who want the size or will run the model on hardware with better int8 kernels.
"""

from __future__ import annotations

import time

import numpy as np

from onnxslim_kit.runtime import make_session, run

ROUND_S, MAX_REPS = 0.01, 10  # a round times each model ≈ ROUND_S (at most MAX_REPS runs), keeping the fastest


def latency_ratio(candidate, reference, sample: dict, runs: int = 15, budget: float = 1.5) -> tuple:
    """(median ratio candidate / reference, [min, max] of the per-round ratios, rounds)."""
    sessions = [make_session(p, "all", threads=1) for p in (reference, candidate)]
    for session in sessions:  # warm-up: first runs allocate
        run(session, sample)
    t0 = time.perf_counter()
    run(sessions[0], sample)
    reps = int(min(MAX_REPS, max(1, ROUND_S / max(time.perf_counter() - t0, 1e-9))))
    ratios = []
    start = time.perf_counter()
    for r in range(max(3, runs)):
        times = [0.0, 0.0]
        for m in (r % 2, 1 - r % 2):  # alternate which model goes first
            times[m] = min(_timed(sessions[m], sample) for _ in range(reps))
        ratios.append(times[1] / max(times[0], 1e-9))
        if r >= 2 and time.perf_counter() - start > budget:
            break
    return float(np.median(ratios)), [float(min(ratios)), float(max(ratios))], len(ratios)


def _timed(session, sample: dict) -> float:
    t0 = time.perf_counter()
    run(session, sample)
    return time.perf_counter() - t0
