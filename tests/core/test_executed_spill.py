"""executed's session of a model whose weights lie partly on disk (anchored) and partly in
memory (a pass's new int8 weights): the in-memory ones go to a spill file ORT maps, never to
arrays ORT copies — the same counts."""

from __future__ import annotations

import onnx
import onnxruntime as ort
from onnx import numpy_helper
from test_executed import FUSED, qdq_conv

from onnxslim_kit import executed as executed_mod
from onnxslim_kit.executed import executed
from onnxslim_kit.model import load_proto


def mixed_model(tmp_path):
    """(executed of ``qdq_conv`` in memory, ``qdq_conv`` saved with external data, loaded lazily (weights anchored), its int8 conv
    weight then replaced by an in-memory copy (as a pass's result holds it))"""
    model = qdq_conv(FUSED)
    for tensor in model.graph.initializer:  # raw bytes: only those go to external data
        tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name))
    wq = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "wq"))
    expected = executed(model)
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    lazy = load_proto(path, lazy=True)
    for tensor in lazy.graph.initializer:
        if tensor.name == "wq":
            tensor.CopyFrom(numpy_helper.from_array(wq, "wq"))
    return expected, lazy


def test_in_memory_weights_beside_anchored_ones_are_spilled_not_copied(tmp_path, monkeypatch):
    monkeypatch.setattr("onnxslim_kit.runtime.SPLIT_MIN_BYTES", 1)  # the tiny weights count as large
    expected, lazy = mixed_model(tmp_path)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in lazy.graph.initializer)
    assert any(t.name == "wq" and t.data_location != onnx.TensorProto.EXTERNAL for t in lazy.graph.initializer)

    def refuse(*_a, **_k):
        raise AssertionError("weights handed to ORT as arrays (a copy)")

    monkeypatch.setattr(ort.SessionOptions, "add_external_initializers", refuse)
    held = []
    real = executed_mod._hand_over
    monkeypatch.setattr(executed_mod, "_hand_over", lambda *a: held.append(real(*a)) or held[-1])
    assert executed(lazy) == expected
    assert held == [[]]  # nothing kept alive in memory for the session
