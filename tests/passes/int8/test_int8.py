"""The ``int8`` pass on hand-built graphs: Q/DQ placement per op type, the encodings, that ORT
fuses the result into integer kernels, safeguards, selectors, the fidelity target, the
lossless limit, opset upgrade and already-quantized models."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import numpy_helper

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.metrics import cosine
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline
from onnxslim_kit.runtime import make_session

RNG = np.random.default_rng(0)


def build(body: str, inputs: str, inits: dict, outputs: str = "float y", opset: int = 13) -> onnx.ModelProto:
    text = f'<ir_version: 8, opset_import: ["" : {opset}]>\nq ({inputs}) => ({outputs}) {{\n{body}\n}}'
    model = onnx.parser.parse_model(text)
    for out in model.graph.output:
        out.type.tensor_type.ClearField("shape")  # left to inference
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items())
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model, full_check=True)
    return model


def w(*shape, scale=0.3, rng=None):
    return ((rng or RNG).standard_normal(shape) * scale).astype(np.float32)


def quantize(model, options: str = "", samples: int = 4, passes: str | None = None):
    feed = CalibrationFeed(input_specs(model), None, num_samples=samples)
    if "speed_check" not in options:  # these tests check placement and numbers, not the speed gate
        options = ",".join(filter(None, [options, "speed_check=false"]))
    spec = passes or f"int8({options})"
    out, report = run_pipeline(model, parse_pass_list(spec), feed, verify_samples=samples)
    return out, report.passes[-1]


def ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def optimized_ops(model, tmp_path) -> Counter:
    """Op types of ORT's optimized model (optimisations on): shows the integer kernels."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return ops(onnx.load(str(tmp_path / "opt.onnx")))


def conv_chain(rng=None):
    """Conv → Relu → Conv → Relu → Conv; weights from ``rng`` (default: the module's stream)."""
    def r(*shape):
        return w(*shape, rng=rng)

    return build(
        "c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)\nr1 = Relu (c1)\n"
        "c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2, b2)\nr2 = Relu (c2)\n"
        "y = Conv (r2, w3, b3)",
        "float[1, 3, 16, 16] x",
        {"w1": r(8, 3, 3, 3), "b1": r(8), "w2": r(8, 8, 3, 3), "b2": r(8), "w3": r(4, 8, 1, 1), "b3": r(4)},
    )


# --- placement and kernels -----------------------------------------------------------------

def test_conv_relu_chain_placement_and_qlinearconv(tmp_path):
    model = conv_chain()
    out, rep = quantize(model, "target=none")
    assert rep.rewrites["Conv→int8"] == 3
    count = ops(out)
    # x, r1, r2 quantized once each (Q points after the Relus, none between Conv and Relu);
    # the last Conv's output is a graph output and stays float
    assert count["QuantizeLinear"] == 3
    assert count["DequantizeLinear"] == 3 + 3 + 3  # activations + weights + biases
    producers = {o: n for n in out.graph.node for o in n.output}
    weight_dqs = [producers[n.input[i]] for n in out.graph.node if n.op_type == "Conv" for i in (1, 2)]
    assert all(len(dq.input) == 2 for dq in weight_dqs)  # symmetric weights and int32 biases: no zero point
    for node in out.graph.node:
        if node.op_type == "Relu":
            assert node.output[0] in {q.input[0] for q in out.graph.node if q.op_type == "QuantizeLinear"}
        if node.op_type == "Conv":
            assert all(i.endswith(tuple("0123456789")) or "dq" in i for i in node.input)
    onnx.checker.check_model(out, full_check=True)
    fused = optimized_ops(out, tmp_path)
    assert fused["QLinearConv"] == 2  # the last Conv has a float output: no Q, no fusion
    assert fused["Relu"] == 0  # removed by ORT: the Q (zero point 0) clips
    assert rep.verification["outputs"]["y"]["cosine"] > 0.99


def test_weight_and_bias_encodings():
    model = conv_chain()
    out, _ = quantize(model, "target=none")
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    nodes = {o: n for n in out.graph.node for o in n.output}
    first = next(n for n in out.graph.node if n.op_type == "Conv")
    x_dq, w_dq, b_dq = (nodes[i] for i in first.input)
    s_x = inits[x_dq.input[1]]
    s_w = inits[w_dq.input[1]]
    w_q = inits[w_dq.input[0]]
    assert w_q.dtype == np.int8 and np.abs(w_q).max() == 63  # a full Conv: the 7-bit grid (test_int8_exact)
    assert s_w.shape == (8,) and {a.name: a.i for a in w_dq.attribute}["axis"] == 0
    w1 = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w1"))
    np.testing.assert_allclose(s_w, np.abs(w1).reshape(8, -1).max(axis=1) / 63, rtol=1e-6)
    assert np.abs(w_q * s_w[:, None, None, None] - w1).max() <= s_w.max() / 2 + 1e-7
    b_q, s_b = inits[b_dq.input[0]], inits[b_dq.input[1]]
    assert b_q.dtype == np.int32
    np.testing.assert_allclose(s_b, s_x * s_w, rtol=1e-6)
    assert inits[x_dq.input[2]].dtype == np.uint8


