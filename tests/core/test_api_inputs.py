"""optimize() given a ModelProto is checked and upgraded as a file is; its data errors name their role."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import parse

import onnxslim_kit
from onnxslim_kit.errors import UserError

OLD = """
<ir_version: 3, opset_import: ["" : 6]>
g (float[2,4] x) => (float[2,4] y) {
  r = Relu (x)
  y = Identity (r)
}
"""

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,4] y) { y = Relu (x) }
"""


def test_an_old_opset_proto_is_upgraded_like_a_file():
    proto, report = onnxslim_kit.optimize(parse(OLD), "fuse")
    assert max(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) >= 7
    assert any("upgraded" in note for note in report.load_notes)
    assert [n.op_type for n in proto.graph.node] == ["Relu"]


def test_a_proto_that_is_not_a_model_is_one_line():
    with pytest.raises(UserError, match="not an ONNX model"):
        onnxslim_kit.optimize(onnx.ModelProto(), "fuse")


@pytest.mark.parametrize("bad", [[1, 2], [{"x": "text"}]])
def test_evaluation_data_errors_say_evaluation(bad):
    with pytest.raises(UserError, match="evaluation sample"):
        onnxslim_kit.optimize(parse(MODEL), "fuse", calib=[{"x": np.ones((2, 4), np.float32)}], eval_data=bad)
