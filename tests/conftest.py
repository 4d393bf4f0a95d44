"""Shared fixtures: tiny models from ONNX text, ORT comparison helpers."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

# int8's default speed decision (speed=auto → layers) times kernels on this machine. The suite pins the
# machine-independent decision (also inherited by the CLI subprocesses), so that its figures do not depend
# on this machine's timings; the tests of speed=layers / auto name what they test.
os.environ.setdefault("ONNXSLIM_KIT_SPEED", "off")


def parse(text: str) -> onnx.ModelProto:
    """A model from ONNX text (``onnx.parser``), checked."""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    return model


def run_ort(model: onnx.ModelProto, feeds: dict) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_same_outputs(a: onnx.ModelProto, b: onnx.ModelProto, feeds: dict, rtol=1e-5, atol=1e-5):
    for x, y in zip(run_ort(a, feeds), run_ort(b, feeds)):
        np.testing.assert_allclose(y, x, rtol=rtol, atol=atol)


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict:
    from onnxslim_kit.calibration import CalibrationFeed, input_specs

    return CalibrationFeed(input_specs(model), None, seed=seed).take(1)[0]


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def nodes_counting_prelu_once(proto) -> int:
    """Node count of a fused model with each PRelu that ``fuse`` rewrote (1 → 1, 2 or 4 nodes
    named ``prelu/…``, the last a LeakyRelu, Max or Add) counted as the one node it was."""
    names = [n.name.split("__")[0] for n in proto.graph.node]
    return sum(not n.startswith("prelu/") for n in names) + sum(
        n in ("prelu/LeakyRelu", "prelu/Max", "prelu/Add") for n in names)


# --- shared by several test folders ---------------------------------------------------------

IDENTITY_ADD = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4] x) => (float[1,4] y) <float[4] b = {1.0, 2.0, 3.0, 4.0}> {
  i = Identity (x)
  y = Add (i, b)
}
"""


@pytest.fixture
def model_path(tmp_path):
    """``tmp_path/m.onnx`` holding :data:`IDENTITY_ADD` (``y = Identity(x) + b``)."""
    path = tmp_path / "m.onnx"
    onnx.save(parse(IDENTITY_ADD), path)
    return path


def scale_constants(model, factor: float, label: str):
    """A test pass's work: every constant of the main graph times ``factor``, one ``label``
    rewrite each; returns the PassResult."""
    import onnx_graphsurgeon as gs

    from onnxslim_kit.pass_base import PassResult

    result = PassResult()
    for tensor in model.graph.tensors().values():
        if isinstance(tensor, gs.Constant):
            tensor.values = np.asarray(tensor.values) * factor
            result.rewrite(label)
    return result


def cli_error(tmp_path, model: onnx.ModelProto, passes: str, capsys=None) -> str:
    """Run the command line on ``model`` with ``--passes passes`` (in a subprocess, or in this
    process with ``capsys``); assert it exits 2 with one line on stderr, no traceback and no
    output file; returns that line."""
    import subprocess
    import sys

    from onnxslim_kit.cli import main

    path, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(model, path)
    args = [str(path), "--passes", passes, "-o", str(out), "-q"]
    if capsys is None:
        proc = subprocess.run([sys.executable, "-m", "onnxslim_kit", *args], capture_output=True, text=True)
        code, err = proc.returncode, proc.stderr
    else:
        code, err = main(args), capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not out.exists()
    return lines[0]


def assert_left_float(original: onnx.ModelProto, out: onnx.ModelProto, name: str, inputs: list,
                      weight: str, gone: str) -> None:
    """The node ``name`` is in ``out`` once, of its original op type, reading ``inputs``; its
    weight ``weight`` is the original's, bit for bit; ``gone`` (a rewritten layer's weight) left."""
    from onnx import numpy_helper

    op = next(n.op_type for n in original.graph.node if n.name == name)
    kept = [n for n in out.graph.node if n.name == name]
    assert len(kept) == 1 and kept[0].op_type == op and list(kept[0].input) == inputs
    weights = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    before = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    np.testing.assert_array_equal(weights[weight], before[weight])
    assert gone not in weights


def run_zoo(name: str, passes: str, input_shapes: dict | None = None, num_samples: int = 4, **kw) -> tuple:
    """``(original, out, entry)``: the zoo model ``name`` through ``passes`` on generated data
    (``input_shapes`` fixes dynamic dims; ``kw`` goes to ``run_pipeline``); ``entry`` the first pass's."""
    from onnxslim_kit.calibration import CalibrationFeed, input_specs
    from onnxslim_kit.model import load_proto
    from onnxslim_kit.pipeline import parse_pass_list, run_pipeline
    from onnxslim_kit.zoo import fetch

    original = load_proto(fetch(name))
    feed = CalibrationFeed(input_specs(original), None, input_shapes=input_shapes, num_samples=num_samples)
    out, report = run_pipeline(original, parse_pass_list(passes), feed, **kw)
    return original, out, report.passes[0]