def test_bias_correction_removes_the_mean_shift():
    # every weight rounds the same way (0.3·127 = 38.1 → 38) and the input is positive, so the
    # quantized conv's output is biased low; Conv without bias gets one
    weights = np.full((4, 1, 3, 3), 0.3, np.float32)
    weights[:, 0, 0, 0] = 1.0
    model = build("r = Relu (x)\ny = Conv <group = 4> (r, wd)", "float[1, 4, 10, 10] x", {"wd": weights})
    seen = CalibrationFeed(input_specs(model), None, num_samples=8).take(8)  # what quantize() measures on
    rng = np.random.default_rng(7)
    held_out = [{"x": rng.standard_normal((1, 4, 10, 10)).astype(np.float32)} for _ in range(32)]
    errors = {}
    for flag in ("false", "true"):
        out, rep = quantize(model, f"target=none,bias_correction={flag}", samples=8)
        conv = next(n for n in out.graph.node if n.op_type == "Conv")
        assert len(conv.input) == (3 if flag == "true" else 2)
        for name, feeds in (("seen", seen), ("held_out", held_out)):
            diffs = [run_ort(out, f)[0] - run_ort(model, f)[0] for f in feeds]
            errors[flag, name] = np.abs(np.mean(diffs, axis=(0, 1, 3, 4))).max()  # per channel
    assert rep.metrics["bias_corrected"] == 1
    assert errors["true", "seen"] < errors["false", "seen"] / 10
    # unseen inputs exceed the calibrated range more often (clipping), so the gain is smaller
    assert errors["true", "held_out"] < errors["false", "held_out"] / 2


@pytest.mark.parametrize("grouped, kernel, weight_type", [
    ("weights", "Conv", onnx.TensorProto.INT8),   # int8 storage, Cast + Mul folded: float depthwise kernel
    ("int8", "QLinearConv", onnx.TensorProto.INT8),
    ("float", "Conv", onnx.TensorProto.FLOAT),
])  # ORT's optimized graph: the depthwise conv as a float Conv (NCHWc) or a QLinearConv
def test_grouped_conv_choice(grouped, kernel, weight_type, tmp_path):
    """``grouped`` puts depthwise convs on the weights rung, keeps them float, or (default)
    quantizes them like any layer; the dense conv beside them stays static int8."""
    rng = np.random.default_rng(3)
    model = build("d = Conv <group = 8, pads = [1, 1, 1, 1]> (x, wd)\nr = Relu (d)\ny = Conv (r, wp)",
                  "float[1, 8, 12, 12] x",
                  {"wd": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
                   "wp": rng.standard_normal((16, 8, 1, 1)).astype(np.float32)})
    out, rep = quantize(model, f"target=none,grouped={grouped}")
    assert optimized_ops(out, tmp_path)[kernel] >= 1
    big = [t for t in out.graph.initializer if list(t.dims) == [8, 1, 3, 3]]
    assert len(big) == 1 and big[0].data_type == weight_type
    readers = [n.op_type for n in out.graph.node if big[0].name in n.input]
    assert readers == {"weights": ["Cast"], "int8": ["DequantizeLinear"], "float": ["Conv"]}[grouped]
    if grouped != "int8":
        assert any(r.startswith("grouped Conv") for r in rep.skipped)


def test_int8_activation_option():
    out, _ = quantize(conv_chain(), "target=none,activations=int8")
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    zps = [inits[n.input[2]] for n in out.graph.node if n.op_type == "QuantizeLinear"]
    assert zps and all(z.dtype == np.int8 for z in zps)


def test_matmul_gemm_placement_and_kernels(tmp_path):
    model = build(
        "h = MatMul (x, w1)\nr = Relu (h)\ng = Gemm <transB = 1> (r, w2, b2)\n"
        "t = Transpose <perm = [1, 0]> (g)\na = MatMul (g, t)\ny = Sigmoid (a)",
        "float[4, 32] x",
        {"w1": w(32, 16), "w2": w(24, 16), "b2": w(24)},
    )
    out, rep = quantize(model, "target=none")
    assert rep.rewrites["MatMul→int8"] == 2 and rep.rewrites["Gemm→int8"] == 1
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    nodes = {o: n for n in out.graph.node for o in n.output}
    gemm = next(n for n in out.graph.node if n.op_type == "Gemm")
    assert inits[nodes[gemm.input[1]].input[1]].shape == (24,)  # per output row of B (transB)
    matmul = next(n for n in out.graph.node if n.op_type == "MatMul" and n.input[1] in nodes
                  and nodes[n.input[1]].input[0] in inits)
    assert inits[nodes[matmul.input[1]].input[1]].shape == (16,)  # per column
    # the attention-like MatMul's output feeds the Sigmoid head: left float
    assert rep.skipped["output left float: feeds a Sigmoid/Softmax head"] == 1
    fused = optimized_ops(out, tmp_path)
    assert fused["QGemm"] == 1
    assert fused["QLinearMatMul"] + fused["MatMulIntegerToFloat"] == 2
    assert fused["MatMul"] == 0 and fused["Gemm"] == 0


def test_embedding_table_is_gathered_in_int8(tmp_path):
    model = build("e = Gather (table, ids)\ny = MatMul (e, w1)", "int64[1, 6] ids",
                  {"table": w(128, 64), "w1": w(64, 16)})
    out, rep = quantize(model, "target=none")
    assert rep.rewrites["Gather→int8"] == 1 and rep.rewrites["MatMul→int8"] == 1
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    nodes = {o: n for n in out.graph.node for o in n.output}
    gather = next(n for n in out.graph.node if n.op_type == "Gather")
    assert gather.input[0] in inits and inits[gather.input[0]].dtype == np.uint8  # gathers the integer table
    table_dq = next(n for n in out.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == gather.output[0])
    q_after = next(n for n in out.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == table_dq.output[0])
    assert gather.input[0] not in nodes and table_dq.input[0] == gather.output[0]
    assert inits[table_dq.input[1]] == inits[q_after.input[1]]  # same scale: ORT can drop the pair
    assert inits[table_dq.input[2]].dtype == np.uint8 == inits[q_after.input[2]].dtype
    assert inits[table_dq.input[2]] == inits[q_after.input[2]]
    fused = optimized_ops(out, tmp_path)
    opt = onnx.load(str(tmp_path / "opt.onnx"))
    opt_gather = next(n for n in opt.graph.node if n.op_type == "Gather")
    assert opt_gather.input[0] in {t.name for t in opt.graph.initializer if t.data_type == onnx.TensorProto.UINT8}
    assert fused["QLinearMatMul"] + fused["MatMulIntegerToFloat"] == 1
    feeds = {"ids": np.array([[0, 5, 9, 127, 64, 3]], np.int64)}
    assert cosine(run_ort(model, feeds)[0], run_ort(out, feeds)[0]) > 0.99


