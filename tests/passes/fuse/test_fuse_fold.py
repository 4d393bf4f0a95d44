"""The folding rules of ``fuse``: BatchNormalization and constant Mul/Add/Sub/Div into
Conv / ConvTranspose / Gemm / MatMul, BN → Mul + Add, MatMul + Add → Gemm.

Each positive case asserts: the rule's rewrite count (its own label), the op counts of the ops
these rules control, ``check_model(full_check=True)``, the pipeline's verification status, and
ONNX Runtime equality (rtol = atol = 1e-5) against the original on random inputs. Each
must-not-fire case asserts the reason in ``skipped`` and unchanged op counts. The other fuse
rules (cleanup, constant folding) run too, so assertions stay on labels and op types these
rules own.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import assert_same_outputs, random_feeds
from onnx import helper, numpy_helper

import onnxslim_kit

OWN_OPS = ("BatchNormalization", "Conv", "ConvTranspose", "Gemm", "MatMul", "Mul", "Add", "Sub", "Div")
RNG = np.random.default_rng(0)


# --- helpers -----------------------------------------------------------------------------

def build(body: str, inputs: str, inits: dict, opset: int = 13, outputs: str = "float y",
          const_nodes: bool = False) -> onnx.ModelProto:
    """A model from ONNX text; ``inits`` become initializers, or ``Constant`` nodes (as
    paddle2onnx writes them) when ``const_nodes``. Output shapes are left to inference."""
    text = f'<ir_version: 8, opset_import: ["" : {opset}]>\nfold ({inputs}) => ({outputs}) {{\n{body}\n}}'
    model = onnx.parser.parse_model(text)
    tensors = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    if const_nodes:
        nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in tensors]
        for i, node in enumerate(nodes):
            model.graph.node.insert(i, node)
    else:
        model.graph.initializer.extend(tensors)
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for out, done in zip(model.graph.output, inferred.graph.output):
        out.CopyFrom(done)
    onnx.checker.check_model(model, full_check=True)
    return model


def ops(model: onnx.ModelProto) -> Counter:
    return Counter(n.op_type for n in model.graph.node if n.op_type in OWN_OPS)


def fuse(model, rtol=1e-4, verify=True):
    out, report = onnxslim_kit.optimize(model, passes="fuse", num_samples=2, verify_samples=2, rtol=rtol,
                                        verify=verify)
    return out, report.passes[0]


def fused_ok(model, tol=1e-5):
    """Run fuse; check validity, verification and ORT equality; return (model, pass report)."""
    out, p = fuse(model, rtol=max(tol * 10, 1e-4))
    onnx.checker.check_model(out, full_check=True)
    assert not p.rolled_back, p.verification
    assert p.verification["status"] == "ok", p.verification
    assert_same_outputs(model, out, random_feeds(model, seed=1), rtol=tol, atol=tol)
    return out, p


def not_fired(model, reason, count=1, verify=True):
    out, p = fuse(model, verify=verify)
    assert p.skipped.get(reason) == count, p.skipped
    assert ops(out) == ops(model)
    return out, p


def rand(*shape, dtype=np.float32):
    return (RNG.standard_normal(shape) * 0.5).astype(dtype)


def bn_params(c, dtype=np.float32):
    return {
        "g": RNG.uniform(0.5, 1.5, c).astype(dtype), "b": rand(c, dtype=dtype),
        "m": rand(c, dtype=dtype), "v": RNG.uniform(0.5, 2.0, c).astype(dtype),
    }


BN = "y = BatchNormalization <epsilon = 0.001> (z, g, b, m, v)"
SPATIAL = {1: [10], 2: [6, 6], 3: [4, 4, 4]}


def dims(shape):
    return ",".join(map(str, shape))


# --- BN into Conv / ConvTranspose--------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("nd", [1, 2, 3])
@pytest.mark.parametrize("group", [1, 2, "depthwise"])
@pytest.mark.parametrize("bias", [True, False])
def test_bn_into_conv(op, nd, group, bias):
    c_in = 4
    g = c_in if group == "depthwise" else group
    c_out = 4 if group == "depthwise" else 6
    # Conv weight [C_out, C_in/g, k…]; ConvTranspose weight [C_in, C_out/g, k…]
    shape = (c_out, c_in // g) if op == "Conv" else (c_in, c_out // g)
    inits = {"W": rand(*shape, *[3] * nd), **bn_params(c_out)}
    if bias:
        inits["B"] = rand(c_out)
    geometry = f"pads = [{dims([1] * 2 * nd)}]" if op == "Conv" else f"strides = [{dims([2] * nd)}]"
    node = f"z = {op} <group = {g}, {geometry}> (x, W{', B' if bias else ''})"
    model = build(f"{node}\n{BN}", f"float[1,{c_in},{dims(SPATIAL[nd])}] x", inits)
    out, p = fused_ok(model)
    assert p.rewrites["bn→" + op.lower()] == 1
    assert ops(out) == {op: 1}


@pytest.mark.parametrize("opset", [9, 13, 17])
@pytest.mark.parametrize("storage", ["initializer", "constant_node"])
def test_bn_into_conv_opsets_and_weight_storage(opset, storage):
    inits = {"W": rand(8, 3, 3, 3), "B": rand(8), **bn_params(8)}
    model = build(f"z = Conv <pads = [1,1,1,1]> (x, W, B)\n{BN}", "float[2,3,8,8] x", inits,
                  opset=opset, const_nodes=storage == "constant_node")
    out, p = fused_ok(model)
    assert p.rewrites["bn→conv"] == 1
    assert ops(out) == {"Conv": 1}


# --- BN into Gemm / MatMul -----------------------------------------------------------------

GEMM_CASES = [(opset, trans_b, bias) for opset in (9, 13, 17) for trans_b in (0, 1)
              for bias in (True, False) if bias or opset >= 11]  # C is optional from opset 11


@pytest.mark.parametrize("opset,trans_b,bias", GEMM_CASES)
@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (0.5, 2.0)])
def test_bn_into_gemm(opset, trans_b, bias, alpha, beta):
    inits = {"W": rand(*((6, 5) if trans_b else (5, 6))), **bn_params(6)}
    if bias:
        inits["C"] = rand(6)
    gemm = f"z = Gemm <transB = {trans_b}, alpha = {alpha}, beta = {beta}> (x, W{', C' if bias else ''})"
    model = build(f"{gemm}\n{BN}", "float[3,5] x", inits, opset=opset)
    out, p = fused_ok(model)
    assert p.rewrites["bn→gemm"] == 1
    assert ops(out) == {"Gemm": 1}


@pytest.mark.parametrize("opset", [9, 13, 17])
def test_bn_after_2d_matmul_becomes_gemm(opset):
    model = build(f"z = MatMul(x, W)\n{BN}", "float[3,5] x", {"W": rand(5, 6), **bn_params(6)}, opset=opset)
    out, p = fused_ok(model)
    assert p.rewrites["bn→gemm"] == 1
    assert ops(out) == {"Gemm": 1}


def test_bn_after_3d_matmul_is_kept():
    # BN's channel axis is 1 (length 4 here), MatMul's output channels are on the last axis
    model = build(f"z = MatMul(x, W)\n{BN}", "float[2,4,5] x", {"W": rand(5, 4), **bn_params(4)})
    not_fired(model, "bn: matmul input not 2-D")


def test_bn_folds_inside_if_branches():
    body = """c = Greater(s, Z)
