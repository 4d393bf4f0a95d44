"""ONNX Runtime CPU conv time against channel counts: why ``prune`` keeps multiples of 16.

    python benchmarks/prune_channel_blocks.py

One 3×3 Conv (+Relu) on a 120×160 map (ppocrv4_det's 1/4-resolution FPN convs), 1 intra-op
thread, graph optimizations on (default); fastest and median of 30 runs after 3 warm-up runs (the
fastest is the figure that resists other jobs on a shared machine). MLAS works on
blocks of 16 channels on AVX-512 (8 on AVX2): a count between two blocks costs the next block.
"""

from __future__ import annotations

import os
import time

import numpy as np
import onnxruntime as ort
from onnx import helper, numpy_helper

PAIRS = [(96, 24), (96, 16), (96, 32), (80, 24), (96, 20), (64, 24), (64, 40), (64, 48), (48, 40), (48, 48),
         (40, 40)]


def conv_model(cin: int, cout: int, h: int, w: int, k: int = 3):
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((cout, cin, k, k)).astype(np.float32), "W")
    bias = numpy_helper.from_array(np.zeros(cout, np.float32), "B")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[k // 2] * 4),
             helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, cin, h, w])],
                              [helper.make_tensor_value_info("z", 1, None)], [weight, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def main(h: int = 120, w: int = 160) -> None:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("| C_in | C_out | fastest ms | median ms | ns per MAC (fastest) |\n|---:|---:|---:|---:|---:|")
    for cin, cout in PAIRS:
        session = ort.InferenceSession(conv_model(cin, cout, h, w).SerializeToString(), so,
                                       providers=["CPUExecutionProvider"])
        x = np.random.default_rng(1).standard_normal((1, cin, h, w)).astype(np.float32)
        for _ in range(3):
            session.run(None, {"x": x})
        times = []
        for _ in range(30):
            start = time.perf_counter()
            session.run(None, {"x": x})
            times.append(time.perf_counter() - start)
        ms = float(np.min(times)) * 1e3
        print(f"| {cin} | {cout} | {ms:.2f} | {float(np.median(times)) * 1e3:.2f} | "
              f"{ms * 1e6 / (cin * cout * 9 * h * w):.3f} |")


if __name__ == "__main__":
    main()