def test_residual_branches_both_fused(tmp_path):
    model = build(
        "a = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)\nb = Conv <pads = [1, 1, 1, 1]> (x, w2, b2)\n"
        "s = Add (a, b)\ny = Conv (s, w3, b3)",
        "float[1, 4, 8, 8] x",
        {"w1": w(4, 4, 3, 3), "b1": w(4), "w2": w(4, 4, 3, 3), "b2": w(4), "w3": w(2, 4, 1, 1), "b3": w(2)},
    )
    out, _ = quantize(model, "target=none")
    fused = optimized_ops(out, tmp_path)
    assert ops(out)["QuantizeLinear"] == 4  # x, a, b, s: the Add sits between DQ and Q
    assert fused["QLinearConv"] == 2  # the two branches (x read by both through its own DQ)


# --- lossless limit, opset, already quantized ------------------------------------------------

def test_exclude_all_is_lossless():
    model = conv_chain()
    out, rep = quantize(model, "exclude=all")
    assert not rep.modified and rep.skipped["excluded by include/exclude"] == 3
    feeds = {"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(out, feeds)[0], run_ort(model, feeds)[0])


def test_fallback_of_every_layer_reproduces_float():
    model = conv_chain()
    out, rep = quantize(model, "target=cos:1.0")
    assert rep.metrics["layers_int8"] == 0 and rep.metrics["layers_float"] == 3
    assert ops(out)["QuantizeLinear"] == 0
    feeds = {"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(out, feeds)[0], run_ort(model, feeds)[0])


def test_opset11_is_upgraded_and_loads(tmp_path):
    model = build("c = Conv (x, w1, b1)\nr = Relu (c)\ny = Conv (r, w2)", "float[1, 3, 8, 8] x",
                  {"w1": w(4, 3, 3, 3), "b1": w(4), "w2": w(2, 4, 1, 1)}, opset=11)
    out, rep = quantize(model, "target=none")
    assert rep.rewrites["opset→13"] == 1
    assert next(o.version for o in out.opset_import if o.domain in ("", "ai.onnx")) == 13
    assert any(a.name == "axis" for n in out.graph.node if n.op_type == "DequantizeLinear" for a in n.attribute)
    onnx.checker.check_model(out, full_check=True)
    make_session(out, opt_level="all", threads=1)
    assert optimized_ops(out, tmp_path)["QLinearConv"] == 1
    untouched, rep = quantize(model, "exclude=all")  # nothing to quantize: no upgrade either
    assert not rep.modified and next(o.version for o in untouched.opset_import if o.domain in ("", "ai.onnx")) == 11


def test_already_quantized_passes_through():
    out, _ = quantize(conv_chain(), "target=none")
    again, rep = quantize(out, "target=none")
    assert not rep.modified and rep.skipped["already quantized (has Q/DQ or integer ops)"] == 1
    assert ops(again) == ops(out)


# --- safeguards, selectors, target -----------------------------------------------------------

def test_absurd_range_stays_float():
    # an attention-style mask add of -1e9 feeding a MatMul
    model = build("m = Add (x, mask)\ny = MatMul (m, w1)", "float[4, 8] x",
                  {"mask": np.where(np.eye(4, 8) > 0, -1e9, 0).astype(np.float32), "w1": w(8, 8)})
    out, rep = quantize(model, "target=none")
    assert rep.skipped["MatMul kept float: input range above 10000"] == 1
    assert ops(out)["QuantizeLinear"] == 0
    _, rep_off = quantize(model, "target=none,max_range=0")
    assert rep_off.rewrites["MatMul→int8"] == 1


def test_spectrum_before_log_stays_float():
    model = build("s = MatMul (x, w1)\np = Mul (s, s)\nf = MatMul (p, w2)\nl = Log (f)\ny = MatMul (l, w3)",
                  "float[4, 8] x", {"w1": w(8, 8), "w2": np.abs(w(8, 8)) + 0.1, "w3": w(8, 8)})
    _, rep = quantize(model, "target=none")
    assert rep.skipped["MatMul kept float: input feeds a Log"] == 2
    assert rep.rewrites["MatMul→int8"] == 1  # the one after the Log
    _, rep_off = quantize(model, "target=none,log=false")
    assert rep_off.rewrites["MatMul→int8"] == 3


def test_concat_of_uneven_ranges_stays_float():
    # box coordinates (~100s) concatenated with scores (~1) before a layer
    model = build("a = MatMul (x, w1)\nb = Mul (a, big)\nc = Concat <axis = 1> (a, b)\ny = MatMul (c, w2)",
                  "float[4, 8] x", {"w1": w(8, 8), "big": np.float32(300.0), "w2": w(16, 4)})
    _, rep = quantize(model, "target=none,smooth=0")  # smoothing would even out these channels
    assert rep.skipped["MatMul kept float: input Concat of uneven ranges"] == 1
    assert rep.rewrites["MatMul→int8"] == 1
    _, rep_off = quantize(model, "target=none,smooth=0,concat_ratio=0")
    assert rep_off.rewrites["MatMul→int8"] == 2


def _smoothing_case(seed: int):
    """Three hidden channels 50× larger than the rest feed two projections (like Q and K);
    weights and inputs from their own stream, so the case does not depend on test order."""
    rng = np.random.default_rng(seed)
    scale = np.ones(32, np.float32)
    scale[[3, 17, 30]] = 50.0
    model = build("h = Mul (x, s)\nq = MatMul (h, wq)\nk = MatMul (h, wk)\ny = Add (q, k)", "float[8, 32] x",
                  {"s": scale, "wq": w(32, 16, rng=rng), "wk": w(32, 16, rng=rng)})
    return model, {"x": rng.standard_normal((8, 32)).astype(np.float32)}


def test_smoothing_moves_outlier_channels_into_the_weights():
    # smoothing lowers the error on most weight draws, not on every one (seed 0 here: 2.4× worse,
    # measured 2026-12-02; the median of six draws is 0.65× of the unsmoothed error)
    ratios = []
    for seed in range(6):
        model, feeds = _smoothing_case(seed)
        ref = run_ort(model, feeds)[0]
        plain, _ = quantize(model, "target=none,smooth=0,bias_correction=false")
        smooth, rep = quantize(model, "target=none,bias_correction=false")
        assert rep.rewrites["smoothed activation"] == 1 and ops(smooth)["Mul"] == 2
        assert rep.rewrites["MatMul→int8"] == 2
        err = lambda m: np.abs(run_ort(m, feeds)[0] - ref).mean()
        ratios.append(err(smooth) / err(plain))
    assert np.median(ratios) < 0.8, ratios
    # with every layer back in float, the smoothed graph equals the original up to rounding
    equal, rep_float = quantize(model, "target=cos:1.0")
    assert rep_float.metrics["layers_int8"] == 0 and rep_float.rewrites["smoothed activation"] == 1
    np.testing.assert_allclose(run_ort(equal, feeds)[0], ref, rtol=1e-5, atol=1e-5)


def test_a_weight_read_by_layers_of_other_inputs_is_not_smoothed():
    # an unrolled recurrent cell: one weight, one MatMul per step, each on its own input
    scale = np.ones(32, np.float32)
    scale[[3, 17]] = 50.0
    model = build("h = Mul (x, s)\nh2 = Mul (h, two)\na = MatMul (h, wr)\nb = MatMul (h2, wr)\ny = Add (a, b)",
                  "float[8, 32] x", {"s": scale, "two": np.float32(2.0), "wr": w(32, 16)})
    feed = {"x": np.random.default_rng(5).standard_normal((8, 32)).astype(np.float32)}
    out, rep = quantize(model, "target=none,bias_correction=false")
    assert rep.rewrites.get("smoothed activation", 0) == 0 and rep.rewrites["MatMul→int8"] == 2
    weights = [i for i in out.graph.initializer if np.prod(i.dims) == 32 * 16]
    assert len(weights) == 1  # one shared int8 weight, as in the float model
    ref = run_ort(model, feed)[0]
    assert np.abs(run_ort(out, feed)[0] - ref).max() < 0.05 * np.abs(ref).max()


@pytest.mark.parametrize(
    "selector, float_names",
    [("last:Conv:1", {"c3"}), ("first:*:2", {"c1", "c2"}), ("name:^c[13]$", {"c1", "c3"}), ("op:Conv", {"c1", "c2", "c3"})],
)
def test_exclude_selectors(selector, float_names):
    model = conv_chain()
    for node, name in zip(model.graph.node[::2], ("c1", "c2", "c3")):
        node.name = name
    out, rep = quantize(model, f"target=none,exclude={selector}")
    nodes = {o: n for n in out.graph.node for o in n.output}
    inits = {t.name for t in out.graph.initializer}
    int8 = {n.name for n in out.graph.node if n.op_type == "Conv" and n.input[1] not in inits}
    assert int8 == {"c1", "c2", "c3"} - float_names
    assert all(nodes[n.input[1]].op_type == "DequantizeLinear" for n in out.graph.node
               if n.op_type == "Conv" and n.name in int8)


def test_include_restricts():
    model = conv_chain()
    _, rep = quantize(model, "target=none,include=last:Conv:1")
    assert rep.rewrites["Conv→int8"] == 1 and rep.skipped["excluded by include/exclude"] == 2


def outlier_model():
    """The middle conv sees a tensor with one huge outlier channel: 8 bits cannot hold both."""
    scale = np.ones((1, 8, 1, 1), np.float32)
    scale[0, 0] = 300.0
    return build(
        "c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)\nr1 = Relu (c1)\nm = Mul (r1, s)\n"
        "c2 = Conv <pads = [1, 1, 1, 1]> (m, w2, b2)\ny = Conv (c2, w3)",
        "float[1, 3, 12, 12] x",
        {"w1": w(8, 3, 3, 3), "b1": w(8), "s": scale, "w2": w(8, 8, 3, 3) * (1 / scale.reshape(1, 8, 1, 1)),
         "b2": w(8), "w3": w(4, 8, 1, 1)},
    )


@pytest.mark.parametrize("sensitivity", ["auto", "hybrid", "e2e", "local"])
def test_target_falls_back_sensitive_layer(sensitivity):
    model = outlier_model()
    _, loose = quantize(model, "fallback=false")
    _, rep = quantize(model, f"target=cos:0.9995,sensitivity={sensitivity}")
    assert rep.metrics["sensitivity"] == ("hybrid" if sensitivity == "auto" else sensitivity)  # no MatMul
    assert rep.metrics["target"] == "cos:0.9995" and rep.metrics["budget_allowed"] == 1  # its own target: all of it
    assert rep.metrics["budget_used"] <= 1
    assert loose.verification["outputs"]["y"]["cosine"] < 0.9995
    assert 1 <= rep.metrics["layers_float"] < 3
    assert rep.verification["outputs"]["y"]["cosine"] >= 0.9995  # same samples as the target


def test_fallback_layers_can_keep_int8_weights():
    # a strict target: some layer must compute in float, but per-channel int8 weights alone
    # cost far less than int8 activations
    model = conv_chain(np.random.default_rng(11))  # own stream: the same weights in any test order
    _, loose = quantize(model, "fallback=false")
    target = 1 - (1 - loose.verification["outputs"]["y"]["cosine"]) / 2  # half the all-int8 error
    plain, rep_plain = quantize(model, f"target=cos:{target},ladder=none")
    small, rep = quantize(model, f"target=cos:{target}")  # default ladder: Conv → int8 weights
    assert rep_plain.metrics["layers_float"] >= 1 and rep_plain.metrics["layers_weights"] == 0
    assert rep.metrics["budget_used"] <= 1 and rep.verification["outputs"]["y"]["cosine"] >= target
    n_weights = rep.metrics["layers_weights"]
    assert n_weights >= 1 and rep.metrics["layers_float"] == 0
    assert rep.rewrites["Conv→int8 weights only"] == n_weights
    weights = {t.name: numpy_helper.to_array(t) for t in small.graph.initializer}
    made_by = {o: n for n in small.graph.node for o in n.output}
    float_convs = [n for n in small.graph.node
                   if n.op_type == "Conv" and getattr(made_by.get(n.input[0]), "op_type", "") != "DequantizeLinear"]
    assert len(float_convs) == n_weights  # float activation in ...
    for conv in float_convs:  # ... but an int8 weight, per output channel: Mul(Cast(int8), scale)
        mul = made_by[conv.input[1]]
        cast = made_by[mul.input[0]]
        assert mul.op_type == "Mul" and cast.op_type == "Cast" and weights[cast.input[0]].dtype == np.int8
        assert weights[mul.input[1]].shape == (weights[cast.input[0]].shape[0], 1, 1, 1)
    assert small.ByteSize() < plain.ByteSize()


def test_weights_rung_is_folded_by_ort(tmp_path):
    # ORT folds Cast + Mul of constants at load: the layer is a plain float Conv at run time
    from onnxslim_kit.passes._quant.qdq import (
        quantize_weight,
        scaled_cast,
        weight_scales,
    )

    from onnxslim_kit.model import Model

    model = conv_chain(np.random.default_rng(11))
    m = Model.from_proto(model)
    conv = next(n for n in m.graph.nodes if n.op == "Conv")
    w0 = conv.inputs[1].values
    scales = weight_scales(w0, 0)
    conv.inputs[1] = scaled_cast(m, m.graph, quantize_weight(w0, scales, 0), scales.reshape(-1, 1, 1, 1))
    m.commit()
    proto = m.to_proto()
    fused = optimized_ops(proto, tmp_path)
    assert fused["Cast"] == 0 and fused["Mul"] == 0 and fused["DequantizeLinear"] == 0
    feeds = {"x": RNG.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    assert cosine(run_ort(model, feeds)[0], run_ort(proto, feeds)[0]) > 0.9999


def test_layers_whose_int8_weights_miss_the_target_go_float():
    # the middle conv's weights hold one input channel 300× smaller: 8 bits per output
    # channel flatten it, so even computing in float that layer needs its float weight
    out, rep = quantize(outlier_model(), "target=cos:0.9995,ladder=weights")
    assert rep.metrics["layers_float"] >= 1
    assert rep.verification["outputs"]["y"]["cosine"] >= 0.9995
    inits = {t.name for t in out.graph.initializer}
    assert any(n.op_type == "Conv" and n.input[1] in inits for n in out.graph.node)  # a float weight


def test_bad_ladder_is_a_user_error():
    from onnxslim_kit.errors import UserError

    with pytest.raises(UserError, match="unknown rung 'int4'"):
        quantize(conv_chain(), "ladder=int4")


def test_choose_fallback_ladder_search():
    from onnxslim_kit.passes.int8.ladder import choose_fallback

    # 6 layers; a layer costs `cost` in static int8, 0.3 on rung r1 (a, b, c, d have it), 0.05 on
    # r2 (only a), 0 float; the score (budget used) is the total cost
    cost = {"a": 5.0, "b": 4.0, "c": 3.0, "d": 2.0, "e": 0.5, "f": 0.4}
    rung_cost = {"r1": 0.3, "r2": 0.05, "float": 0.0}
    options = {"a": ["r1", "r2"], "b": ["r1"], "c": ["r1"], "d": ["r1"]}

    def build(assign):
        return sum(cost[n] if c == "int8" else rung_cost[c] for n, c in assign.items())

    def score(total, stop_above=None):
        return total

    def split(chosen):
        return {c: sorted(n for n in chosen if chosen[n] == c) for c in set(chosen.values())}

    # every layer on its first rung (e, f float) meets 1.5; then as few as possible leave int8
    chosen, value, sens = choose_fallback(list(cost), build, score, 1.5, options)
    assert split(chosen) == {"r1": ["a", "b", "c", "d"], "float": ["e", "f"]} and value == pytest.approx(1.2)
    assert max(sens, key=sens.get) == "a"  # ranked end to end, each layer alone
    # r1 everywhere misses 0.65: level 2 (a on r2, the rest float) meets it; then the most
    # sensitive stay at level 2 and the others climb back, level by level
    chosen, value, _ = choose_fallback(list(cost), build, score, 0.65, options)
    assert split(chosen) == {"r2": ["a"], "float": ["b", "e", "f"], "r1": ["c", "d"]}
    assert value == pytest.approx(0.65)
    # no rungs: the plain top-k float search
    chosen, value, _ = choose_fallback(list(cost), build, score, 1.5)
    assert split(chosen) == {"float": ["a", "b", "c", "d"], "int8": ["e", "f"]} and value == pytest.approx(0.9)
    # a target every layer in int8 meets: nothing falls back, nothing is ranked
    chosen, value, sens = choose_fallback(list(cost), build, score, 20.0, options)
    assert set(chosen.values()) == {"int8"} and value == pytest.approx(14.9) and sens == {}
    # a ranking kept from one search serves the next at another allowance: no layer ranked again
    ranked, builds = [], []
    first = choose_fallback(list(cost), lambda a: builds.append(a) or build(a), score, 1.5, options, ranking=ranked)
    singles = sum(len(a) == 1 for a in builds)
    second = choose_fallback(list(cost), lambda a: builds.append(a) or build(a), score, 0.65, options,
                             ranking=ranked)
    assert singles == len(cost) and sum(len(a) == 1 for a in builds) == singles  # ranking builds: one layer each
    assert first[0] == choose_fallback(list(cost), build, score, 1.5, options)[0]
    assert second[0] == choose_fallback(list(cost), build, score, 0.65, options)[0]


def test_dynamic_rung_adapts_to_each_input_range(tmp_path):
    # samples whose scale differs by 100×: one static range wastes the small ones' levels,
    # DynamicQuantizeLinear takes each input's own range
    model = build("h = MatMul (x, w1)\ny = MatMul (h, w2)", "float[16, 64] x", {"w1": w(64, 64), "w2": w(64, 32)})
    feed = CalibrationFeed(input_specs(model), [
        {"x": (RNG.standard_normal((16, 64)) * s).astype(np.float32)} for s in (100.0, 1.0, 0.5, 1.0)])
    out, report = run_pipeline(model, parse_pass_list("int8(target=cos:0.999,speed_check=false,smooth=0)"), feed,
                               verify_samples=4)
    rep = report.passes[-1]
    assert rep.metrics["layers_dynamic"] >= 1 and rep.metrics["layers_float"] == 0
    assert rep.rewrites["MatMul→int8 dynamic"] == rep.metrics["layers_dynamic"]
    assert rep.verification["outputs"]["y"]["cosine"] >= 0.999
    assert optimized_ops(out, tmp_path)["DynamicQuantizeMatMul"] == rep.metrics["layers_dynamic"]


def test_weights_rung_undoes_smoothing():
    # smoothed Q/K projections that fall back to int8 weights read the original input with the
    # original weight (quantized): the smoothing Mul is gone, the weights match the originals.
    # Whether the target needs the weights rung depends on the draw (seed 2: static int8 holds
    # it), so six draws with their own streams, and at least four take the rung.
    taken = 0
    for seed in range(6):
        model, _ = _smoothing_case(seed)
        inits_in = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        wq, wk = inits_in["wq"], inits_in["wk"]
        out, rep = quantize(model, "target=cos:0.9999,ladder=weights")
        assert rep.rewrites["smoothed activation"] == 1
        if not rep.metrics["layers_weights"]:
            continue
        taken += 1
        inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
        made_by = {o: n for n in out.graph.node for o in n.output}
        weight_only = [n for n in out.graph.node if n.op_type == "MatMul" and made_by[n.input[1]].op_type == "Mul"]
        assert len(weight_only) == rep.metrics["layers_weights"]
        for node in weight_only:
            assert node.input[0] == "h"  # the unsmoothed input
            mul = made_by[node.input[1]]
            got = inits[made_by[mul.input[0]].input[0]].astype(np.float32) * inits[mul.input[1]]
            assert min(np.abs(got - ref).max() for ref in (wq, wk)) <= np.abs(wq).max() / 127  # the original weight
        if rep.metrics["layers_weights"] == 2:  # the smoothing Mul lost its readers
            assert ops(out)["Mul"] == 1 + 2
    assert taken >= 4


def judge_fidelity(model, samples, target="cos:0.9995"):
    from onnxslim_kit.api import Fidelity

    return Fidelity.build(model, target, samples, "test samples")


def test_scorer_stops_at_the_first_sample_that_proves_failure():
    from onnxslim_kit.passes.int8.fallback import Scorer

    model = outlier_model()
    int8_model, _ = quantize(model, "fallback=false")
    samples = [{"x": RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)} for _ in range(8)]
    scorer = Scorer(judge_fidelity(model, samples))
    exact = scorer(int8_model)
    per_sample = [cosine(run_ort(model, s)[0], run_ort(int8_model, s)[0]) for s in samples]
    assert exact.verdict.scores[0].cosine == pytest.approx(min(per_sample), abs=1e-6) and scorer.runs == 8
    assert float(exact) == pytest.approx((1 - min(per_sample)) / 0.0005, rel=1e-3)  # the budget fraction
    first_fail = next(i for i, c in enumerate(per_sample) if c < 0.9995)
    bound = scorer(int8_model, stop_above=1.0)
    assert scorer.runs == 8 + first_fail + 1 and bound.verdict is None  # stopped there: a bound, no verdict
    assert float(bound) == pytest.approx((1 - min(per_sample[:first_fail + 1])) / 0.0005, rel=1e-3)
    assert 1.0 < bound <= exact
    scorer.runs = 0
    assert scorer(int8_model, stop_above=float(exact)) == exact and scorer.runs == 8  # never proven above


def test_scorer_bounds_pooled_decisions_after_the_first_sample():
    # a Sigmoid score map losing its decisions (scores pushed to the threshold) while the
    # cosines hold. The agreement is pooled over the samples: after the first sample it is
    # bounded with the rest taken as perfect (the reference itself), a bound below the final
    # budget use. Small samples are bounded after the first only, so a candidate that loses
    # them later runs them all; large ones (a run costs far more than a judgement) are bounded
    # again after each one, so such a candidate stops there.
    from onnxslim_kit.passes.int8.fallback import Scorer

    model = build("y = Sigmoid (x)", "float[1, 64] x", {})
    samples = [{"x": RNG.standard_normal((1, 64)).astype(np.float32)} for _ in range(4)]
    scorer = Scorer(judge_fidelity(model, samples, "cos:0.9"))
    ref = scorer.reference
    lost = [{"y": np.where(r["y"] > 0.25, 0.25, r["y"])} for r in ref]
    verdict = scorer.judge(lost)
    assert verdict.scores[0].cosine > 0.9 and verdict.scores[0].agreement == 0  # cosine alone would accept
    assert verdict.used == pytest.approx(1 / 0.1) and verdict.binding.startswith("y agreement")
    ran = []

    def replay(answers):
        def outputs(session, extra, batch):  # a "session" answering with ``answers``, sample by sample
            for i, got in enumerate(answers):
                ran.append(i)
                yield i, got
        return outputs

    scorer._outputs = replay(lost)
    bound = scorer.score_session(None, stop_above=1.0)
    above = [int((r["y"] > 0.25).sum()) for r in ref]
    assert ran == [0] and bound.verdict is None  # stopped after the first sample
    assert float(bound) == pytest.approx((1 - sum(above[1:]) / sum(above)) / 0.1) and bound <= verdict.used
    ran.clear()
    late = [{"y": ref[0]["y"]}] + lost[1:]  # the first sample keeps its decisions
    scorer._outputs = replay(late)
    assert not scorer.large
    used = scorer.score_session(None, stop_above=1.0)
    assert ran == [0, 1, 2, 3] and used.verdict is not None
    assert float(used) == pytest.approx((1 - above[0] / sum(above)) / 0.1) and used > 1.0
    ran.clear()
    scorer.large = True  # as if each sample's inputs were over BATCH_BYTES
    bound = scorer.score_session(None, stop_above=1.0)
    assert ran == [0, 1] and bound.verdict is None and bound > 1.0  # stopped at the second sample
    assert float(bound) == pytest.approx((above[1] / sum(above)) / 0.1)


def rare_class_map():
    """A 2-class Softmax over axis 1 (not the last): background everywhere (logit gap 100),
    8 sure class-1 pixels and a 4×4 block at the boundary (gap 0.2·x), which 8-bit steps of
    the Conv's input (~0.4) round to a tie. Cosine barely moves; the block's decisions flip."""
    scale, offset = np.zeros((1, 1, 16, 16), np.float32), np.full((1, 1, 16, 16), -50.0, np.float32)
    offset[0, 0, :2, :4] = 50.0
    offset[0, 0, 8:12, 4:8], scale[0, 0, 8:12, 4:8] = 0.0, 0.1
    return build("m = Mul (x, s)\nh = Add (m, o)\nc = Conv (h, wc)\ny = Softmax <axis = 1> (c)",
                 "float[1, 1, 16, 16] x",
                 {"s": scale, "o": offset, "wc": np.array([-1.0, 1.0], np.float32).reshape(2, 1, 1, 1)})


def test_default_target_keeps_class_decisions_that_cosine_misses():
    model = rare_class_map()
    samples = [{"x": RNG.standard_normal((1, 1, 16, 16)).astype(np.float32)} for _ in range(4)]

    def flips(out):
        return sum(int((run_ort(model, s)[0].argmax(1) != run_ort(out, s)[0].argmax(1)).sum()) for s in samples)

    cos_only, loose = quantize(model, "fallback=false")
    assert loose.metrics["layers_int8"] == 1 and loose.verification["outputs"]["y"]["cosine"] >= 0.99
    assert flips(cos_only) >= 4  # about half the boundary block, every sample: the cosine alone accepts that
    out, rep = quantize(model)  # the pipeline's default target cos:0.99: the softmax rows' decisions bind too
    assert rep.metrics["layers_int8"] == 0 and rep.metrics["budget_used"] <= rep.metrics["budget_allowed"]
    assert flips(out) == 0


def LOCAL():
    """A stream of its own: the module's RNG feeds the later tests' weights (order-dependent)."""
    return np.random.default_rng(11)


def test_bad_selector_is_a_user_error():
    from onnxslim_kit.errors import UserError

    with pytest.raises(UserError, match=r"^int8\(exclude=\.\.\.\): cannot read 'last:conv'; use NAME, re:REGEX"):
        quantize(conv_chain(), "exclude=last:conv")
    with pytest.raises(UserError, match=r"^int8\(include=\.\.\.\): bad regular expression '\*a'"):
        quantize(conv_chain(LOCAL()), "include=re:*a")
    with pytest.raises(UserError, match=r"^int8\(target=\.\.\.\): 'cosine': 'cosine' is not a number; expected cos:V"):
        quantize(conv_chain(), "target=cosine")
    with pytest.raises(UserError, match=r"^int8\(ladder=\.\.\.\): unknown rung 'int4'"):
        quantize(conv_chain(LOCAL()), "ladder=dynamic;int4")


@pytest.mark.parametrize("option, message", [
    ("target=cos:2", r"int8\(target=\.\.\.\): 'cos:2': a cos target must lie in \(0, 1\]"),
    ("target=top5:0.9", r"int8\(target=\.\.\.\): unknown target 'top5:0.9'; expected cos:V"),
    ("ladder=fast", r"int8\(ladder=\.\.\.\): unknown rung 'fast'"),
    ("exclude=op:", r"int8\(exclude=\.\.\.\): cannot read 'op:'"),
    ("include=first:Conv", r"int8\(include=\.\.\.\): cannot read 'first:Conv'"),
])
def test_bad_option_text_fails_before_any_pass_runs(option, message):
    from onnxslim_kit.errors import UserError

    model = conv_chain(LOCAL())
    feed = CalibrationFeed(input_specs(model), None, num_samples=2)
    lines = []
    with pytest.raises(UserError, match=message):
        run_pipeline(model, parse_pass_list(f"fuse,int8({option})"), feed, log=lines.append)
    assert lines == []  # fuse never ran (the pipeline logs "fuse: running" first)


def test_pipeline_logs_each_pass_it_runs():
    """The control for the test above: with valid options, fuse's run is in the log."""
    model = conv_chain(LOCAL())
    lines = []
    run_pipeline(model, parse_pass_list("fuse"), CalibrationFeed(input_specs(model), None, num_samples=1),
                 verify=False, log=lines.append)
    assert "fuse: running" in lines


def test_selector_matching_no_node_names_the_closest():
    from onnxslim_kit.errors import UserError

    model = conv_chain(LOCAL())
    for node, name in zip(model.graph.node[::2], ("conv_1", "conv_2", "head")):
        node.name = name
    with pytest.raises(UserError, match=r"^int8\(exclude=\.\.\.\): 'conv_12' matches no node; closest: conv_[12], conv_[12]"):
        quantize(model, "target=none,exclude=conv_12")
    with pytest.raises(UserError, match=r"'op:Gemm' matches no node; closest op types: "):
        quantize(model, "target=none,include=op:Gemm")
    # a node of the graph that is no layer matches nothing among the layers, but exists: no error
    _, rep = quantize(model, "target=none,exclude=op:Relu")
    assert rep.rewrites["Conv→int8"] == 3 and "excluded by include/exclude" not in rep.skipped


# --- speed check ----------------------------------------------------------------------------

@pytest.mark.parametrize("margin, kept_float", [(0.0, True), (1e6, False)])
def test_speed_check_keeps_float_when_int8_is_not_faster(margin, kept_float):
    # margin 0: no measured ratio can be ≤ 0, so int8 never "pays off"; 1e6: it always does
    model = conv_chain()
    out, rep = quantize(model, f"target=none,speed_check=true,speed_margin={margin}")
    assert rep.metrics["speed_ratio"] > 0 and rep.metrics["speed_rounds"] >= 3
    if kept_float:
        assert "QuantizeLinear" not in ops(out) and ops(out) == ops(model)
        assert rep.metrics["layers_int8"] == 0 and rep.metrics["layers_float"] == 3
        assert any("kept float; pass speed=off to force" in n for n in rep.notes)
        assert not rep.modified  # nothing to verify: the graph is the original
    else:
        assert ops(out)["QuantizeLinear"] == 3 and rep.metrics["layers_int8"] == 3


@pytest.mark.parametrize("ladder", ["none", "weights"])
def test_gated_ranking_matches_one_build_per_layer(ladder):
    # one session with every layer's twin behind a switch ranks like one build per layer
    # (Conv → Relu output points included), with far fewer builds
    model = outlier_model()
    opts = f"target=cos:0.9995,sensitivity=e2e,ladder={ladder}"
    gated, rep_gated = quantize(model, opts + ",gated_ranking=true")
    built, rep_built = quantize(model, opts + ",gated_ranking=false")
    for key in ("layers_int8", "layers_float", "layers_weights", "budget_used"):
        assert rep_gated.metrics[key] == rep_built.metrics[key], key
    assert rep_gated.metrics["fallback_builds"] < rep_built.metrics["fallback_builds"]
    assert rep_gated.notes == rep_built.notes


def test_smoothed_statistics_from_kept_inputs_equal_a_second_run(monkeypatch):
    # one calibration run keeps the smoothable inputs; past the memory bound a second run
    # over the smoothed graph measures them instead: the same model either way (to rounding)
    from onnxslim_kit.passes import int8 as int8_mod
    scale = np.ones(32, np.float32)
    scale[[3, 17, 30]] = 50.0
    model = build("h = Mul (x, s)\nq = MatMul (h, wq)\nk = MatMul (h, wk)\ny = Add (q, k)", "float[8, 32] x",
                  {"s": scale, "wq": w(32, 16, rng=np.random.default_rng(5)), "wk": w(32, 16, rng=np.random.default_rng(6))})
    kept, rep = quantize(model, "target=none")
    assert rep.rewrites["smoothed activation"] == 1
    monkeypatch.setattr(int8_mod, "KEEP_BYTES", 0)
    rerun, _ = quantize(model, "target=none")
    # the same encodings; only rounding differs (the run measured q = h·wq, the rerun h'·wq')
    assert [t.name for t in kept.graph.initializer] == [t.name for t in rerun.graph.initializer]
    for a, b in zip(kept.graph.initializer, rerun.graph.initializer):
        np.testing.assert_allclose(numpy_helper.to_array(a).astype(np.float64),
                                   numpy_helper.to_array(b).astype(np.float64), rtol=1e-6, atol=0)


def test_scorer_batches_small_samples_of_a_batch_free_model():
    from onnxslim_kit.passes.int8.fallback import BATCH_SAMPLES, Scorer

    model = build("h = MatMul (x, w1)\ny = Relu (h)", "float[N, 16] x", {"w1": w(16, 8)})
    int8_model, _ = quantize(model, "fallback=false")
    samples = [{"x": RNG.standard_normal((1, 16)).astype(np.float32)} for _ in range(5)]
    scorer = Scorer(judge_fidelity(model, samples))
    exact = scorer(int8_model)
    assert scorer.runs == 1 + -(-4 // BATCH_SAMPLES)  # the first sample, then the other four in batches
    per_sample = [cosine(run_ort(model, s)[0], run_ort(int8_model, s)[0]) for s in samples]
    assert exact.verdict.scores[0].cosine == pytest.approx(min(per_sample), abs=1e-6)
    # DynamicQuantizeLinear ranges over the whole tensor: a candidate holding one is scored
    # one sample at a time, or the batch would change its numbers
    dyn, _ = quantize(model, passes="dynamic(min_weights=1)")
    assert ops(dyn)["DynamicQuantizeLinear"] == 1
    scorer.runs = 0
    exact = scorer(dyn)
    assert scorer.runs == 5
    assert exact.verdict.scores[0].cosine == pytest.approx(
        min(cosine(run_ort(model, s)[0], run_ort(dyn, s)[0]) for s in samples), abs=1e-6)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_dynamic_rung_on_gemm_keeps_bias_and_layout(trans_b, tmp_path):
    rng = np.random.default_rng(7)
    b = w(24, 16, rng=rng) if trans_b else w(16, 24, rng=rng)
    model = build(f"y = Gemm <transB = {trans_b}> (x, b, c)", "float[N, 16] x", {"b": b, "c": w(24, rng=rng) + 3.0})
    feed = CalibrationFeed(input_specs(model), [
        {"x": (rng.standard_normal((4, 16)) * s).astype(np.float32)} for s in (30.0, 1.0, 0.3, 1.0)])
    out, report = run_pipeline(model, parse_pass_list("int8(target=cos:0.9995,speed_check=false,ladder=dynamic,smooth=0)"),
                               feed, verify_samples=4)
    rep = report.passes[-1]
    assert rep.metrics["layers_dynamic"] == 1 and rep.rewrites["Gemm→int8 dynamic"] == 1
    assert optimized_ops(out, tmp_path)["DynamicQuantizeMatMul"] == 1
    assert rep.verification["outputs"]["y"]["cosine"] >= 0.9995
