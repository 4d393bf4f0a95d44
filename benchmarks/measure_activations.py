"""``fuse``'s activation rewrites (``activations=true``): what they buy in ONNX Runtime.

    python benchmarks/measure_activations.py              # kernels + the models with PRelu / hard-swish
    python benchmarks/measure_activations.py --runs 500 --name activations-2026-11-29-s4

1. Kernels: a one-node model ``PRelu(x, s)`` per MTCNN P-Net activation shape (per-channel
   slopes in [0, 1] and of both signs), against the rewrite ``fuse`` makes (``Mul`` + ``Max``,
   ``Relu`` + ``Min``·``Mul`` + ``Add``); interleaved runs, median µs, max |difference|.
2. Models: ``fuse(activations=false)`` against ``fuse`` (both from this checkout) and the
   original, with :func:`onnxslim_kit.bench.benchmark` (interleaved, ORT optimizations
   ``all``, 1 thread) on the suite's evaluation inputs (``inputs.py``): MTCNN P-Net and O-Net
   (PRelu), PP-OCRv4 det / rec and the PP-OCR direction classifier (hard-swish chains).

Results: ``benchmarks/results/<name>.md`` with the command and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import inputs  # noqa: E402

import onnxslim_kit  # noqa: E402
from onnxslim_kit.bench import benchmark  # noqa: E402
from onnxslim_kit.runtime import make_session  # noqa: E402

PNET_SHAPES = [(1, 10, 118, 158), (1, 16, 57, 77), (1, 32, 55, 75)]


def one_node(shape, slope: np.ndarray) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("PRelu", ["x", "s"], ["y"])], "prelu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [numpy_helper.from_array(slope, "s")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def kernel_rows(runs: int) -> list:
    rng = np.random.default_rng(0)
    rows = []
    for shape in PNET_SHAPES:
        x = rng.standard_normal(shape).astype(np.float32)
        for kind, slope in (("0 ≤ s ≤ 1", rng.random((shape[1], 1, 1))),
                            ("mixed signs", rng.random((shape[1], 1, 1)) - 0.5)):
            proto = one_node(shape, slope.astype(np.float32))
            rewritten, _ = onnxslim_kit.optimize(proto, "fuse", verify=False)
            sessions = [make_session(m, opt_level="all", threads=1) for m in (proto, rewritten)]
            outs = [s.run(None, {"x": x})[0] for s in sessions]
            times = [[], []]
            for _ in range(runs):
                for s, t in zip(sessions, times):
                    start = time.perf_counter()
                    s.run(None, {"x": x})
                    t.append(time.perf_counter() - start)
            ops = "+".join(n.op_type for n in rewritten.graph.node)
            rows.append((shape, kind, ops, *(statistics.median(t) * 1e6 for t in times),
                         float(np.abs(outs[0] - outs[1]).max())))
    return rows


def model_rows(name: str, runs: int) -> list:
    data = inputs.build(name, n_calib=1, n_eval=8)
    path = inputs.model_path(name)
    before, _ = onnxslim_kit.optimize(str(path), "fuse(activations=false)", verify=False)
    after, _ = onnxslim_kit.optimize(str(path), "fuse", verify=False)
    report = benchmark([str(path), before, after], data.eval, names=["original", "fuse(activations=false)", "fuse"],
                       runs=runs, warmup=20, memory=False)
    return report.rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--models", default="mtcnn_pnet,mtcnn_onet,ppocrv4_det,ppocrv4_rec,ppocr_cls_v2")
    parser.add_argument("--model-runs", type=int, default=100, help="timed runs per model (models)")
    parser.add_argument("--name", default=f"activations-{datetime.now(timezone.utc):%Y-%m-%d}")
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]
    lines = [f"# fuse: activation rewrites ({datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ})", "",
             f"Command: `python benchmarks/measure_activations.py {' '.join(argv if argv is not None else sys.argv[1:])}`"
             f"; onnxruntime {ort.__version__}; load average before {load:.1f}.", "",
             "## PRelu kernel vs its rewrite (1 thread, median µs of interleaved runs)", "",
             "| shape | slopes | rewrite | PRelu µs | rewrite µs | ratio | max abs diff |", "|---|---|---|---:|---:|---:|---:|"]
    for shape, kind, ops, t_prelu, t_new, diff in kernel_rows(args.runs):
        lines.append(f"| {'×'.join(map(str, shape))} | {kind} | {ops} | {t_prelu:.0f} | {t_new:.0f} | "
                     f"{t_new / t_prelu:.3f} | {diff:g} |")
    lines += ["", "## Models (onnxslim_kit.bench: ORT optimizations all, 1 thread, interleaved)", "",
              "| model | variant | median ms | × original [P10, P90] | nodes | drift vs original |", "|---|---|---:|---:|---:|---|"]
    for name in [m for m in args.models.split(",") if m]:
        for index, row in enumerate(model_rows(name, args.model_runs)):
            drift = row["drift"] or {}
            worst = min((d["cosine"] for d in drift.values()), default=1.0)
            abs_err = max((d["max_abs"] for d in drift.values()), default=0.0)
            lo, hi = row["latency_ratio_spread"]
            lines.append(f"| {name} | {row['name']} | {row['latency_ms']['median']:.3f} | "
                         f"{row['latency_ratio_vs_first']:.3f} [{lo:.2f}, {hi:.2f}] | {row['nodes']} | "
                         + ("reference" if index == 0 else f"cos {worst:.6f}, abs {abs_err:.1e}") + " |")
    lines += ["", f"Load average after: {os.getloadavg()[0]:.1f}."]
    out = HERE / "results" / f"{args.name}.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
