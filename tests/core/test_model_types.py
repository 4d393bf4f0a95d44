"""Values that are not plain tensors (optional, sequence, map) survive load → export (issue 15 item 4).

onnx-graphsurgeon imports such a value with a partial type (an optional's element as its
dtype, a sequence's element shape dropped, a map's key lost) and its exporter raises
UnboundLocalError for an optional or a map; it also drops ``TYPE_PROTO`` attributes
(``Optional<type=…>``). :class:`Model` keeps the exact types and attributes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from onnxslim_kit import optimize
from onnxslim_kit.model import Model, proto_graphs
from conftest import parse, run_ort

# onnx's backend test test_if_opt (onnx.backend.test.case.node.if_), written as ONNX text
IF_OPT = """
<ir_version: 8, opset_import: ["" : 16]>
test_if_opt (bool cond) => (optional(seq(float[5])) sequence) {
   sequence = If (cond) <else_branch: graph = else_body () => (optional(seq(float[5])) else_opt) {
      x = Constant <value: tensor = float[5] {1,2,3,4,5}> ()
      else_seq = SequenceConstruct (x)
      else_opt = Optional (else_seq)
   }, then_branch: graph = then_body () => (optional(seq(float[5])) optional_empty) {
      optional_empty = Optional <type: type_proto = seq(float[5])> ()
   }>
}
"""

SEQ_INPUT = """
<ir_version: 8, opset_import: ["" : 16]>
g (seq(float[2]) s) => (float[2] y, seq(float[2]) back) {
  i = Constant <value = int64 {0}> ()
  t = SequenceAt (s, i)
  y = Relu (t)
  back = Identity (s)
}
"""

OPTIONAL_INPUT = """
<ir_version: 8, opset_import: ["" : 16]>
g (optional(float[2]) s) => (bool y, optional(float[2]) same) {
  y = OptionalHasElement (s)
  same = Identity (s)
}
"""

SEQ_OF_SEQ = """
<ir_version: 8, opset_import: ["" : 16]>
g (optional(seq(float[3])) s) => (optional(seq(float[3])) z) {
  z = Identity (s)
}
"""

MAP_OUTPUT = """
<ir_version: 8, opset_import: ["" : 13, "ai.onnx.ml" : 3]>
g (float[1,2] x) => (seq(map(int64, float)) z) {
  z = ai.onnx.ml.ZipMap <classlabels_int64s = [3, 7]> (x)
}
"""


SEQ_VALUE_INFO = """
<ir_version: 8, opset_import: ["" : 16]>
g (float[2] x) => (float[2] y) <seq(float[2]) s> {
  s = SequenceConstruct (x, x)
  i = Constant <value = int64 {1}> ()
  y = SequenceAt (s, i)
}
"""


def _io_types(proto):
    return [(v.name, v.type.SerializeToString())
            for g in proto_graphs(proto.graph) for v in (*g.input, *g.output, *g.value_info)]


@pytest.mark.parametrize("text", [IF_OPT, SEQ_INPUT, OPTIONAL_INPUT, SEQ_OF_SEQ, MAP_OUTPUT, SEQ_VALUE_INFO],
                         ids=["if_opt", "seq_input", "optional_input", "optional_seq", "map_output", "seq_value_info"])
def test_types_survive_load_and_export(text):
    original = parse(text)
    before = original.SerializeToString()
    exported = Model.from_proto(original).to_proto()
    assert original.SerializeToString() == before  # the input is never modified
    onnx.checker.check_model(exported, full_check=True)
    assert _io_types(exported) == _io_types(original)
    # the snapshot a rollback restores exports the same types
    assert _io_types(Model.from_proto(original).snapshot().to_proto()) == _io_types(original)


def test_optional_type_attribute_kept():
    exported = Model.from_proto(parse(IF_OPT)).to_proto()
    then = next(a.g for a in exported.graph.node[0].attribute if a.name == "then_branch")
    (node,) = then.node
    (attr,) = node.attribute
    assert attr.type == onnx.AttributeProto.TYPE_PROTO
    assert attr.tp.sequence_type.elem_type.tensor_type.elem_type == onnx.TensorProto.FLOAT


@pytest.mark.parametrize("cond", [False, True])
def test_if_opt_through_fuse_and_compact(cond):
    """The backend test's model and data: fuse,compact give the expected outputs."""
    original = parse(IF_OPT)
    feeds = {"cond": np.array(cond)}
    result, report = optimize(original, "fuse,compact", calib=[feeds])
    assert not any(p.rolled_back for p in report.passes)
    onnx.checker.check_model(result, full_check=True)
    (got,) = run_ort(result, feeds)
    if cond:
        assert got is None
    else:
        (tensor,) = got
        np.testing.assert_array_equal(tensor, np.array([1, 2, 3, 4, 5], dtype=np.float32))


# --- models that import only ai.onnx.ml (issue 15 item 8) -------------------------------------

ML_ONLY = """
<ir_version: 8, opset_import: ["ai.onnx.ml" : 3]>
g (float[N,3] x) => (float[N,1] y) {
  y = ai.onnx.ml.LinearRegressor <coefficients = [1.0, 2.0, 3.0], intercepts = [0.5]> (x)
}
"""


def test_ai_onnx_ml_only_model_through_fuse_and_compact(tmp_path, capsys):
    from onnxslim_kit.cli import main

    original = parse(ML_ONLY)
    path, out = tmp_path / "ml.onnx", tmp_path / "out.onnx"
    path.write_bytes(original.SerializeToString())
    code = main([str(path), "--passes", "fuse,compact", "-o", str(out), "-q"])
    assert code == 0, capsys.readouterr().err
    result = onnx.load(out)
    onnx.checker.check_model(result, full_check=True)
    assert [(i.domain, i.version) for i in result.opset_import] == [("ai.onnx.ml", 3)]  # no ai.onnx import added
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_ort(result, {"x": x})[0], run_ort(original, {"x": x})[0])
    np.testing.assert_allclose(run_ort(result, {"x": x})[0], [[8.5], [26.5]], rtol=1e-6)
