"""Lower bounds behind three acceptance lines the tool does not meet, measured on the real models.

    python benchmarks/floors.py                                   # all sections, default models
    python benchmarks/floors.py --sections int8 --models ppocr_cls_v2,mtcnn_pnet

* ``int8`` — the smallest int8 file ONNX Runtime can fuse, before any graph is written: every
  Conv/Gemm/MatMul weight as one int8 byte, per output channel a float32 scale (4 B) and, for
  Gemm/MatMul, an int8 zero point (1 B; ORT 1.32 does not fuse a weight DequantizeLinear
  without it into QGemm; QLinearConv needs none), per output channel of every layer that has a bias an int32 bias (4 B) and its
  DequantizeLinear scale ``s_x·s_w`` (4 B), and every other constant of the fused model as it is. Floor = those bytes / the original file. Beside
  it, the files ``fuse,int8`` and ``fuse,int8,compact`` actually write (calibrated on the
  suite's 16 calibration samples).
* ``cluster`` — the same for ``cluster(k=16)``: 4-bit labels (two per byte) of every weight
  with at least ``--min-weights`` values, a 16-entry float32 codebook per tensor, everything
  else as it is, no graph.
* ``time`` — the share of ONNX Runtime's run time (CPU, 1 thread, optimizations ``all``,
  the suite's evaluation inputs) spent in Conv kernels, inside If/Loop bodies too, from ORT's
  profiler: channel pruning makes only that part faster, so ``1 / (1 − share)`` bounds the
  speed-up of removing every conv outright.

* ``margins`` — decision agreement on samples a pass never saw is bounded by the original's own
  margins there: a Softmax row whose top-vs-runner-up log-odds m is smaller than how far a pass
  moves them flips, whatever the held-out samples said. Per model, the smallest m of the
  original on the held-out calibration samples (one in four of ``--calib``, :func:`onnxslim_kit.fidelity.context.held_out`), on all of them and
  on the evaluation samples (another stream of ``inputs.py``), and, for each pipeline written
  with those calibration samples, how far it moves the margin of the evaluation sample closest
  to a tie and whether that decision flipped (:mod:`onnxslim_kit.fidelity.margins`).

Results: ``benchmarks/results/floors-<name>.md`` with this command at the top.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import inputs  # noqa: E402

import onnxslim_kit  # noqa: E402
from onnxslim_kit.fidelity.context import held_out_of  # noqa: E402
from onnxslim_kit.model import proto_graphs  # noqa: E402

LAYER_OPS = {"Conv": 0, "ConvTranspose": 1, "Gemm": 0, "MatMul": 1}  # op → output-channel axis of the weight
CONV_KERNELS = {"Conv", "FusedConv", "QLinearConv", "NhwcFusedConv", "ConvTranspose"}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="int8,cluster,time")
    parser.add_argument("--models", default="ppocr_cls_v2,mtcnn_pnet,ppocrv4_det,mtcnn_onet,orientation")
    parser.add_argument("--time-models", default="silero_vad,mtcnn_pnet")
    parser.add_argument("--runs", type=int, default=300, help="profiled runs per model (time)")
    parser.add_argument("--min-weights", type=int, default=16, help="cluster: smallest weight clustered")
    parser.add_argument("--margin-models", default="ppocr_cls_v2,orientation,mtcnn_onet")
    parser.add_argument("--margin-pipelines", default="fuse,fp16;fuse,int8;fuse,prune;fuse,prune,int8")
    parser.add_argument("--calib", type=int, default=128, help="margins: calibration samples (one in four held out)")
    parser.add_argument("--eval", type=int, default=32, help="margins: evaluation samples")
    parser.add_argument("--name", default=f"floors-{datetime.now(timezone.utc):%Y-%m-%d}")
    return parser.parse_args(argv)


def constants(proto: onnx.ModelProto) -> dict:
    """name → array of every initializer, subgraphs included."""
    return {t.name: numpy_helper.to_array(t) for g in proto_graphs(proto.graph) for t in g.initializer}


def layer_weights(proto: onnx.ModelProto, arrays: dict) -> list:
    """(weight name, bias name or None, output channels, op) of every main-graph layer with a constant weight."""
    layers = []
    for node in proto.graph.node:
        index = 0 if node.op_type == "MatMul" and node.input[0] in arrays else 1
        if node.op_type not in LAYER_OPS or len(node.input) <= index or node.input[index] not in arrays:
            continue
        w = arrays[node.input[index]]
        axis = LAYER_OPS[node.op_type]
        if node.op_type == "Gemm" and not any(a.name == "transB" and a.i for a in node.attribute):
            axis = 1
        if node.op_type == "MatMul":
            axis = w.ndim - 1
        bias = node.input[2] if node.op_type in ("Conv", "ConvTranspose", "Gemm") and len(node.input) > 2 else None
        channels = w.shape[axis] * (_group(node) if node.op_type == "ConvTranspose" else 1)
        layers.append((node.input[index], bias if bias in arrays else None, int(channels), node.op_type))
    return layers


def _group(node) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def fused(name: str) -> onnx.ModelProto:
    proto, _ = onnxslim_kit.optimize(onnx.load(inputs.model_path(name)), "fuse", verify=False)
    return proto


def written_model(name: str, pipeline: str, calib: list, work: Path) -> Path | None:
    """The file the CLI writes for ``pipeline``, calibrated on ``calib`` (None: it failed)."""
    npz = work / f"{name}.calib.npz"
    np.savez(npz, **{k: np.stack([s[k] for s in calib]) for k in calib[0]})
    out = work / f"{name}.{pipeline.replace(',', '_')}.onnx"
    code = os.system(f"{sys.executable} -m onnxslim_kit {inputs.model_path(name)} --passes '{pipeline}' "
                     f"--calib {npz} -o {out} -q")
    return out if code == 0 and out.exists() else None


def written_bytes(name: str, pipeline: str, calib: list, work: Path) -> int:
    """Bytes of the file the CLI writes for ``pipeline``, calibrated on ``calib``."""
    out = written_model(name, pipeline, calib, work)
    return out.stat().st_size if out is not None else -1


def softmax_rows(path, samples: list) -> list:
    """Per sample, the rows ``[rows, classes]`` of the model's first whole-output Softmax view."""
    from onnxslim_kit.fidelity.views import find_views

    name = next(v.output for v in find_views(onnx.load(str(path))) if v.kind == "probs" and v.branch is None)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rows = []
    for feed in samples:
        y = session.run([name], feed)[0]
        rows.append(y.reshape(-1, y.shape[-1]))
    return rows


