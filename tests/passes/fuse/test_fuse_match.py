"""The match / check / rewrite pieces: MatchResult, SkipOnce, RuleRun's shape side table."""

from __future__ import annotations

from test_fuse_cleanup import model

from onnxslim_kit.model import Model
from onnxslim_kit.passes._common.match import NOT_CONCERNED, MatchResult, RuleRun, SkipOnce
from onnxslim_kit.passes._common.shapes import ShapeTable
from onnxslim_kit.passes.fuse.fold_common import match_target
from onnxslim_kit.pipeline import PassResult


def test_match_result_kinds():
    ok, failed = MatchResult.of((1, 2)), MatchResult.fail("bn: shared weight")
    assert ok.ok and bool(ok) and ok.value == (1, 2) and not ok.counted
    assert not failed.ok and failed.counted and failed.reason == "bn: shared weight"
    assert not NOT_CONCERNED.ok and not NOT_CONCERNED.counted
    assert MatchResult.fail("weight not constant").prefixed("affine: ").reason == "affine: weight not constant"
    assert NOT_CONCERNED.prefixed("x: ") is NOT_CONCERNED and ok.prefixed("x: ") is ok


def test_skip_once_counts_each_node_and_reason_once():
    result = PassResult()
    skip = SkipOnce(result)
    a, b = object(), object()
    for _ in range(3):
        skip(a, "r1")
        skip(b, "r1")
        skip(a, "r2")
    assert result.skipped["r1"] == 2 and result.skipped["r2"] == 1 and len(skip) == 3


def test_rule_run_counts_failed_matches_only():
    result = PassResult()
    run = RuleRun(Model.from_proto(model("y = Relu(x)", "float[2] x", "float[2] y")), result)
    node = run.model.graph.nodes[0]
    run.skip(node, NOT_CONCERNED)
    run.skip(node, MatchResult.fail("why"))
    run.skip(node, MatchResult.fail("why"))
    assert dict(result.skipped) == {"why": 1}


def test_match_target_reasons():
    m = Model.from_proto(model("y = MatMul(x, w)", "float[N,K,4] x, float[4,3] w", "float[N,K,3] y"))
    found = match_target(m.graph.nodes[0])
    assert not found.ok and found.reason == "weight not constant"


def test_shape_table_is_a_side_table_that_follows_the_tensor():
    m = Model.from_proto(model("s = Shape(x)\n y = Relu(x)", "float[2,3] x", "int64[2] s, float[2,3] y"))
    proto_tensors = list(m.graph.tensors().values())
    run = RuleRun(m, PassResult())
    shapes = run.ensure_shapes()
    y = next(t for t in proto_tensors if t.name == "y")
    assert shapes.shape(y) == [2, 3] and shapes.static(y) == [2, 3]
    assert all("_slim_inferred" not in t.__dict__ for t in proto_tensors)  # nothing written into the tensors
    y.name = "renamed"
    assert shapes.shape(y) == [2, 3]  # keyed by the tensor, not by its name
    assert ShapeTable().shape(y) == (list(y.shape) if y.shape is not None else None)  # empty table: declared only
    assert run.ensure_shapes() is shapes  # once per run unless refreshed
    assert run.ensure_shapes(refresh=True) is not shapes
