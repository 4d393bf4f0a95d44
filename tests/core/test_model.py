"""Loading, normalising and saving models; bad input gives UserError with a clear message."""

import numpy as np
import onnx
import pytest
from conftest import parse

from onnxslim_kit.errors import UserError
from onnxslim_kit.model import Model, load_proto, save_proto

TINY = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2,3] x) => (float[2,3] y) {
  c = Constant <value = float[3] {1.0, 2.0, 3.0}> ()
  y = Add (x, c)
}
"""


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_proto(tmp_path / "nope.onnx")


@pytest.mark.parametrize("content", [b"", b"\x00\x01garbage" * 50, b"hello world, not a model"])
def test_not_a_model(tmp_path, content):
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(UserError, match="bad.onnx"):
        load_proto(path)


def test_random_bytes_and_truncation(tmp_path):
    rng = np.random.default_rng(0)
    good = parse(TINY).SerializeToString()
    for i, blob in enumerate([rng.bytes(4096), good[: len(good) // 2]]):
        path = tmp_path / f"x{i}.onnx"
        path.write_bytes(blob)
        with pytest.raises(UserError):
            load_proto(path)


def test_old_opset_is_refused(tmp_path):
    model = parse(TINY.replace('"" : 13', '"" : 6').replace("ir_version: 8", "ir_version: 3"))
    path = tmp_path / "old.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(UserError, match="opset 6 is older"):
        load_proto(path)


def test_constant_nodes_become_initializers():
    model = Model.from_proto(parse(TINY))
    assert [n.op for n in model.graph.nodes] == ["Add"]
    assert any("Constant nodes" in note for note in model.load_notes)
    out = model.to_proto()
    assert [t.name for t in out.graph.initializer] == ["c"]
    onnx.checker.check_model(out, full_check=True)


def test_initializers_listed_as_inputs_are_dropped():
    proto = parse(TINY)
    proto = onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Add", ["x", "w"], ["y"])], "g",
            [onnx.helper.make_tensor_value_info("x", 1, [3]), onnx.helper.make_tensor_value_info("w", 1, [3])],
            [onnx.helper.make_tensor_value_info("y", 1, [3])],
            [onnx.numpy_helper.from_array(np.ones(3, np.float32), "w")],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 9)], ir_version=3,
    )
    model = Model.from_proto(proto)
    assert [t.name for t in model.graph.inputs] == ["x"]
    assert any("graph inputs" in note for note in model.load_notes)


def test_fresh_names_are_unique():
    model = Model.from_proto(parse(TINY))
    names = {model.fresh_name("fuse/x") for _ in range(100)}
    assert len(names) == 100 and not names & {"x", "y", "c"}


def test_save_is_atomic_and_leaves_no_temp(tmp_path):
    proto = parse(TINY)
    path = save_proto(proto, tmp_path / "out.onnx")
    assert load_proto(path).graph.node[0].op_type == "Constant"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]


def add_model(weight: np.ndarray) -> onnx.ModelProto:
    """``y = x + w`` with a 1-D weight."""
    return onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Add", ["x", "w"], ["y"])], "g",
            [onnx.helper.make_tensor_value_info("x", 1, [weight.size])],
            [onnx.helper.make_tensor_value_info("y", 1, [weight.size])],
            [onnx.numpy_helper.from_array(weight, "w")],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 13)],
    )


def test_external_data_round_trip(tmp_path):
    big = np.arange(4096, dtype=np.float32)
    proto = add_model(big)
    path = save_proto(proto, tmp_path / "ext.onnx", external_data=True)
    assert (tmp_path / "ext.onnx.data").stat().st_size >= big.nbytes
    assert proto.graph.initializer[0].HasField("raw_data")  # the caller's proto is left as it was
    loaded = load_proto(path)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(loaded.graph.initializer[0]), big)
    (tmp_path / "ext.onnx.data").unlink()
    with pytest.raises(UserError, match="external data"):
        load_proto(path)


def test_rewriting_an_output_inline_removes_its_old_data_file(tmp_path):
    """An output first written with external data, then inline, leaves no stale ``.data``;
    a ``.data`` file the old output did not name is left alone."""
    big = np.arange(4096, dtype=np.float32)
    proto = add_model(big)
    path = save_proto(proto, tmp_path / "out.onnx", external_data=True)
    assert (tmp_path / "out.onnx.data").exists()
    save_proto(proto, path, external_data=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.onnx"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(load_proto(path).graph.initializer[0]), big)
    (tmp_path / "out.onnx.data").write_bytes(b"someone else's file")
    save_proto(proto, path, external_data=False)
    assert (tmp_path / "out.onnx.data").read_bytes() == b"someone else's file"


def test_subgraphs_are_visited():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (bool c, float[2] x) => (float[2] y) {
      y = If (c) <
        then_branch = t () => (float[2] a) { k = Constant <value = float[2] {1.0, 1.0}> ()
                                             a = Add (x, k) },
        else_branch = e () => (float[2] b) { b = Identity (x) }
      >
    }
    """
    model = Model.from_proto(parse(text))
    graphs = list(model.all_graphs())
    assert len(graphs) == 3
    assert any("1 Constant" in n for n in model.load_notes)


def test_external_data_with_only_small_tensors(tmp_path):
    path = save_proto(parse(TINY), tmp_path / "small.onnx", external_data=True)
    assert load_proto(path).graph.node[0].op_type == "Constant"