def margin_floor(name: str, pipelines: list, n_calib: int, n_eval: int, work: Path) -> dict:
    """The ``margins`` section's figures for one model (module docstring)."""
    from onnxslim_kit.fidelity.margins import margins_and_shifts

    data = inputs.build(name, n_calib=n_calib, n_eval=n_eval)
    src = inputs.model_path(name)

    def smallest(rows):
        return [float(margins_and_shifts(r, r)[0].min()) for r in rows]

    eval_rows = softmax_rows(src, data.eval)
    calib, evaluation = smallest(softmax_rows(src, data.calib)), smallest(eval_rows)
    closest = int(np.argmin(evaluation))
    reference = eval_rows[closest]
    row = int(np.argmin(margins_and_shifts(reference, reference)[0]))
    out = {"held-out": min(held_out_of(calib)), "calibration": min(calib), "eval": evaluation[closest],
           "eval below 1 nat": int(np.sum(np.array(evaluation) < 1.0)), "pipelines": {}}
    for pipeline in pipelines:
        path = written_model(name, pipeline, data.calib, work)
        if path is None:
            out["pipelines"][pipeline] = None
            continue
        got = softmax_rows(path, [data.eval[closest]])[0]
        shift = float(margins_and_shifts(reference[row:row + 1], got[row:row + 1])[1][0])
        out["pipelines"][pipeline] = {"shift": shift,
                                      "flipped": bool(np.argmax(reference[row]) != np.argmax(got[row]))}
    return out


def int8_floor(proto: onnx.ModelProto) -> dict:
    arrays = constants(proto)
    layers = layer_weights(proto, arrays)
    weights = {w for w, _, _, _ in layers}
    biases = {b for _, b, _, _ in layers if b}
    parts = Counter()
    for w, b, channels, op in layers:
        parts["int8 weights"] += arrays[w].size
        parts["scales (f32) + zero points (i8)"] += (4 if op in ("Conv", "ConvTranspose") else 5) * channels
        parts["int32 biases + their scales"] += 8 * channels if b else 0
    parts["other constants"] = sum(a.nbytes for n, a in arrays.items() if n not in weights | biases)
    return dict(parts)


def cluster_floor(proto: onnx.ModelProto, min_weights: int) -> dict:
    arrays = constants(proto)
    weights = {w for w, _, _, _ in layer_weights(proto, arrays) if arrays[w].size >= min_weights}
    parts = Counter()
    for name, a in arrays.items():
        if name in weights:
            parts["4-bit labels"] += (a.size + 1) // 2
            parts["codebooks (16 × f32)"] += 64
        else:
            parts["other constants"] += a.nbytes
    return dict(parts)


