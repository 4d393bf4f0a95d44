"""``compact`` never gives two tensors (or two nodes) one name.

A name already as short as the fresh name it would get is kept, and from then on it is
reserved: no later fresh name may be it, and a later object that already holds a name handed
out (or kept) before is renamed even where the fresh name is not shorter (issue 15, item 2).
"""

import os
from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import parse, run_ort

import onnxslim_kit

# Use counts: x 2, y 2, long_relu 3, c 2, long_abs 2 — so long_relu gets ``a``, ``c`` would get
# ``b`` (not shorter: kept), and long_abs then gets the next fresh name, which was ``c``.
# The node names play the same game: n_relu → a, c kept, n_abs → (was) c.
KEPT_SHORT = """<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[2, 3] y) {
  long_relu = Relu (x)
  c = Neg (long_relu)
  long_abs = Abs (long_relu)
  y = Add (c, long_abs)
}"""


def _with_node_names(model, names):
    for node, name in zip(model.graph.node, names):
        node.name = name
    return model


def _tiny():
    return _with_node_names(parse(KEPT_SHORT), ["n_relu", "c", "n_abs", "n_add"])


def _tensor_names(graph) -> list:
    """Every tensor definition of ``graph`` and its bodies (inputs, initializers, node outputs)."""
    names = [i.name for i in graph.input] + [t.name for t in graph.initializer]
    for node in graph.node:
        names += [o for o in node.output if o]
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names += _tensor_names(attr.g)
    return names


def _node_names(graph) -> list:
    names = [n.name for n in graph.node if n.name]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names += _node_names(attr.g)
    return names


def _duplicates(names) -> list:
    return [name for name, count in Counter(names).items() if count > 1]


def test_a_kept_short_tensor_name_is_not_handed_out_again():
    model = _tiny()
    out, report = onnxslim_kit.optimize(model, "compact")
    entry = report.passes[0]
    assert not entry.rolled_back and entry.verification["status"] == "ok"
    onnx.checker.check_model(out, full_check=True)
    names = _tensor_names(out.graph)
    assert _duplicates(names) == [] and "c" in names and max(len(n) for n in names) == 1
    feeds = {"x": np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)}
    for want, got in zip(run_ort(model, feeds), run_ort(out, feeds)):
        assert want.tobytes() == got.tobytes()


def test_a_kept_short_node_name_is_not_handed_out_again():
    """Tensor names all long here, so only the node names can collide."""
    text = KEPT_SHORT.replace("c = Neg", "long_neg = Neg").replace("(c, long_abs)", "(long_neg, long_abs)")
    model = _with_node_names(parse(text), ["n_relu", "c", "n_abs", "n_add"])
    out, report = onnxslim_kit.optimize(model, "compact")
    assert not report.passes[0].rolled_back
    names = _node_names(out.graph)
    assert len(names) == 4 and _duplicates(names) == [] and "c" in names
    assert max(len(n) for n in names) == 1


def test_a_name_already_handed_out_is_renamed_even_when_not_shorter():
    """``b`` is the fresh name of the most used tensor; the tensor already called ``b`` (used
    less) cannot keep it and gets the next fresh one. Same for the nodes."""
    text = KEPT_SHORT.replace("c = Neg (long_relu)", "b = Neg (long_relu)").replace(
        "(c, long_abs)", "(b, long_abs)")
    model = _with_node_names(parse(text.replace("(float[2, 3] x)", "(float[2, 3] a)")
                                   .replace("(x)", "(a)")), ["n_relu", "b", "n_abs", "n_add"])
    out, report = onnxslim_kit.optimize(model, "compact")
    assert not report.passes[0].rolled_back
    onnx.checker.check_model(out, full_check=True)
    assert _duplicates(_tensor_names(out.graph)) == []
    assert _duplicates(_node_names(out.graph)) == []
    feeds = {"a": np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)}
    for want, got in zip(run_ort(model, feeds), run_ort(out, feeds)):
        assert want.tobytes() == got.tobytes()


def test_names_in_bodies_are_unique_too():
    """A short name kept inside an If body is reserved for the main graph's tensors as well."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
g (float[2] x, bool f) => (float[2] y) {
  long_relu = Relu (x)
  long_neg = Neg (long_relu)
  y = If (f) <
      then_branch = t () => (float[2] then_out) {
          c = Abs (long_relu)
          then_out = Add (c, long_neg) },
      else_branch = e () => (float[2] else_out) {
          else_out = Mul (long_relu, long_neg) } >
}"""
    model = parse(text)
    out, report = onnxslim_kit.optimize(model, "compact")
    assert not report.passes[0].rolled_back
    onnx.checker.check_model(out, full_check=True)
    assert _duplicates(_tensor_names(out.graph)) == []
    for flag in (True, False):
        feeds = {"x": np.array([-1.5, 2.0], np.float32), "f": np.array(flag)}
        for want, got in zip(run_ort(model, feeds), run_ort(out, feeds)):
            assert want.tobytes() == got.tobytes()


LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                     "light_densenet121.onnx")


@pytest.mark.realmodel
@pytest.mark.skipif(not os.path.exists(LIGHT), reason="this onnx wheel ships no light models")
def test_light_densenet121_fuse_compact_is_not_rolled_back():
    """onnx's own ``light_densenet121`` names its tensors ``r0``, ``r1``, …: as short as the
    fresh names they would get, so they are kept — and must not be handed out again."""
    from onnx import numpy_helper

    model = onnx.load(LIGHT)
    out, report = onnxslim_kit.optimize(model, "fuse,compact")
    entries = {e.name: e for e in report.passes}
    assert not entries["compact"].rolled_back and entries["compact"].verification["status"] == "ok"
    assert not entries["fuse"].rolled_back
    onnx.checker.check_model(out, full_check=True)
    assert _duplicates(_tensor_names(out.graph)) == []
    assert _duplicates(_node_names(out.graph)) == []
    expected = numpy_helper.to_array(onnx.load_tensor(LIGHT.replace(".onnx", "_output_0.pb")))
    weights = {t.name for t in model.graph.initializer}  # IR 3: every weight is an input too
    (data,) = [i for i in model.graph.input if i.name not in weights]
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    feeds = {data.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    want, got = run_ort(model, feeds)[0], run_ort(out, feeds)[0]
    assert got.shape == want.shape == expected.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
