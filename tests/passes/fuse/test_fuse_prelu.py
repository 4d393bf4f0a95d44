"""fuse: PRelu with a constant slope → LeakyRelu / Mul+Max / Relu+Min·Mul+Add, the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_ort
from test_fuse_cleanup import fuse, model, ops

import onnxslim_kit
from onnxslim_kit.passes.fuse.prelu import LABEL


def prelu_model(slope: list, slope_type: str = "float"):
    values = ", ".join(str(v) for v in slope)
    return model(
        f"s = Constant<value = {slope_type}[4,1,1] {{{values}}}>()\n y = PRelu(x, s)",
        "float[2,4,3,3] x", "float[2,4,3,3] y")


def feeds_with_edges(rng) -> dict:
    x = rng.standard_normal((2, 4, 3, 3)).astype(np.float32) * 3
    x.reshape(-1)[:4] = [0.0, -0.0, 1e-30, -1e-30]
    return {"x": x}


@pytest.mark.parametrize("slope,new_ops", [
    ([0.25, 0.25, 0.25, 0.25], {"LeakyRelu": 1}),
    ([0.0, 0.1, 0.5, 1.0], {"Mul": 1, "Max": 1}),
    ([-0.3, 0.2, 1.2, 0.0], {"Relu": 1, "Min": 1, "Mul": 1, "Add": 1}),
])
def test_prelu_rewritten_with_equal_outputs(rng, slope, new_ops):
    proto = prelu_model(slope)
    feeds = feeds_with_edges(rng)
    out, entry = fuse(proto, feeds=feeds)
    assert entry.rewrites[LABEL] == 1
    assert dict(ops(out)) == new_ops
    want, got = run_ort(proto, feeds)[0], run_ort(out, feeds)[0]
    np.testing.assert_array_equal(got, want)  # exact, not within a tolerance


def test_prelu_with_a_slope_from_the_graph_input_stays():
    proto = model("y = PRelu(x, s)", "float[2,4,3,3] x, float[4,1,1] s", "float[2,4,3,3] y")
    out, entry = fuse(proto)
    assert ops(out) == {"PRelu": 1}
    assert entry.skipped["prelu: slope not constant"] == 1


def test_prelu_option_off_keeps_prelu():
    out, entry = fuse(prelu_model([-0.3, 0.2, 1.2, 0.0]), passes="fuse(activations=false)")
    assert ops(out) == {"PRelu": 1} and LABEL not in entry.rewrites


def test_slope_not_exact_in_float32_is_not_made_leaky_relu():
    """LeakyRelu's alpha is a float32: a double slope of 0.1 would change (ORT has no double
    PRelu kernel, so this is checked on the graph only)."""
    proto = model("s = Constant<value = double[1] {0.1}>()\n y = PRelu(x, s)", "double[2,3] x", "double[2,3] y")
    out, _ = onnxslim_kit.optimize(proto, passes="fuse", verify=False)
    assert ops(out) == {"Mul": 1, "Max": 1}


def test_prelu_inside_an_if_body_is_rewritten(rng):
    from onnx import TensorProto, helper, numpy_helper

    slope = numpy_helper.from_array(np.array([-0.3, 0.2, 1.2, 0.0], np.float32).reshape(4, 1, 1), "s")
    body = helper.make_graph([helper.make_node("PRelu", ["x", "s"], ["t_y"])], "t", [],
                             [helper.make_tensor_value_info("t_y", TensorProto.FLOAT, [2, 4, 3, 3])], [slope])
    other = helper.make_graph([helper.make_node("Relu", ["x"], ["e_y"])], "e", [],
                              [helper.make_tensor_value_info("e_y", TensorProto.FLOAT, [2, 4, 3, 3])])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 3, 3]),
         helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 3, 3])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": feeds_with_edges(rng)["x"], "c": np.array(True)}
    out, entry = fuse(proto, feeds=feeds)
    assert entry.rewrites[LABEL] == 1
    then = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert ops(out, then) == {"Relu": 1, "Min": 1, "Mul": 1, "Add": 1}
    np.testing.assert_array_equal(run_ort(out, feeds)[0], run_ort(proto, feeds)[0])
