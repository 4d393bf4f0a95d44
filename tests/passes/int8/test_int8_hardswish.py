"""Hard-swish, hard-sigmoid and squeeze-excite blocks in int8 kernels (issue 14): ORT's CPU
provider has no QLinear HardSigmoid / HardSwish, so ``int8`` writes them as
``Add → Q[0, 1/α] → DQ(·α) → Mul`` between the Q points (:mod:`onnxslim_kit.passes._quant.hardswish`)
and quantizes the input of a squeeze-excite pool (:func:`onnxslim_kit.passes.int8.plan.pool_inputs`).
Asserted on what ORT executes (:mod:`onnxslim_kit.executed`): no ``DequantizeLinear →
HardSigmoid → Mul → QuantizeLinear`` detour is left, the pool and the excite Mul run as
QLinearGlobalAveragePool / QLinearMul, ORT with and without its optimisations agree (the α on
the DequantizeLinear's scale is honoured by the fusion), and the outputs hold the target."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.executed import executed
from onnxslim_kit.metrics import cosine
from onnxslim_kit.model import Model
from onnxslim_kit.passes._quant.hardswish import quantize_hard_activations
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

HSIG = "HardSigmoid <alpha = 0.16666667, beta = 0.5>"
HARD_SWISH = {  # the two spellings of x·HardSigmoid(x) that exports use, and SiLU's x·σ(x)
    "mul": f"h1 = {HSIG} (c1)\n        a1 = Mul (c1, h1)",
    "op": "a1 = HardSwish (c1)",
    "silu": "h1 = Sigmoid (c1)\n        a1 = Mul (c1, h1)",
}
TAIL = """c2 = Conv <pads = [1, 1, 1, 1]> ({}, w2, b2)
        r2 = Relu (c2)
        p2 = GlobalAveragePool (r2)
        f = Flatten (p2)
        y = Gemm (f, w3, b3)"""


def weights(se: bool) -> dict:
    rng = np.random.default_rng(5)
    found = {"w1": rng.standard_normal((8, 3, 3, 3)) * 0.4, "b1": rng.standard_normal(8) * 0.5,
             "w2": rng.standard_normal((8, 8, 3, 3)) * 0.2, "b2": rng.standard_normal(8) * 0.1,
             "w3": rng.standard_normal((8, 5)) * 0.5, "b3": rng.standard_normal(5) * 0.1}
    if se:
        found.update({"ws1": rng.standard_normal((4, 8, 1, 1)) * 0.5, "bs1": rng.standard_normal(4) * 0.1,
                      "ws2": rng.standard_normal((8, 4, 1, 1)) * 0.5, "bs2": rng.standard_normal(8) * 0.1})
    return {k: np.asarray(v, np.float32) for k, v in found.items()}


def block(form: str = "mul", se: bool = False) -> onnx.ModelProto:
    """Conv → hard-swish → (squeeze-excite) → Conv → Relu → pool → Gemm."""
    excite = f"""p1 = GlobalAveragePool (a1)
        s1 = Conv (p1, ws1, bs1)
        sr = Relu (s1)
        s2 = Conv (sr, ws2, bs2)
        g = HardSigmoid <alpha = 0.2, beta = 0.5> (s2)
        e = Mul (a1, g)""" if se else ""
    text = f"""<ir_version: 8, opset_import: ["" : 14]>
    m (float[1, 3, 16, 16] x) => (float[1, 5] y) {{
        c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        {HARD_SWISH[form]}
        {excite}
        {TAIL.format('e' if se else 'a1')}
    }}"""
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights(se).items())
    onnx.checker.check_model(model, full_check=True)
    return model


def samples(n: int = 24, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(n)]


def quantize(model, options: str = "") -> tuple:
    feed = CalibrationFeed(input_specs(model), samples())
    options = ",".join(filter(None, [options, "speed=off"]))  # placement, not the speed decision
    out, report = run_pipeline(model, parse_pass_list(f"int8({options})"), feed)
    return out, report.passes[-1]


def outputs(model, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, data=None) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return np.stack([session.run(None, s)[0] for s in (data or samples(8, seed=1))])


def assert_runs_in_int8(out, want_other: set, convs: int = 2):
    ran = executed(out, input_shapes={"x": [1, 3, 16, 16]})
    assert not any("HardSigmoid" in path or "HardSwish" in path for path in ran["detours"]), ran["detours"]
    assert "HardSigmoid" not in ran["unfused_by_op"] and "HardSwish" not in ran["unfused_by_op"], ran["unfused_by_op"]
    assert ran["int8_ops"].get("QLinearConv") == convs and not ran["float_ops"], (ran["int8_ops"], ran["float_ops"])
    assert want_other <= set(ran["int8_other_ops"]), ran["int8_other_ops"]
    return ran


def assert_faithful(model, out):
    held_out = samples(8, seed=1)
    want, got = outputs(model, data=held_out), outputs(out, data=held_out)
    assert min(cosine(w, g) for w, g in zip(want, got)) >= 0.99
    # ORT's fused graph computes what the QDQ graph says (α rides on a DequantizeLinear scale)
    plain = outputs(out, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, held_out)
    assert min(cosine(p, g) for p, g in zip(plain, got)) >= 0.9999
    assert np.abs(plain - got).max() <= 0.02 * np.abs(plain).max()


def test_silu_between_convs_runs_as_qlinear_sigmoid_and_mul():
    """x·σ(x) (YOLOv8's activation) between two Q points: σ on the fixed grid 1/255, so ORT
    runs QLinearSigmoid and QLinearMul, not a float detour."""
    model = block("silu")
    out, rep = quantize(model)
    assert rep.rewrites["Sigmoid gate→QLinearSigmoid+QLinearMul"] == 1
    onnx.checker.check_model(out, full_check=True)
    ran = executed(out, input_shapes={"x": [1, 3, 16, 16]})
    assert "Sigmoid" not in ran["unfused_by_op"] and "Mul" not in ran["unfused_by_op"], ran["unfused_by_op"]
    assert ran["int8_ops"].get("QLinearConv") == 2 and not ran["float_ops"], (ran["int8_ops"], ran["float_ops"])
    assert {"QLinearSigmoid", "QLinearMul"} <= set(ran["int8_other_ops"]), ran["int8_other_ops"]
    assert_faithful(model, out)


def test_a_sigmoid_read_by_a_graph_output_stays():
    model = block("silu")
    model.graph.output.append(onnx.helper.make_tensor_value_info("h1", onnx.TensorProto.FLOAT, None))
    _, rep = quantize(model)
    assert "Sigmoid gate→QLinearSigmoid+QLinearMul" not in rep.rewrites


@pytest.mark.parametrize("form", ["mul", "op"])
def test_hard_swish_between_convs_runs_as_qlinear_add_and_mul(form):
    model = block(form)
    out, rep = quantize(model)
    label = "HardSwish→QLinearAdd+QLinearMul" if form == "op" else "HardSigmoid→QLinearAdd"
    assert rep.rewrites[label] == 1
    assert not [n for n in out.graph.node if n.op_type in ("HardSigmoid", "HardSwish")]
    onnx.checker.check_model(out, full_check=True)
    assert_runs_in_int8(out, {"QLinearAdd", "QLinearMul"})
    assert_faithful(model, out)


def test_int8_activations_keep_the_float_hard_sigmoid():
    """ORT 1.32's CPU provider fuses no QLinearAdd / QLinearMul on int8 activations: the rewrite
    would trade one float HardSigmoid for a float Add and Mul, so it is not made."""
    out, rep = quantize(block("mul"), "activations=int8")
    assert not [label for label in rep.rewrites if label.startswith("Hard")]
    assert [n.op_type for n in out.graph.node].count("HardSigmoid") == 1


@pytest.mark.parametrize("form", ["mul", "op"])
def test_squeeze_excite_pool_gate_and_scale_run_in_int8(form):
    model = block(form, se=True)
    out, rep = quantize(model)
    assert sum(n for label, n in rep.rewrites.items() if label.startswith("Hard")) == 2  # hard-swish and the gate
    ran = assert_runs_in_int8(out, {"QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool"}, convs=4)
    plain = executed(quantize(block(form))[0], input_shapes={"x": [1, 3, 16, 16]})
    # the squeeze-excite leaves no DequantizeLinear of its own (only the tail pool's, in both)
    assert ran["unfused_by_op"] == plain["unfused_by_op"], (ran["unfused"], plain["unfused"])
    assert ran["int8_other_ops"]["QLinearMul"] == 2 and ran["int8_other_ops"]["QLinearAdd"] == 2
    assert_faithful(model, out)


def fake_quantized(dtype=np.uint8, output: bool = False) -> onnx.ModelProto:
    """``DQ(Q(x)) → HardSigmoid → Mul(DQ(Q(x)), ·) → Q → DQ → y``: what apply_plan leaves
    around a hard-swish; ``output``: the Mul's result is the graph output instead."""
    qmin = -128 if dtype == np.int8 else 0
    zp = "int8" if dtype == np.int8 else "uint8"
    tail = ("y = Identity (m)" if output
            else "mq = QuantizeLinear (m, sy, zy)\n        y = DequantizeLinear (mq, sy, zy)")
    text = f"""<ir_version: 8, opset_import: ["" : 13]>
    q (float[1, 4, 32] x) => (float[1, 4, 32] y) {{
        sx = Constant <value = float {{0.04}}> ()
        zx = Constant <value = {zp} {{{qmin + 128}}}> ()
        sy = Constant <value = float {{0.02}}> ()
        zy = Constant <value = {zp} {{{qmin + 32}}}> ()
        xq = QuantizeLinear (x, sx, zx)
        d1 = DequantizeLinear (xq, sx, zx)
        d2 = DequantizeLinear (xq, sx, zx)
        h = {HSIG} (d1)
        m = Mul (d2, h)
        {tail}
    }}"""
    return onnx.parser.parse_model(text)


def test_rewrite_error_is_at_most_half_a_gate_step_of_x_plus_one_output_step():
    proto = fake_quantized()
    model = Model.from_proto(proto)
    assert quantize_hard_activations(model, model.graph) == 1
    model.commit()
    rewritten = model.to_proto()
    assert {n.op_type for n in rewritten.graph.node} >= {"Add", "Mul"}
    assert "HardSigmoid" not in {n.op_type for n in rewritten.graph.node}
    x = np.linspace(-5.5, 4.5, 128, dtype=np.float32).reshape(1, 4, 32)  # both clip ends and the ramp
    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = outputs(proto, level, [{"x": x}])
    got = outputs(rewritten, level, [{"x": x}])
    x_hat = (np.clip(np.round(x / 0.04) + 128, 0, 255) - 128) * 0.04
    bound = np.abs(x_hat) / 510 + 0.02 + 1e-6  # |Δgate| ≤ 1/510, then one output step of rounding
    assert (np.abs(got - want)[0, 0] <= bound).all()
    assert np.abs(got - want).max() > 0  # the gate is really on its 8-bit grid


@pytest.mark.parametrize("case", [{"output": True}, {"dtype": np.int8}])
def test_not_rewritten_when_the_mul_result_stays_float_or_on_int8_activations(case):
    model = Model.from_proto(fake_quantized(**case))
    before = [n.op for n in model.graph.nodes]
    assert quantize_hard_activations(model, model.graph) == 0
    assert [n.op for n in model.graph.nodes] == before


def test_a_float_model_is_left_as_it_is():
    model = Model.from_proto(block("mul"))
    before = [n.op for n in model.graph.nodes]
    assert quantize_hard_activations(model, model.graph) == 0  # no DequantizeLinear in front
    assert [n.op for n in model.graph.nodes] == before
