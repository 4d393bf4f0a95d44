"""fuse: x·relu6(x+3)/6 → HardSwish (or x·HardSigmoid), relu6(x+3)/6 → HardSigmoid."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_ort
from onnx import TensorProto, helper, numpy_helper
from test_fuse_cleanup import fuse, model, ops

from onnxslim_kit.passes.fuse.hardswish import LABEL

CONSTS = ("three = Constant<value = float {3.0}>()\n zero = Constant<value = float {0.0}>()\n"
          " six = Constant<value = float {6.0}>()\n sixth = Constant<value = float {0.16666667}>()\n")
IO = ("float[2,4,5] x", "float[2,4,5] y")


def chain(last: str, opset: int = 13):
    return model(CONSTS + " a = Add(x, three)\n c = Clip(a, zero, six)\n" + last, *IO, opset=opset)


def feeds(rng):
    x = (rng.standard_normal((2, 4, 5)) * 4).astype(np.float32)
    x.reshape(-1)[:4] = [-3.0, 3.0, 0.0, -6.0]  # the kinks
    return {"x": x}


@pytest.mark.parametrize("last,opset,want", [
    (" m = Mul(x, c)\n y = Div(m, six)", 14, {"HardSwish": 1}),
    (" m = Mul(c, x)\n y = Mul(m, sixth)", 14, {"HardSwish": 1}),
    (" m = Mul(x, c)\n y = Div(m, six)", 13, {"HardSigmoid": 1, "Mul": 1}),
    (" y = Div(c, six)", 13, {"HardSigmoid": 1}),
])
def test_chain_becomes_one_op_with_close_outputs(rng, last, opset, want):
    proto = chain(last, opset)
    x = feeds(rng)
    out, entry = fuse(proto, feeds=x)
    assert entry.rewrites[LABEL] == 1
    assert dict(ops(out)) == want
    np.testing.assert_allclose(run_ort(out, x)[0], run_ort(proto, x)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("last", [
    " m = Mul(x, c)\n y = Div(m, three)",              # not a division by 6
    " m = Mul(x, c)\n d = Div(m, six)\n y = Add(d, m)",  # the product is read twice
    " m = Mul(a, c)\n y = Div(m, six)",                # times x + 3, not x
])
def test_other_chains_stay(last):
    out, entry = fuse(chain(last))
    assert LABEL not in entry.rewrites and ops(out)["Clip"] == 1


def test_clip_bounds_other_than_relu6_stay():
    proto = model(CONSTS + " a = Add(x, three)\n c = Clip(a, zero, three)\n m = Mul(x, c)\n y = Div(m, six)", *IO)
    out, entry = fuse(proto)
    assert LABEL not in entry.rewrites


def test_opset_10_clip_attributes():
    proto = model(CONSTS + " a = Add(x, three)\n c = Clip<min = 0.0, max = 6.0>(a)\n m = Mul(x, c)\n y = Div(m, six)",
                  *IO, opset=10)
    out, entry = fuse(proto)
    assert entry.rewrites[LABEL] == 1 and dict(ops(out)) == {"HardSigmoid": 1, "Mul": 1}


def test_activations_off_keeps_the_chain():
    out, entry = fuse(chain(" m = Mul(x, c)\n y = Div(m, six)"), passes="fuse(activations=false)")
    assert LABEL not in entry.rewrites and ops(out)["Clip"] == 1


def test_double_chain_stays():
    """ONNX Runtime's CPU provider has no double HardSigmoid: a double chain is left alone."""
    text = CONSTS.replace("float {", "double {") + " a = Add(x, three)\n c = Clip(a, zero, six)\n m = Mul(x, c)\n y = Div(m, six)"
    out, entry = fuse(model(text, "double[2,4,5] x", "double[2,4,5] y"))
    assert LABEL not in entry.rewrites and ops(out)["Clip"] == 1


def test_float16_chain_is_rewritten(rng):
    """(The text format has no float16 literals: the chain is built with the helper.)"""
    consts = [numpy_helper.from_array(np.array(v, np.float16), n) for n, v in (("three", 3), ("zero", 0), ("six", 6))]
    nodes = [helper.make_node("Add", ["x", "three"], ["a"]), helper.make_node("Clip", ["a", "zero", "six"], ["c"]),
             helper.make_node("Mul", ["x", "c"], ["m"]), helper.make_node("Div", ["m", "six"], ["y"])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [2, 4, 5]) for n in ("x", "y")]
    proto = helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:], consts),
                              opset_imports=[helper.make_opsetid("", 14)])
    x = {"x": feeds(rng)["x"].astype(np.float16)}
    out, entry = fuse(proto, feeds=x)
    assert entry.rewrites[LABEL] == 1 and dict(ops(out)) == {"HardSwish": 1}
