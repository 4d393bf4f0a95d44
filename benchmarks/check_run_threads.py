"""Whether ONNX Runtime's outputs on a model depend on the intra-op thread count (1 vs 2), and
the seconds a run takes with each: the check behind ``passes/int4/mixed.py``'s ``RUN_THREADS``.

    python benchmarks/check_run_threads.py MODEL.onnx CALIB.npz [--runs 2]

Sessions as the mixed-precision step makes them (level ``basic``, no arena, no pre-packing);
the first ``--runs`` samples of the ``.npz`` (arrays stacked along axis 0, named by input).
Prints one JSON line: seconds per run for each thread count, bitwise equality, largest
difference.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from onnxslim_kit.runtime import make_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("calib")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with np.load(args.calib) as data:
        arrays = {k: data[k] for k in data.files}
    outs, seconds = {}, {}
    for threads in (1, 2):
        session = make_session(args.model, "basic", threads=threads, arena=False, prepack=False)
        feeds = [{i.name: arrays[i.name][s] for i in session.get_inputs()} for s in range(args.runs)]
        start = time.perf_counter()
        outs[threads] = [session.run(None, feed) for feed in feeds]
        seconds[threads] = round((time.perf_counter() - start) / args.runs, 3)
        del session
    pairs = [(a, b) for r1, r2 in zip(outs[1], outs[2]) for a, b in zip(r1, r2)]
    print(json.dumps({"model": args.model, "seconds_per_run": seconds,
                      "bitwise_equal": all(np.array_equal(a, b) for a, b in pairs),
                      "max_abs_difference": max(float(np.abs(a - b).max()) for a, b in pairs)}))


if __name__ == "__main__":
    main()
