"""Weights the int8 pass does not copy: the opset upgrade (for per-channel DequantizeLinear)
works on stubs and gives the model's own arrays back, exported with their bytes
(``passes/_quant/qdq.py``: :func:`upgrade_opset`); a stored encoding is shared by its readers."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from onnxslim_kit.model import Model
from onnxslim_kit.passes._quant.qdq import upgrade_opset
from onnxslim_kit.runtime import make_session, run


def _opset12() -> onnx.ModelProto:
    """A Conv (weight of 4.6 KB) and a Split whose ``split`` attribute opset 13 makes an input."""
    text = """<ir_version: 7, opset_import: ["" : 12]>
    g (float[1, 8, 6, 6] x) => (float[1, 8, 6, 6] a, float[1, 8, 6, 6] b) {
        c = Conv <pads = [1, 1, 1, 1]> (x, w)
        a, b = Split <axis = 1, split = [8, 8]> (c)
    }"""
    model = onnx.parser.parse_model(text)
    w = np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    onnx.checker.check_model(model, full_check=True)
    return model


def test_the_upgraded_graph_holds_the_models_own_arrays_and_exports_them_whole():
    proto = _opset12()
    model = Model.from_proto(proto)
    weight = model.graph.tensors()["w"].values
    graph = upgrade_opset(model, 13)
    assert graph is not None and graph.tensors()["w"].values is weight  # no copy
    split = next(n for n in graph.nodes if n.op == "Split")
    assert "split" not in split.attrs and len(split.inputs) == 2  # the opset-13 form
    model.graph = graph  # the graph carries its opset
    out = model.to_proto()
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in out.graph.initializer)
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 6, 6)).astype(np.float32)}
    for got, expected in zip(run(make_session(out), x).values(), run(make_session(proto), x).values()):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_an_encoding_kept_as_a_scratch_map_is_shared_by_its_readers_not_copied():
    """The readers of one weight (an unrolled recurrence's Gemms) each get a DequantizeLinear of
    the same stored encoding: its map, not one copy each (captcha_crnn's twins: +143 MB)."""
    import onnx_graphsurgeon as gs

    from onnxslim_kit.passes._quant.qdq import dequantize_constant
    from onnxslim_kit.streaming import ScratchArrays

    model = Model.from_proto(_opset12())
    scratch = ScratchArrays()
    stored = scratch.put(np.arange(64, dtype=np.int8).reshape(8, 8))
    outs = [dequantize_constant(model, model.graph, stored, np.full(8, 0.1, np.float32), 0, "w") for _ in range(2)]
    readers = [out.inputs[0].inputs[0] for out in outs]
    assert all(isinstance(q, gs.Constant) and q.values is stored for q in readers)
    plain = np.ones((8, 8), np.int8)
    copied = dequantize_constant(model, model.graph, plain, np.full(8, 0.1, np.float32), 0, "w").inputs[0].inputs[0]
    assert copied.values is not plain and np.array_equal(copied.values, plain)  # an array in memory: copied