def conv_time_share(name: str, runs: int, work: Path) -> dict:
    """Share of the run time spent in conv kernels (ORT profiler, 1 thread, optimizations all)."""
    data = inputs.build(name, n_calib=1, n_eval=4)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.enable_profiling, so.profile_file_prefix = True, str(work / name)
    session = ort.InferenceSession(str(inputs.model_path(name)), so, providers=["CPUExecutionProvider"])
    for i in range(runs):
        session.run(None, data.eval[i % len(data.eval)])
    events = json.loads(Path(session.end_profiling()).read_text())
    run_us = sum(e["dur"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    by_op = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"]
    conv = sum(v for k, v in by_op.items() if k in CONV_KERNELS)
    share = conv / run_us
    return {"runs": runs, "run µs": run_us / runs, "conv µs": conv / runs, "share": share,
            "bound": 1 / (1 - share), "top": by_op.most_common(6)}


def main(argv=None) -> int:
    args = parse_args(argv if argv is not None else sys.argv[1:])
    sections = set(args.sections.split(","))
    command = "python benchmarks/floors.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"# Lower bounds ({datetime.now(timezone.utc):%Y-%m-%dT%H:%M:%SZ})", "",
             f"Command: `{command.strip()}`; load average {os.getloadavg()[0]:.1f}.", "",
             "See the docstring of benchmarks/floors.py for what each bound counts.", ""]
    out = HERE / "results" / f"{args.name}.md"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = [m for m in args.models.split(",") if m]
        if sections & {"int8", "cluster"}:
            rows_i8, rows_cl = [], []
            for name in models:
                original = inputs.model_path(name).stat().st_size
                proto = fused(name)
                if "int8" in sections:
                    parts = int8_floor(proto)
                    calib = inputs.build(name, n_calib=16, n_eval=1).calib
                    got = [written_bytes(name, p, calib, work) for p in ("fuse,int8", "fuse,int8,compact")]
                    rows_i8.append((name, original, parts, got))
                if "cluster" in sections:
                    rows_cl.append((name, original, cluster_floor(proto, args.min_weights)))
                print(f"{name}: done", file=sys.stderr)
            if rows_i8:
                lines += ["## int8: file floor (no graph) vs the original file", "",
                          "| model | original B | int8 weights | weight scales + zero points | int32 biases + their scales | other constants "
                          "| floor | floor × orig | `fuse,int8` × orig | `fuse,int8,compact` × orig |",
                          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
                for name, original, parts, got in rows_i8:
                    floor = sum(parts.values())
                    lines.append(f"| {name} | {original:,} | {parts['int8 weights']:,} | "
                                 f"{parts['scales (f32) + zero points (i8)']:,} | {parts['int32 biases + their scales']:,} | "
                                 f"{parts['other constants']:,} | {floor:,} | {floor / original:.3f} | "
                                 + " | ".join(f"{g / original:.3f}" if g > 0 else "failed" for g in got) + " |")
                lines.append("")
            if rows_cl:
                lines += [f"## cluster(k=16): file floor (no graph; weights of ≥ {args.min_weights} values)", "",
                          "| model | original B | 4-bit labels | codebooks | other constants | floor × orig |",
                          "|---|---:|---:|---:|---:|---:|"]
                for name, original, parts in rows_cl:
                    lines.append(f"| {name} | {original:,} | {parts.get('4-bit labels', 0):,} | "
                                 f"{parts.get('codebooks (16 × f32)', 0):,} | {parts.get('other constants', 0):,} | "
                                 f"{sum(parts.values()) / original:.3f} |")
                lines.append("")
        if "time" in sections:
            lines += ["## Conv share of ONNX Runtime's run time (bound on what channel pruning can speed up)", "",
                      "| model | runs | run µs | conv µs | conv share | speed-up if every conv vanished | "
                      "largest kernels (µs/run) |", "|---|---:|---:|---:|---:|---:|---|"]
            for name in [m for m in args.time_models.split(",") if m]:
                t = conv_time_share(name, args.runs, work)
                top = ", ".join(f"{k} {v / t['runs']:.0f}" for k, v in t["top"])
                lines.append(f"| {name} | {t['runs']} | {t['run µs']:.0f} | {t['conv µs']:.0f} | {t['share']:.3f} | "
                             f"{t['bound']:.2f}× | {top} |")
            lines += ["", "Kernel times of nodes inside If bodies are counted in the If's own time as well, "
                      "so the largest-kernel list can add up to more than the run.", ""]
        if "margins" in sections:
            pipelines = [p for p in args.margin_pipelines.split(";") if p]
            lines += ["## Decision margins: what held-out samples cannot show", "",
                      f"Smallest top-vs-runner-up log-odds (nats) of the original, and how far each pipeline "
                      f"(written with the {args.calib} calibration samples) moves the margin of the evaluation "
                      f"sample closest to a tie (of {args.eval}).", "",
                      "| model | held-out min | calibration min | eval min | eval rows < 1 nat | "
                      + " | ".join(f"`{p}` shift (flipped?)" for p in pipelines) + " |",
                      "|---|---:|---:|---:|---:|" + "---:|" * len(pipelines)]
            for name in [m for m in args.margin_models.split(",") if m]:
                f = margin_floor(name, pipelines, args.calib, args.eval, work)
                cells = [("failed" if r is None else f"{r['shift']:.3f} ({'yes' if r['flipped'] else 'no'})")
                         for r in (f["pipelines"][p] for p in pipelines)]
                lines.append(f"| {name} | {f['held-out']:.3f} | {f['calibration']:.3f} | {f['eval']:.3f} | "
                             f"{f['eval below 1 nat']} | " + " | ".join(cells) + " |")
                print(f"{name}: margins done", file=sys.stderr)
            lines.append("")
    out.write_text("\n".join(lines))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
