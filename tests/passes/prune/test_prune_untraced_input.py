"""prune's strip on graphs the fuzzer (``tests/fuzz_graphs.py``) found it crashing on: a channel
read from a tensor it does not trace (a graph input through Slice: ``KeyError: 'x'``), and
chained 1-channel layers whose every channel is constant (a zero-size weight: ``ValueError``)."""

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


CHAIN = """
<
   ir_version: 8,
   opset_import: ["" : 16]
>
fuzz (float[2,1,1,1] x) => (float[2,1,1,1] conv56, float[2,3,2,3] conv52) 
   <int64[1] i1 =  {0}, int64[1] i2 =  {4611686018427387904}, int64[1] i3 =  {1}, int64[1] i4 =  {2}, float[3,1,1,1] c7 =  {0,0,0}, float[3] c8 =  {-1.2395295,1.2631238,-0.7809391}, float[3,1,1] c11 =  {1.3804355,-0.97681344,0.5930111}, float[1,3,1,1] c14 =  {0,0,0}, float[1] c17 =  {1.3693192}, float[1] c21 =  {0.75624776}, float[1] c27 =  {1.3664743}, float[1] c28 =  {-1.0690589}, float[1] c29 =  {0.5591549}, int64 i34 =  {0}, int64[1] i37 =  {0}, int64[1] i40 =  {-1}, float[1,1,2,2] c45 =  {0,0,0,0}, float[3] c48 =  {1.3905022,-1.4598172,1.3505117}, float[3,1,1,1] c51 =  {0,0,0}, float[1,1,1,1] c54 =  {1.3539467}, float[1] c55 =  {0.6548521}>
{
   [n6] slic5 = Slice (x, i1, i2, i3, i4)
   [n10] conv9 = Conv <group: int = 1, kernel_shape: ints = [1, 1], pads: ints = [0, 1, 0, 1], strides: ints = [1, 1]> (x, c7, c8)
   [n13] prel12 = PRelu (conv9, c11)
   [n16] conv15 = Conv <group: int = 1, kernel_shape: ints = [1, 1], pads: ints = [0, 0, 0, 0], strides: ints = [1, 1]> (prel12, c14)
   [n20] cons19 = Constant <value: tensor = float[1] v18 {-1.2123064}> ()
   [n23] batc22 = BatchNormalization <epsilon: float = 1e-05> (slic5, c17, c17, cons19, c21)
   [n26] cons25 = Constant <value: tensor = float[1] v24 {1.3091173}> ()
   [n31] batc30 = BatchNormalization <epsilon: float = 0.001> (slic5, cons25, c27, c28, c29)
   [n33] shap32 = Shape (slic5)
   [n36] gath35 = Gather <axis: int = 0> (shap32, i34)
   [n39] unsq38 = Unsqueeze (gath35, i37)
   [n42] conc41 = Concat <axis: int = 0> (unsq38, i40)
   [n44] resh43 = Reshape (slic5, conc41)
   [n47] conv46 = Conv <group: int = 1, kernel_shape: ints = [2, 2], pads: ints = [1, 0, 1, 1], strides: ints = [1, 1]> (conv15, c45)
   [n50] prel49 = PRelu (conv46, c48)
   [n53] conv52 = Conv <group: int = 1, kernel_shape: ints = [1, 1], pads: ints = [0, 0, 0, 0], strides: ints = [1, 1]> (prel49, c51, c8)
   [n57] conv56 = Conv <group: int = 1, kernel_shape: ints = [1, 1], pads: ints = [1, 0, 0, 1], strides: ints = [2, 2]> (slic5, c54, c55)
}
"""


def test_a_layer_whose_every_channel_is_constant_keeps_one():
    model = onnx.parser.parse_model(CHAIN)
    out, report = onnxslim_kit.optimize(model, "prune")
    entry = report.passes[0]
    assert not entry.rolled_back and entry.verification["status"] == "ok"
    assert entry.skipped["the last channel of a layer is kept"] >= 1
    x = {"x": np.random.default_rng(0).standard_normal((2, 1, 1, 1)).astype(np.float32)}
    for got, want in zip(run_ort(out, x), run_ort(model, x)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
