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

and int8 is kept when ``ratio ≤ margin`` (default 0.9: at least 10 % faster). Otherwise the
pass keeps the model float and says so (``int8 would be 1.40× the float latency here: kept
float; pass speed_check=false to force``). Rounds: at least 3, at most ``runs``, stopping
once ``budget`` seconds (1.5) are spent (a detector at 0.1 s a run gets ~7 rounds).

Why keep float rather than drop only "slow" layers: which layer is slow depends on its
neighbours (a Q/DQ pair costs a pass over the tensor whether the conv beside it is int8 or
not), so a per-layer decision needs a per-layer timing model; the whole-model check is
honest, cheap, and leaves ``speed_check=false`` to users who want the size or will run the
model on hardware with better int8 kernels. The numbers are noisy on a shared machine: a
ratio near the margin can go either way between runs.
"""

from __future__ import annotations

import time

import numpy as np

from onnxslim_kit.runtime import make_session, run


def latency_ratio(candidate, reference, sample: dict, runs: int = 15, budget: float = 1.5) -> tuple:
    """(median ratio candidate / reference, [min, max] of the per-round ratios, rounds)."""
    sessions = [make_session(p, "all", threads=1) for p in (reference, candidate)]
    for session in sessions:  # warm-up: first runs allocate
        run(session, sample)
    ratios = []
    start = time.perf_counter()
    for r in range(max(3, runs)):
        times = [0.0, 0.0]
        for m in (r % 2, 1 - r % 2):  # alternate which model goes first
            t0 = time.perf_counter()
            run(sessions[m], sample)
            times[m] = time.perf_counter() - t0
        ratios.append(times[1] / max(times[0], 1e-9))
        if r >= 2 and time.perf_counter() - start > budget:
            break
    return float(np.median(ratios)), [float(min(ratios)), float(max(ratios))], len(ratios)