y = If (c) <
  then_branch = t () => (float[1,6,6,6] ty) {
    tz = Conv <pads = [1,1,1,1]> (x, W)
    ty = BatchNormalization(tz, g, b, m, v) },
  else_branch = e () => (float[1,6,6,6] ey) {
    ez = Conv <pads = [1,1,1,1]> (x, W2)
    ey = BatchNormalization(ez, g, b, m, v) }
>"""
    inits = {"W": rand(6, 4, 3, 3), "W2": rand(6, 4, 3, 3), "Z": np.zeros(1, np.float32), **bn_params(6)}
    out, p = fused_ok(build(body, "float[1] s, float[1,4,6,6] x", inits))
    assert p.rewrites["bn→conv"] == 2
    branches = [a.g for n in out.graph.node for a in n.attribute if a.type == onnx.AttributeProto.GRAPH]
    assert [ops(onnx.helper.make_model(g)) for g in branches] == [{"Conv": 1}, {"Conv": 1}]


# --- paddle2onnx: Conv → Add(bias) → BN ---------------------------------------------------

@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("storage", ["initializer", "constant_node"])
def test_bn_across_bias_add(op, bias_first, storage):
    weight = rand(6, 4, 3, 3) if op == "Conv" else rand(4, 6, 3, 3)
    inits = {"W": weight, "A": rand(1, 6, 1, 1), **bn_params(6)}
    add = "z = Add(A, t)" if bias_first else "z = Add(t, A)"
    model = build(f"t = {op}(x, W)\n{add}\n{BN}", "float[1,4,6,6] x", inits,
                  opset=12, const_nodes=storage == "constant_node")
    out, p = fused_ok(model)
    assert p.rewrites["bn→" + op.lower()] == 1
    assert p.rewrites.get("affine→" + op.lower(), 0) == 0
    assert ops(out) == {op: 1}


# --- BN with nothing to fold into ---------------------------------------------------------

@pytest.mark.parametrize("shape,before", [
    ([2, 4, 5, 5], ""),            # graph input, rank from its declared shape
    ([3, 4], ""),                  # 2-D
    ([2, 4, 7], "r = Relu(x)"),    # rank worked out through Relu (no intermediate shapes)
])
def test_bn_without_producer_becomes_mul_add(shape, before):
    body = (before + "\n" + BN.replace("(z,", "(r,")) if before else BN.replace("(z,", "(x,")
    model = build(body, f"float[{dims(shape)}] x", bn_params(4))
    out, p = fused_ok(model)
    assert p.rewrites["bn→mul+add"] == 1
    assert ops(out) == {"Mul": 1, "Add": 1}


def test_bn_with_unknown_input_rank_is_kept():
    body = "r = Reshape(x, s)\n" + BN.replace("(z,", "(r,") + "\no = Shape(y)"
    model = build(body, "float[24] x, int64[?] s", bn_params(4), outputs="int64 o")
    not_fired(model, "bn: input rank unknown", verify=False)  # no random feed fits Reshape(x, s)


# --- constant Mul / Add / Sub / Div after Conv / ConvTranspose / Gemm ----------------------

def _affine_case(op, shape, first, c):
    if op == "Div":
        values = RNG.uniform(0.5, 2.0, shape) * RNG.choice([-1.0, 1.0], shape)
    else:
        values = RNG.standard_normal(shape)
    k = np.asarray(values, dtype=np.float32).reshape(shape)
    line = f"y = {op}(K, z)" if first else f"y = {op}(z, K)"
    return k, line


CONV_AFFINE = [(op, shape, first) for op in ("Mul", "Add", "Sub", "Div")
               for shape in [(), (1,), (6, 1, 1), (1, 6, 1, 1)]
               for first in (False, True) if not first or op in ("Mul", "Add")]


@pytest.mark.parametrize("op,shape,first", CONV_AFFINE)
@pytest.mark.parametrize("bias", [True, False])
def test_affine_into_conv(op, shape, first, bias):
    k, line = _affine_case(op, shape, first, 6)
    inits = {"W": rand(6, 4, 3, 3), "K": k, **({"B": rand(6)} if bias else {})}
    model = build(f"z = Conv <pads = [1,1,1,1]> (x, W{', B' if bias else ''})\n{line}", "float[1,4,6,6] x", inits)
    out, p = fused_ok(model)
    assert p.rewrites["affine→conv"] == 1
    assert ops(out) == {"Conv": 1}


@pytest.mark.parametrize("op", ["Mul", "Add", "Sub", "Div"])
@pytest.mark.parametrize("nd", [1, 3])
def test_affine_into_conv_other_ranks(op, nd):
    k, line = _affine_case(op, (5,) + (1,) * nd, False, 5)
    inits = {"W": rand(5, 2, *[3] * nd), "K": k}
    model = build(f"z = Conv(x, W)\n{line}", f"float[1,2,{dims(SPATIAL[nd])}] x", inits)
    out, p = fused_ok(model)
    assert p.rewrites["affine→conv"] == 1
    assert ops(out) == {"Conv": 1}


@pytest.mark.parametrize("op", ["Mul", "Add", "Sub", "Div"])
def test_affine_into_grouped_convtranspose(op):
    k, line = _affine_case(op, (1, 6, 1, 1), False, 6)
    inits = {"W": rand(4, 3, 3, 3), "B": rand(6), "K": k}
    model = build(f"z = ConvTranspose <group = 2> (x, W, B)\n{line}", "float[1,4,5,5] x", inits)
    out, p = fused_ok(model)
    assert p.rewrites["affine→convtranspose"] == 1
    assert ops(out) == {"ConvTranspose": 1}


GEMM_AFFINE = [(op, shape, first) for op in ("Mul", "Add", "Sub", "Div") for shape in [(), (6,), (1, 6)]
               for first in (False, True) if not first or op in ("Mul", "Add")]


@pytest.mark.parametrize("op,shape,first", GEMM_AFFINE)
@pytest.mark.parametrize("trans_b", [0, 1])
def test_affine_into_gemm(op, shape, first, trans_b):
    k, line = _affine_case(op, shape, first, 6)
    inits = {"W": rand(*((6, 5) if trans_b else (5, 6))), "C": rand(6), "K": k}
    model = build(f"z = Gemm <transB = {trans_b}, beta = 0.5> (x, W, C)\n{line}", "float[3,5] x", inits)
    out, p = fused_ok(model)
    assert p.rewrites["affine→gemm"] == 1
    assert ops(out) == {"Gemm": 1}


def test_affine_chain_folds_completely():
    inits = {"W": rand(6, 4, 3, 3), "S": rand(6, 1, 1), "T": rand(1, 6, 1, 1), "D": np.float32(4.0)}
    body = "a = Conv(x, W)\nb = Mul(a, S)\nc = Sub(b, T)\ny = Div(c, D)"
    out, p = fused_ok(build(body, "float[1,4,6,6] x", inits))
    assert p.rewrites["affine→conv"] == 3
    assert ops(out) == {"Conv": 1}


# --- MatMul + Add → Gemm ------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(6,), (1, 6), (), (1,)])
@pytest.mark.parametrize("bias_first", [False, True])
@pytest.mark.parametrize("opset", [9, 13, 17])
def test_matmul_add_to_gemm(shape, bias_first, opset):
    add = "y = Add(C, z)" if bias_first else "y = Add(z, C)"
    inits = {"W": rand(5, 6), "C": rand(*shape)}
    out, p = fused_ok(build(f"z = MatMul(x, W)\n{add}", "float[3,5] x", inits, opset=opset))
    assert p.rewrites["matmul+add→gemm"] == 1
    assert ops(out) == {"Gemm": 1}


def test_matmul_add_after_flatten_to_gemm():
    inits = {"W": rand(48, 6), "C": rand(6)}
    body = "f = Flatten(x)\nz = MatMul(f, W)\ny = Add(z, C)"
    out, p = fused_ok(build(body, "float[2,3,4,4] x", inits))
    assert p.rewrites["matmul+add→gemm"] == 1
    assert ops(out) == {"Gemm": 1}


def test_matmul_add_3d_input_is_kept():
    model = build("z = MatMul(x, W)\ny = Add(z, C)", "float[2,3,5] x", {"W": rand(5, 6), "C": rand(6)})
    not_fired(model, "matmul+add: input not 2-D, kept (ORT fuses MatMul+Add)")


# --- dtypes ----------------------------------------------------------------------------------

def _initializer_dtypes(model):
    return {onnx.helper.tensor_dtype_to_np_dtype(t.data_type) for t in model.graph.initializer}


def test_float16_conv_bn():
    inits = {"W": rand(6, 4, 3, 3, dtype=np.float16), "B": rand(6, dtype=np.float16),
             **bn_params(6, np.float16)}
    model = build(f"z = Conv(x, W, B)\n{BN}", "float16[1,4,6,6] x", inits, outputs="float16 y")
    out, p = fused_ok(model, tol=1e-2)
    assert p.rewrites["bn→conv"] == 1
    assert ops(out) == {"Conv": 1}
    assert _initializer_dtypes(out) == {np.dtype(np.float16)}


@pytest.mark.parametrize("second", [BN, "y = Div(z, K)"])
def test_float64_gemm(second):
    inits = {"W": rand(5, 6, dtype=np.float64), "C": rand(6, dtype=np.float64),
             "K": RNG.uniform(0.5, 2.0, 6), **bn_params(6, np.float64)}
    model = build(f"z = Gemm(x, W, C)\n{second}", "double[3,5] x", inits, outputs="double y")
    out, p = fused_ok(model)
    assert sum(p.rewrites.get(k, 0) for k in ("bn→gemm", "affine→gemm")) == 1
    assert ops(out) == {"Gemm": 1}
    assert _initializer_dtypes(out) == {np.dtype(np.float64)}


# --- must not fire ---------------------------------------------------------------------------

def test_shared_weight_is_not_copied():
    inits = {"W": rand(6, 4, 3, 3), "B1": rand(6), "B2": rand(6), **bn_params(6)}
    body = f"z = Conv(x, W, B1)\nw = Conv(x, W, B2)\n{BN}\ny2 = BatchNormalization(w, g, b, m, v)"
    model = build(body, "float[1,4,6,6] x", inits, outputs="float y, float y2")
    not_fired(model, "bn: shared weight", count=2)


def test_shared_weight_and_bias_still_take_a_bias_add():
    # Add touches only the bias, which is copied when shared; the shared weight stays as it is
    inits = {"W": rand(6, 4, 3, 3), "B": rand(6), "K1": rand(6, 1, 1), "K2": rand(6, 1, 1)}
    body = "a = Conv(x, W, B)\nb = Conv(x2, W, B)\ny = Add(a, K1)\ny2 = Add(b, K2)"
    model = build(body, "float[1,4,6,6] x, float[1,4,6,6] x2", inits, outputs="float y, float y2")
    out, p = fused_ok(model)
    assert p.rewrites["affine→conv"] == 2
    assert ops(out) == {"Conv": 2}
    weights = [i for i in out.graph.initializer if len(i.dims) == 4]
    assert len(weights) == 1  # not copied


@pytest.mark.parametrize("opset", [9, 15])
def test_training_mode_bn_is_kept(opset):
    inits = {"W": rand(4, 3, 3, 3), **bn_params(4)}
    if opset < 14:  # the opset-9 training form: five outputs
        bn = "y, rm, rv, sm, sv = BatchNormalization(z, g, b, m, v)"
    else:
        bn = "y, rm, rv = BatchNormalization <training_mode = 1> (z, g, b, m, v)"
    model = build(f"z = Conv(x, W)\n{bn}", "float[2,3,6,6] x", inits, opset=opset)
    not_fired(model, "bn: training mode")


def test_non_constant_weight():
    model = build(f"z = Conv(x, W)\n{BN}", "float[1,4,6,6] x, float[6,4,3,3] W", bn_params(6))
    not_fired(model, "bn: weight not constant")


def test_producer_output_read_twice():
    inits = {"W": rand(6, 4, 3, 3), **bn_params(6)}
    model = build(f"z = Conv(x, W)\n{BN}\ny2 = Relu(z)", "float[1,4,6,6] x", inits, outputs="float y, float y2")
    not_fired(model, "bn: producer output has other readers")


def test_sub_with_constant_first():
    inits = {"W": rand(6, 4, 3, 3), "K": rand(6, 1, 1)}
    not_fired(build("z = Conv(x, W)\ny = Sub(K, z)", "float[1,4,6,6] x", inits), "affine: constant first operand")


def test_per_element_mul():
    inits = {"W": rand(6, 4, 3, 3), "K": rand(1, 6, 4, 4)}
    not_fired(build("z = Conv(x, W)\ny = Mul(z, K)", "float[1,4,6,6] x", inits), "affine: not per-channel")


def test_div_by_zero():
    k = RNG.uniform(0.5, 2.0, (6, 1, 1)).astype(np.float32)
    k[2] = 0.0
    inits = {"W": rand(6, 4, 3, 3), "K": k}
    not_fired(build("z = Conv(x, W)\ny = Div(z, K)", "float[1,4,6,6] x", inits), "affine: division by zero")


# --- real models ------------------------------------------------------------------------------

REAL = {  # name: (BatchNormalization nodes in the model, rewrites that must be there)
    "ppocr_cls_v2": (35, {}),
    "orientation": (27, {}),
    "ppocrv4_det": (3, {"bn→convtranspose": 1}),
    "ppocrv4_rec": (6, {}),
    "mtcnn_onet": (0, {"matmul+add→gemm": 4}),
}


@pytest.mark.realmodel
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_models_fold_every_bn(name):
    from onnxslim_kit import zoo

    n_bn, expected = REAL[name]
    proto, report = onnxslim_kit.optimize(str(zoo.fetch(name)), passes="fuse", num_samples=1, verify_samples=1)
    p = report.passes[0]
    assert p.before["ops"].get("BatchNormalization", 0) == n_bn
    assert p.after["ops"].get("BatchNormalization", 0) == 0
    assert sum(v for k, v in p.rewrites.items() if k.startswith("bn→")) == n_bn
    for label, count in expected.items():
        assert p.rewrites.get(label) == count, p.rewrites
    assert not p.rolled_back
    assert p.verification["status"] == "ok", p.verification
