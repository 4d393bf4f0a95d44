"""NNCF as a benchmark anchor (``benchmarks/anchors.py``) and the int8-floor script's arithmetic.

The NNCF checks run its ONNX backend in process on a tiny Conv graph written as ONNX text:
the default preset must quantize activations symmetrically (zero point 0), MIXED
asymmetrically (a zero point that fits a signed input's range), every preset must give a
model ONNX Runtime loads and that stays close to the float one; and ``import nncf`` must
work with torch and openvino unavailable (the anchor's promise: no torch, no openvino).
The NNCF tests import NNCF (≈ 10 s), so they carry the ``realmodel`` marker of the suite's
slower tests; the int8-floor arithmetic is checked without it.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper, parser

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

CONV = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,8,8] x) => (float[1,4,8,8] y) <float[4,3,3,3] w = {%s}, float[4] b = {0.1, -0.2, 0.3, 0.0}>
{
    y = Conv <pads = [1, 1, 1, 1]> (x, w, b)
}
"""


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("anchors"), importlib.import_module("measure_int8_floor")
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture()
def conv_model(tmp_path):
    weights = np.random.default_rng(0).normal(0, 0.3, 108)
    model = parser.parse_model(CONV % ", ".join(f"{v:.4f}" for v in weights))
    src = tmp_path / "conv.onnx"
    onnx.save(model, src)
    rng = np.random.default_rng(1)
    samples = rng.uniform(-1.0, 2.0, (8, 1, 3, 8, 8)).astype(np.float32)  # a signed input: zero points tell presets apart
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=samples)
    return src, calib, samples


def _input_zero_point(model: onnx.ModelProto) -> np.ndarray:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
    return inits[q.input[2]]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.realmodel
@pytest.mark.parametrize("tool", ["nncf", "nncf_mixed"])
def test_nncf_presets_quantize_and_stay_close(bench, conv_model, tmp_path, tool):
    pytest.importorskip("nncf")
    import onnxruntime as ort

    anchors, _ = bench
    src, calib, samples = conv_model
    dst = tmp_path / f"{tool}.onnx"
    notes: list = []
    anchors.TOOLS[tool](src, dst, calib, notes)
    out = onnx.load(dst)
    ops = {n.op_type for n in out.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops, ops
    zero_point = _input_zero_point(out)
    if tool == "nncf":  # performance preset: symmetric activations
        assert zero_point.dtype == np.int8 and np.all(zero_point == 0), zero_point
        assert not any("preset" in n for n in notes), notes
    else:  # MIXED: asymmetric activations, the zero point follows the range [-1, 2]
        assert np.any(zero_point != 0), zero_point
        assert any("preset=MIXED" in n for n in notes), notes
    float_run = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    int8_run = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"])
    for sample in samples[:3]:
        ref, got = float_run.run(None, {"x": sample})[0], int8_run.run(None, {"x": sample})[0]
        assert _cosine(ref, got) > 0.99


@pytest.mark.realmodel
def test_nncf_imports_without_torch_or_openvino():
    pytest.importorskip("nncf")
    code = ("import sys\nfor m in ('torch', 'openvino'): sys.modules[m] = None\n"
            "import nncf, nncf.onnx\nprint(nncf.__version__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "3.4.0"


@pytest.mark.realmodel
def test_nncf_needs_calibration_samples(bench, conv_model, tmp_path):
    pytest.importorskip("nncf")
    anchors, _ = bench
    with pytest.raises(RuntimeError, match="needs --calib"):
        anchors.TOOLS["nncf"](conv_model[0], tmp_path / "out.onnx", None, [])


def test_kept_share_is_measured_against_fuse(bench):
    _, floor = bench
    assert floor.kept_share(1.0, 0.6, 0.5) == pytest.approx(0.8)   # 0.4 of the 0.5 the floor gains over fuse
    assert floor.kept_share(0.9, 0.9, 0.4) == pytest.approx(0.0)   # as fast as fuse: nothing kept
    assert floor.kept_share(0.9, 1.0, 0.4) < 0                     # slower than fuse
    assert floor.kept_share(0.9, 0.5, 1.1) is None                 # the floor is slower than fuse: undefined
    assert floor.kept_share(None, 0.5, 0.4) is None


def test_the_share_is_reported_only_where_the_floor_pays_beyond_noise(bench):
    _, floor = bench
    assert floor.floor_pays([0.9, 1.0], [0.5, 0.6])          # floor's P90 below fuse's P10
    assert not floor.floor_pays([0.84, 1.05], [0.81, 0.98])  # overlapping rounds: noise
    assert not floor.floor_pays(None, [0.5, 0.6])
