"""Peak memory of the pipeline: whole CLI runs and a per-step trace.

    python benchmarks/measure_memory.py cli   [--models minilm_l6] [--pipelines fuse,"fuse,int8",int4] [--stream-mb 256]
    python benchmarks/measure_memory.py trace MODEL.onnx --passes fuse,int8

``cli``: peak RSS (``ru_maxrss`` of the child, see ``anchors.measure``) of
``python -m onnxslim_kit MODEL --passes P -o OUT -q`` for each model and pipeline, and, with
``--stream-mb N``, of ``int4`` and ``fuse`` on a synthetic external-data model of N MB of MatMul
weights (plus a load-only child and a bare-imports child for scale).

``trace``: runs the pipeline in this process and prints, for each call of the instrumented
core functions (load, gs import/export, ORT session creation, verification, each pass, save),
the resident memory before and after and the peak *during* the call (the kernel's high-water
mark, reset through ``/proc/self/clear_refs`` at each call: nested calls fold their peak into
the enclosing ones).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import anchors  # noqa: E402

MODELS_DIR = Path.home() / ".cache" / "onnxslim_kit" / "models"


# --- trace (in process) ----------------------------------------------------------------

def _status_kb(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class Tracer:
    def __init__(self):
        self.stack = []  # peak KB seen so far by each open call
        self.rows = []
        self.depth = 0

    def _fold(self):
        hwm = _status_kb("VmHWM")
        self.stack = [max(p, hwm) for p in self.stack]
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")

    def wrap(self, owner, attr: str, label: str) -> None:
        fn = getattr(owner, attr)
        tracer = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            tracer._fold()
            before = _status_kb("VmRSS")
            tracer.stack.append(before)
            row = [label, tracer.depth, before, 0, 0]
            tracer.rows.append(row)
            tracer.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                tracer.depth -= 1
                tracer._fold()
                row[3] = _status_kb("VmRSS")
                row[4] = tracer.stack.pop()
                if tracer.stack:
                    tracer.stack[-1] = max(tracer.stack[-1], row[4])

        setattr(owner, attr, wrapper)

    def table(self) -> str:
        lines = ["| step | RSS before MB | RSS after MB | peak during MB |", "|---|---|---|---|"]
        for label, depth, before, after, peak in self.rows:
            lines.append(f"| {'· ' * depth}{label} | {before / 1024:.0f} | {after / 1024:.0f} | {peak / 1024:.0f} |")
        return "\n".join(lines)


def trace(model_path: str, passes: str, out: str | None) -> str:
    import onnxslim_kit
    from onnxslim_kit import model as model_mod
    from onnxslim_kit import pipeline, runtime, verify, activations
    from onnxslim_kit.model import Model

    tracer = Tracer()
    for owner, attr, label in (
        (onnxslim_kit, "load_proto", "load_proto"),
        (model_mod, "load_proto", "load_proto"),
        (Model, "from_proto", "Model.from_proto"),
        (Model, "to_proto", "Model.to_proto"),
        (runtime.ort, "InferenceSession", "ort.InferenceSession"),
        (verify.Verifier, "__init__", "Verifier.__init__ (reference outputs)"),
        (verify.Verifier, "check", "Verifier.check"),
        (pipeline, "model_stats", "model_stats"),
        (activations, "with_outputs", "with_outputs"),
        (model_mod, "save_proto", "save_proto"),
        (onnxslim_kit, "save_proto", "save_proto"),
    ):
        if hasattr(owner, attr):
            tracer.wrap(owner, attr, label)
    for name, cls in pipeline.available_passes().items():
        tracer.wrap(cls, "run", f"pass {name}")
    tracer.wrap(onnxslim_kit, "optimize", "optimize")
    proto, report = onnxslim_kit.optimize(model_path, passes, log=lambda m: None)
    if out:
        onnxslim_kit.save_proto(proto, out)
    del proto
    return tracer.table() + f"\n\nprocess peak (ru_maxrss incl. earlier resets may read low): VmHWM now {_status_kb('VmHWM') / 1024:.0f} MB"


# --- cli (child processes) -------------------------------------------------------------

def synthetic_external(path: Path, mb: int, k: int = 1024) -> tuple:
    """A chain of MatMuls with N MB of float32 weights, saved with external data; (path, layers)."""
    import onnx
    from onnx import TensorProto, helper

    layers = max(1, mb * (1 << 20) // (k * k * 4))
    rng = np.random.default_rng(0)
    data_name = path.name + ".data"
    nodes, inits, prev, offset = [], [], "x", 0
    with open(path.parent / data_name, "wb") as fh:  # written tensor by tensor: this process stays small
        for i in range(layers):
            w = (rng.standard_normal((k, k)) / 32).astype(np.float32)
            fh.write(w.tobytes())
            t = onnx.TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=[k, k],
                                 data_location=TensorProto.EXTERNAL)
            for key, value in (("location", data_name), ("offset", str(offset)), ("length", str(w.nbytes))):
                t.external_data.add(key=key, value=value)
            offset += w.nbytes
            inits.append(t)
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
            prev = f"h{i}"
    graph = helper.make_graph(nodes, "stream", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, k])], inits)
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path, layers


def _row(label: str, result: dict) -> str:
    status = "ok" if result["returncode"] == 0 else "FAILED: " + anchors.last_error_line(result["stderr"])
    return f"| {label} | {result['peak_rss_mb']} | {result['wall_seconds']} | {status} |"


def cli(args) -> list:
    lines = ["| run | peak RSS MB | wall s | status |", "|---|---|---|---|"]
    base = [sys.executable, "-c", "import onnxslim_kit.pipeline, onnxruntime, onnx_graphsurgeon, scipy"]
    lines.append(_row("python + imports", anchors.measure(base)))
    print(lines[-1], flush=True)
    with tempfile.TemporaryDirectory(prefix="memory-") as tmp:
        for model in [m for m in args.models.split(",") if m]:
            src = MODELS_DIR / f"{model}.onnx"
            for passes in args.pipelines:
                cmd = [sys.executable, "-m", "onnxslim_kit", str(src), "--passes", passes, "-o",
                       str(Path(tmp) / "out.onnx"), "-q"]
                lines.append(_row(f"{model} `{passes}`", anchors.measure(cmd)))
                print(lines[-1], flush=True)
        if args.stream_mb:
            src, layers = synthetic_external(Path(tmp) / "big.onnx", args.stream_mb)
            what = f"{args.stream_mb} MB external data, {layers} MatMul 1024×1024"
            load_only = [sys.executable, "-c", "import sys, onnx; onnx.load(sys.argv[1])", str(src)]
            lines.append(_row(f"{what}: onnx.load (all weights in memory once)", anchors.measure(load_only)))
            print(lines[-1], flush=True)
            for passes in args.stream_passes:
                cmd = [sys.executable, "-m", "onnxslim_kit", str(src), "--passes", passes, "-o",
                       str(Path(tmp) / "q.onnx"), "-q"]
                lines.append(_row(f"{what}: `{passes}`", anchors.measure(cmd)))
                print(lines[-1], flush=True)
    return lines


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_cli = sub.add_parser("cli")
    p_cli.add_argument("--models", default="minilm_l6")
    p_cli.add_argument("--pipelines", nargs="*", default=["fuse", "fuse,int8", "int4"])
    p_cli.add_argument("--stream-mb", type=int, default=256)
    p_cli.add_argument("--stream-passes", nargs="*", default=["int4", "fuse"])
    p_cli.add_argument("--out", type=Path, help="write a results .md here")
    p_trace = sub.add_parser("trace")
    p_trace.add_argument("model")
    p_trace.add_argument("--passes", default="fuse")
    p_trace.add_argument("-o", "--output")
    args = parser.parse_args(argv)
    if args.cmd == "trace":
        print(trace(args.model, args.passes, args.output))
        return 0
    load = tuple(round(x, 1) for x in os.getloadavg())
    lines = cli(args)
    if args.out:
        head = [f"# peak memory, {datetime.now(timezone.utc).isoformat(timespec='minutes')}", "",
                f"Command: `python benchmarks/{Path(__file__).name} {' '.join(argv)}`", "",
                f"Load average at start {load}, at the end {tuple(round(x, 1) for x in os.getloadavg())}.", ""]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(head + lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