def test_constants_read_by_two_subgraphs_are_written_once():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (bool c, float[256] x) => (float[256] y) {
      w = Constant <value = float[256] {%s}> ()
      y = If (c) <
        then_branch = t () => (float[256] a) { a = Add (x, w) },
        else_branch = e () => (float[256] b) { b = Mul (x, w) }
      >
    }
    """ % ", ".join(str(float(i)) for i in range(256))
    proto = parse(text)
    out = Model.from_proto(proto).to_proto()
    onnx.checker.check_model(out, full_check=True)
    assert out.ByteSize() < proto.ByteSize() + 200  # one copy of w, not three
    assert [t.name for t in out.graph.initializer] == ["w"]


def _big_model(value: float) -> onnx.ModelProto:
    return onnx.helper.make_model(
        onnx.helper.make_graph(
            [onnx.helper.make_node("Add", ["x", "w"], ["y"])], "g",
            [onnx.helper.make_tensor_value_info("x", 1, [4096])],
            [onnx.helper.make_tensor_value_info("y", 1, [4096])],
            [onnx.numpy_helper.from_array(np.full(4096, value, np.float32), "w")],
        ),
        opset_imports=[onnx.helper.make_opsetid("", 13)],
    )


def test_external_data_rewrite_never_pairs_old_model_with_new_data(tmp_path, monkeypatch):
    import onnxslim_kit.model as model_mod

    out = tmp_path / "o.onnx"
    save_proto(_big_model(1.0), out, external_data=True)
    real_replace = model_mod.os.replace

    def interrupted_after_data(src, dst):
        real_replace(src, dst)
        if str(dst).endswith(".data"):
            raise KeyboardInterrupt  # the process dies between the two renames

    monkeypatch.setattr(model_mod.os, "replace", interrupted_after_data)
    with pytest.raises(KeyboardInterrupt):
        save_proto(_big_model(2.0), out, external_data=True)
    monkeypatch.undo()
    assert not out.exists()  # no model under the output name, rather than old model + new weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.onnx.data"]
    save_proto(_big_model(3.0), out, external_data=True)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(load_proto(out).graph.initializer[0]), 3.0)


WEIGHTED = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2, 64] x) => (float[2, 16] y) {
  h = MatMul (x, W)
  y = Reshape (h, shape)
}
"""


def test_weightless_export_copies_no_float_weights_and_restores_them():
    proto = onnx.parser.parse_model(WEIGHTED)
    w = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    proto.graph.initializer.extend([onnx.numpy_helper.from_array(w, "W"),
                                    onnx.numpy_helper.from_array(np.array([2, 16], np.int64), "shape")])
    model = Model.from_proto(proto)
    full = model.to_proto().SerializeToString()
    light = model.to_proto(weights=False)
    by_name = {t.name: t for t in light.graph.initializer}
    assert by_name["W"].data_location == onnx.TensorProto.EXTERNAL and not by_name["W"].raw_data
    assert list(by_name["W"].dims) == [64, 16]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(by_name["shape"]), [2, 16])  # shape data kept
    assert light.ByteSize() < 1000 < w.nbytes
    inferred = onnx.shape_inference.infer_shapes(light, strict_mode=True, data_prop=True)
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [2, 16]
    assert model.to_proto().SerializeToString() == full  # the weights are back, unchanged


def _weighty_model() -> Model:
    """x → MatMul(W float 2 KB) → MatMul(DequantizeLinear(q int8 2 KB)) → Gather(idx int64 1.3 KB)."""
    rng = np.random.default_rng(3)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "W"),
        onnx.numpy_helper.from_array(rng.integers(-127, 127, (32, 64)).astype(np.int8), "q"),
        onnx.numpy_helper.from_array(np.float32(0.01), "s"),
        onnx.numpy_helper.from_array((np.arange(160) % 2).astype(np.int64), "idx"),
    ]
    h = onnx.helper
    nodes = [h.make_node("MatMul", ["x", "W"], ["y"]), h.make_node("DequantizeLinear", ["q", "s"], ["d"]),
             h.make_node("MatMul", ["y", "d"], ["z"]), h.make_node("Gather", ["z", "idx"], ["out"], axis=0)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 16])],
                         [h.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [160, 64])], inits)
    return Model.from_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]))


def test_session_proto_runs_like_the_full_proto_without_the_weights():
    from onnxslim_kit.runtime import make_session, run
    from onnxslim_kit.verify import checker_error

    model = _weighty_model()
    proto, arrays = model.session_proto()
    inits = {t.name: t for t in proto.graph.initializer}
    assert sorted(arrays) == ["W", "q"]  # float and int8 weights stay out of the proto
    assert inits["W"].data_location == onnx.TensorProto.EXTERNAL and not inits["W"].raw_data
    assert inits["q"].data_location == onnx.TensorProto.EXTERNAL
    # integer tensors shape inference may read keep their values
    assert inits["idx"].data_location != onnx.TensorProto.EXTERNAL
    assert np.array_equal(onnx.numpy_helper.to_array(inits["idx"]), np.arange(160) % 2)
    assert checker_error(proto) is None
    sample = {"x": np.random.default_rng(4).standard_normal((2, 16)).astype(np.float32)}
    got = run(make_session(proto, arena=False, arrays=arrays), sample)["out"]
    want = run(make_session(model.to_proto()), sample)["out"]
    assert np.array_equal(got, want) and np.abs(want).max() > 0
    # the model's arrays were only read
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.to_proto().graph.initializer)


def test_verifier_checks_a_model_like_its_proto():
    from onnxslim_kit.verify import Verifier

    model = _weighty_model()
    original = model.to_proto()
    samples = [{"x": np.random.default_rng(i).standard_normal((2, 16)).astype(np.float32)} for i in range(2)]
    verifier = Verifier(original, samples)
    for tensor in model.graph.tensors().values():
        if tensor.name == "W":
            tensor.values = tensor.values * np.float32(1.5)
    by_model = verifier.check(model, lossless=True).to_dict()
    by_proto = verifier.check(model.to_proto(), lossless=True).to_dict()
    assert by_model == by_proto and by_model["status"] == "failed"

