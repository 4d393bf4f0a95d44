"""``fuse`` on old model-zoo exports (issue 15, item 11).

onnx's ``light_*`` models (IR 3, opset 9) list every initializer as a graph input too and make
their weights with ``ConstantOfShape`` from a small shape initializer. A constant read in a
layer's weight slot (Conv / Gemm / BN parameters …) is materialized even when it is much larger
than the node making it — ONNX Runtime materializes it at load anyway — so BatchNormalization
folds into the Conv before it, as OnnxSlim does; a large ``ConstantOfShape`` read by an
elementwise op is still left alone (the growth rule is unchanged there).

Each case: the op counts, ``check_model(full_check=True)``, the pipeline's verification and ONNX
Runtime equality (rtol = 1e-5) against the original on random inputs.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from conftest import assert_same_outputs, random_feeds
from onnx import TensorProto, helper, numpy_helper

import onnxslim_kit

C, K = 16, 8


def _ir3_model(nodes, inits: dict, out_shape, extra_inputs=()) -> onnx.ModelProto:
    """An IR-3 / opset-9 model whose initializers are graph inputs too (as IR 3 requires)."""
    tensors = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, 6, 6]), *extra_inputs]
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in tensors]
    graph = helper.make_graph(nodes, "zoo", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)
    onnx.checker.check_model(model, full_check=True)
    return model


def _cos(shape_name: str, out: str, value: float) -> onnx.NodeProto:
    return helper.make_node("ConstantOfShape", [shape_name], [out],
                            value=numpy_helper.from_array(np.array([value], np.float32)))


def _fuse(model):
    out, report = onnxslim_kit.optimize(model, passes="fuse", num_samples=2, verify_samples=2)
    entry = report.passes[0]
    assert not entry.rolled_back, entry.verification
    assert entry.verification["status"] == "ok", entry.verification
    onnx.checker.check_model(out, full_check=True)
    assert_same_outputs(model, out, random_feeds(model), rtol=1e-5, atol=1e-5)
    return out, entry


def _ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def test_bn_folds_into_conv_whose_weight_is_constant_of_shape():
    # W: [K, C, 3, 3] float = 4608 bytes made from an 32-byte shape: "much larger than its inputs"
    rng = np.random.default_rng(0)
    inits = {
        "w_shape": np.array([K, C, 3, 3], np.int64), "b_shape": np.array([K], np.int64),
        "gamma": rng.uniform(0.5, 2, K).astype(np.float32), "beta": rng.standard_normal(K).astype(np.float32),
        "mean": rng.standard_normal(K).astype(np.float32), "var": rng.uniform(0.5, 2, K).astype(np.float32),
    }
    nodes = [
        _cos("w_shape", "w", 0.02), _cos("b_shape", "b", 0.1),
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["y"], epsilon=1e-5),
    ]
    model = _ir3_model(nodes, inits, [1, K, 6, 6])
    out, entry = _fuse(model)
    assert _ops(out) == {"Conv": 1}
    assert entry.rewrites.get("bn→conv") == 1
    assert not out.graph.input[1:], [i.name for i in out.graph.input]


def test_bn_parameters_from_constant_of_shape_fold_too():
    # every BN parameter made by ConstantOfShape (light_resnet50), Conv weight too
    inits = {"w_shape": np.array([K, C, 3, 3], np.int64), "p_shape": np.array([K], np.int64)}
    nodes = [
        _cos("w_shape", "w", 0.02), _cos("p_shape", "g", 1.5), _cos("p_shape", "be", 0.25),
        _cos("p_shape", "m", 0.1), _cos("p_shape", "v", 2.0),
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "be", "m", "v"], ["y"]),
    ]
    out, _ = _fuse(_ir3_model(nodes, inits, [1, K, 6, 6]))
    assert _ops(out) == {"Conv": 1}


def test_gemm_weight_from_constant_of_shape_is_materialized():
    # light_bvlc_alexnet's fc layers: Gemm(x, ConstantOfShape) → one Gemm, as OnnxSlim leaves it
    inits = {"w_shape": np.array([64, C * 36], np.int64), "b_shape": np.array([64], np.int64),
             "flat": np.array([1, C * 36], np.int64)}
    nodes = [
        _cos("w_shape", "w", 0.01), _cos("b_shape", "b", 0.5),
        helper.make_node("Reshape", ["x", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1),
    ]
    out, _ = _fuse(_ir3_model(nodes, inits, [1, 64]))
    assert _ops(out) == {"Reshape": 1, "Gemm": 1}


def test_large_constant_of_shape_read_by_elementwise_op_stays():
    # not a weight slot: the growth rule still keeps the 9216-byte zeros as one ConstantOfShape
    inits = {"s": np.array([1, C, 12, 12], np.int64)}
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, C, 12, 12])
    nodes = [_cos("s", "k", 0.5), helper.make_node("Add", ["z", "k"], ["y"])]
    model = _ir3_model(nodes, inits, [1, C, 12, 12], extra_inputs=[z])
    out, entry = _onnx_fuse_unchecked(model)
    assert _ops(out) == {"ConstantOfShape": 1, "Add": 1}
    assert entry.skipped.get("constant folding: result much larger than its inputs") == 1


def _onnx_fuse_unchecked(model):
    out, report = onnxslim_kit.optimize(model, passes="fuse", num_samples=1, verify_samples=1)
    assert_same_outputs(model, out, random_feeds(model), rtol=1e-5, atol=1e-5)
    return out, report.passes[0]


def test_bn_after_concat_of_unannotated_tensors_becomes_mul_add_and_folds_on():
    # light_densenet121: Concat → BN → Mul → Add (a scale layer), no intermediate shapes recorded.
    # The Concat's rank is its inputs' rank, so the BN becomes Mul + Add and the scale layer's
    # Mul / Add merge into those: 2 nodes for BN + Mul + Add (OnnxSlim leaves all three).
    rng = np.random.default_rng(1)
    inits = {
        "w": rng.standard_normal((K, C, 1, 1)).astype(np.float32),
        "gamma": rng.uniform(0.5, 2, 2 * K).astype(np.float32), "beta": rng.standard_normal(2 * K).astype(np.float32),
        "mean": rng.standard_normal(2 * K).astype(np.float32), "var": rng.uniform(0.5, 2, 2 * K).astype(np.float32),
        "k": rng.uniform(0.5, 2, (2 * K, 1, 1)).astype(np.float32), "c": rng.standard_normal((2 * K, 1, 1)).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"]), helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Conv", ["r", "w"], ["b"]),
        helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
        helper.make_node("BatchNormalization", ["cat", "gamma", "beta", "mean", "var"], ["n"]),
        helper.make_node("Mul", ["n", "k"], ["s"]), helper.make_node("Add", ["s", "c"], ["y"]),
    ]
    out, entry = _fuse(_ir3_model(nodes, inits, [1, 2 * K, 6, 6]))
    assert entry.rewrites.get("bn→mul+add") == 1
    assert _ops(out) == {"Conv": 2, "Relu": 1, "Concat": 1, "Mul": 1, "Add": 1}


def test_weight_read_through_reshape_is_materialized():
    # light_inception_v1's classifier: ConstantOfShape [1, 1, 64, 576] → Reshape [64, 576] → Gemm
    inits = {"w_shape": np.array([1, 1, 64, C * 36], np.int64), "w2d": np.array([64, C * 36], np.int64),
             "flat": np.array([1, C * 36], np.int64), "b": np.linspace(-1, 1, 64).astype(np.float32)}
    nodes = [
        _cos("w_shape", "w4", 0.01), helper.make_node("Reshape", ["w4", "w2d"], ["w"]),
        helper.make_node("Reshape", ["x", "flat"], ["f"]),
        helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1),
    ]
    out, _ = _fuse(_ir3_model(nodes, inits, [1, 64]))
    assert _ops(out) == {"Reshape": 1, "Gemm": 1}


def test_lone_add_then_mul_is_left_and_mul_mul_merges():
    # condition 3 of affine_chain: Add → Mul would stay two nodes; Mul → Mul → Add becomes Mul → Add
    rng = np.random.default_rng(2)
    inits = {"t": rng.standard_normal((C, 1, 1)).astype(np.float32), "k": rng.uniform(1, 2, (C, 1, 1)).astype(np.float32),
             "k2": np.float32(0.5), "c": rng.standard_normal((C, 1, 1)).astype(np.float32)}
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, C, 6, 6])
    nodes = [
        helper.make_node("Add", ["x", "t"], ["a"]), helper.make_node("Mul", ["a", "k"], ["m"]),
        helper.make_node("Mul", ["z", "k"], ["p"]), helper.make_node("Mul", ["p", "k2"], ["q"]),
        helper.make_node("Add", ["q", "c"], ["r"]), helper.make_node("Add", ["m", "r"], ["y"]),
    ]
    out, entry = _fuse(_ir3_model(nodes, inits, [1, C, 6, 6], extra_inputs=[z]))
    assert entry.rewrites.get("mul/add chain merged") == 1
    assert _ops(out) == {"Add": 3, "Mul": 2}


def test_layers_with_weights_equal_by_value_each_take_their_bn():
    # light_resnet50: every weight is ConstantOfShape(0.02), so materialized weights of one shape
    # are equal; they are merged into one tensor only after the BN folds of the round
    rng = np.random.default_rng(3)
    inits = {"w_shape": np.array([C, C, 3, 3], np.int64)}
    nodes = [_cos("w_shape", "w1", 0.02), _cos("w_shape", "w2", 0.02)]
    for i, w in enumerate(("w1", "w2")):
        for p, v in (("g", rng.uniform(0.5, 2, C)), ("b", rng.standard_normal(C)), ("m", rng.standard_normal(C)),
                     ("v", rng.uniform(0.5, 2, C))):
            inits[f"{p}{i}"] = v.astype(np.float32)
        src = "x" if i == 0 else "r0"
        nodes += [helper.make_node("Conv", [src, w], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}", f"g{i}", f"b{i}", f"m{i}", f"v{i}"],
                                   [f"r{i}" if i == 0 else "y"])]
    out, entry = _fuse(_ir3_model(nodes, inits, [1, C, 6, 6]))
    assert entry.rewrites.get("bn→conv") == 2
    assert _ops(out) == {"Conv": 2}


# --- item 12: shape arithmetic OnnxSlim folds ------------------------------------------------------

CAST_RESHAPE = """<ir_version: 8, opset_import: ["" : 13]>
g (float[N,3,4] x) => (float[N,12] y) <int64[1] i0 = {{0}}, int64[1] tail = {{{tail}}}> {{
  s = Shape(x)
  b = Gather(s, i0)
  bf = Cast<to={to}>(b)
  bi = Cast<to=7>(bf)
  t = Concat<axis=0>(bi, tail)
  e = Reshape(x, t)
  y = Relu(e)
}}"""


def _cast_reshape(to: int, tail: int):
    model = onnx.parser.parse_model(CAST_RESHAPE.format(to=to, tail=tail))
    onnx.checker.check_model(model, full_check=True)
    out, entry = onnxslim_kit.optimize(model, passes="fuse", num_samples=2, verify_samples=2,
                                       input_shapes={"x": [5, 3, 4]})
    feeds = {"x": np.random.default_rng(4).standard_normal((7, 3, 4)).astype(np.float32)}  # another N
    assert_same_outputs(model, out, feeds, rtol=1e-6, atol=0)
    return out, entry.passes[0]


def test_reshape_target_through_cast_round_trip_becomes_constant():
    # x.view(int(x.size(0)), 12) as torch exports it: N → float → int64, 7 nodes → 2 (as OnnxSlim)
    out, entry = _cast_reshape(TensorProto.FLOAT, 12)
    assert _ops(out) == {"Reshape": 1, "Relu": 1}
    assert entry.rewrites.get("reshape target made constant") == 1
    reshape = next(n for n in out.graph.node if n.op_type == "Reshape")
    target = next(i for i in out.graph.initializer if i.name == reshape.input[1])
    assert numpy_helper.to_array(target).tolist() == [0, 12]


def test_reshape_target_through_float32_cast_with_minus_one_is_kept():
    # [float32(N), -1]: a -1 could absorb an N > 2^24 that float32 rounds: the target stays
    out, entry = _cast_reshape(TensorProto.FLOAT, -1)
    assert _ops(out)["Cast"] == 2 and _ops(out)["Reshape"] == 1


def test_reshape_target_through_float64_cast_with_minus_one_folds():
    out, _ = _cast_reshape(TensorProto.DOUBLE, -1)
    assert _ops(out) == {"Reshape": 1, "Relu": 1}
