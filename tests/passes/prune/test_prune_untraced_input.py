"""prune's strip on a channel read from a tensor it does not trace (a graph input through Slice):
found by the fuzzer (``tests/fuzz_graphs.py``) as ``KeyError: 'x'``, exit 1."""

from __future__ import annotations

import numpy as np
import onnx
from conftest import run_ort

import onnxslim_kit

MODEL = '''<ir_version: 7, opset_import: ["" : 12]>
g (float[1,5] x) => (float[1,3] y) <float[2,5] w = {0,0,0,0,0,0,0,0,0,0}, int64[1] s = {1}, int64[1] e = {2}, int64[1] a = {-1}> {
  g1 = Gemm <transB: int = 1> (x, w)
  sl = Slice (x, s, e, a)
  y = Concat <axis: int = 1> (g1, sl)
}'''


def test_a_slice_of_a_graph_input_beside_a_zero_layer_is_unknown_not_a_crash():
    model = onnx.parser.parse_model(MODEL)
    out, report = onnxslim_kit.optimize(model, "prune")
    assert not report.passes[0].rolled_back
    x = {"x": np.random.default_rng(0).standard_normal((1, 5)).astype(np.float32)}
    np.testing.assert_allclose(run_ort(out, x)[0], run_ort(model, x)[0], rtol=1e-6, atol=1e-6)
