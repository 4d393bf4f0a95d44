"""``dynamic`` and the one selector: ``exclude=`` and the global ``--exclude`` leave the selected
MatMul / Gemm as they were (float, same weights), the rest become MatMulInteger; a selector
matching nothing exits 2 through the command line, in one line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from conftest import cli_error
from test_dynamic import mlp

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

NAMES = ("mm", "relu", "g1", "g2")


def named_mlp():
    model = mlp()
    for node, name in zip(model.graph.node, NAMES):
        node.name = name
    return model


def dynamic(model, options="", exclude=None):
    feed = CalibrationFeed(input_specs(model), None, num_samples=2)
    spec = f"dynamic({options})" if options else "dynamic"
    out, report = run_pipeline(model, parse_pass_list(spec), feed, exclude=exclude)
    return out, report.passes[-1]


def float_nodes(original, out) -> set:
    """Names of the float MatMul / Gemm left, each checked to read its original weight unchanged."""
    before = {t.name: numpy_helper.to_array(t) for t in original.graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    kept = set()
    for node in out.graph.node:
        if node.op_type in ("MatMul", "Gemm"):
            np.testing.assert_array_equal(after[node.input[1]], before[node.input[1]])
            kept.add(node.name)
    return kept


@pytest.mark.parametrize("option, kept", [
    ("exclude=g1", {"g1"}),
    ("exclude=op:Gemm", {"g1", "g2"}),
    ("exclude=last:Gemm:1;mm", {"mm", "g2"}),
    ("exclude=re:^g", {"g1", "g2"}),
])
def test_exclude_keeps_nodes_float(option, kept):
    model = named_mlp()
    out, rep = dynamic(model, option)
    assert float_nodes(model, out) == kept
    assert sum(rep.rewrites.values()) == 3 - len(kept)
    assert rep.skipped["excluded by exclude"] == len(kept)
    assert sum(n.op_type == "MatMulInteger" for n in out.graph.node) == 3 - len(kept)


def test_exclude_all_is_lossless():
    model = named_mlp()
    out, rep = dynamic(model, "exclude=all")
    assert not rep.modified and rep.skipped["excluded by exclude"] == 3
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in model.graph.node]


def test_global_exclude():
    model = named_mlp()
    out, rep = dynamic(model, "exclude=mm", exclude=["g2"])
    assert float_nodes(model, out) == {"mm", "g2"}
    assert rep.skipped["excluded by exclude"] == 1 and rep.skipped["excluded by --exclude"] == 1
    assert rep.rewrites["Gemm→MatMulInteger"] == 1


def test_exclude_reaches_if_bodies():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (bool c, float[2, 64] x) => (float[2, 32] y) {
        y = If (c) <
            then_branch = t () => (float[2, 32] a) { a = MatMul(x, w1) },
            else_branch = e () => (float[2, 32] b) { b = MatMul(x, w2) }
        >
    }
    """
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(1)
    model.graph.initializer.extend(numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), n)
                                   for n in ("w1", "w2"))
    branches = {a.name: a.g for a in model.graph.node[0].attribute}
    branches["then_branch"].node[0].name, branches["else_branch"].node[0].name = "then_mm", "else_mm"
    onnx.checker.check_model(model, full_check=True)
    out, rep = dynamic(model, "exclude=else_mm")
    assert rep.rewrites["MatMul→MatMulInteger"] == 1 and rep.skipped["excluded by exclude"] == 1
    bodies = {a.name: [n.op_type for n in a.g.node] for a in out.graph.node[0].attribute}
    assert bodies["else_branch"] == ["MatMul"] and "MatMulInteger" in bodies["then_branch"]


def test_selector_matching_nothing_exits_2_in_one_line(tmp_path):
    model = named_mlp()
    for passes, needle in [("dynamic(exclude=g3)", "dynamic(exclude=...): 'g3' matches no node; closest: g"),
                           ("dynamic(exclude=op:Conv)", "'op:Conv' matches no node; closest op types: "),
                           ("fuse,dynamic(exclude=re:*)", "dynamic(exclude=...): bad regular expression '*'")]:
        assert needle in cli_error(tmp_path, model, passes)
