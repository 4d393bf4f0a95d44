"""The ``int4`` pass: packing and grids round-trip exactly, on-grid weights survive, both
encodings compute exactly A·deq(W) (+ bias), GPTQ beats RTN on its objective, heads and
opset handling, and a real model."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
import test_fp16 as fp16_tests
from conftest import cli_error, run_ort
from onnx import numpy_helper
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnxslim_kit.passes.int4 import awq as aw
from onnxslim_kit.passes.int4 import gptq as gq
from onnxslim_kit.passes.int4 import quant as iq
from onnxslim_kit.passes.int4 import rewrite as int4_rewrite
from onnxslim_kit.passes.int4 import rounds as int4_rounds
from onnxslim_kit.passes.int4 import target as int4_target
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.errors import UserError
from onnxslim_kit.metrics import cosine
from onnxslim_kit.model import load_proto, save_proto
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

RNG = np.random.default_rng(0)


def build(body: str, inputs: str, inits: dict, opset: int = 13) -> onnx.ModelProto:
    return fp16_tests.build(body, inputs, inits, opset=opset)


def int4(model, options: str = "", samples: int = 4):
    feed = CalibrationFeed(input_specs(model), None, num_samples=samples)
    out, report = run_pipeline(model, parse_pass_list(f"int4({options})" if options else "int4"), feed)
    return out, report.passes[0]


def feeds(model, seed=1):
    return fp16_tests.feeds(model, seed)


def inits(model) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def held_out(model, seed: int, n: int = 4) -> tuple:
    """Random samples the calibration did not see, and the float model's first output on them."""
    fresh = CalibrationFeed(input_specs(model), None, seed=seed).take(n)
    return fresh, [run_ort(model, f)[0] for f in fresh]


def dequantized_weights(model) -> list:
    """[K, N] float weights as the quantized model's MatMulNBits / DequantizeLinear encode them."""
    values, out = inits(model), []
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMulNBits":
            zeros = values[node.input[3]] if len(node.input) > 3 and node.input[3] else None
            qw = iq.from_nbits(values[node.input[1]], values[node.input[2]], zeros, attrs["K"], attrs["block_size"])
            out.append(iq.dequantize(qw).T)
        elif node.op_type == "DequantizeLinear":
            q = values[node.input[0]].astype(np.float32)
            z = values[node.input[2]].astype(np.float32) if len(node.input) > 2 else 0.0
            scale = values[node.input[1]]
            bs = attrs.get("block_size", 0)
            s = np.repeat(scale, bs, axis=0)[: q.shape[0]] if bs else scale
            z = np.repeat(z, bs, axis=0)[: q.shape[0]] if bs and np.ndim(z) else z
            out.append((q - z) * s)
    return out


# --- numbers -------------------------------------------------------------------------------

@pytest.mark.parametrize("length", [1, 2, 7, 64])
def test_nibble_packing_round_trips(length):
    codes = RNG.integers(0, 16, size=(3, length)).astype(np.uint8)
    packed = iq.pack_nibbles(codes)
    assert packed.shape == (3, (length + 1) // 2)
    assert packed[0, 0] == (codes[0, 0] | ((codes[0, 1] << 4) if length > 1 else 0))  # low nibble first
    np.testing.assert_array_equal(iq.unpack_nibbles(packed, length), codes)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("k", [64, 70])
def test_nbits_layout_round_trips_exactly(symmetric, k):
    qw = iq.quantize_rtn(RNG.standard_normal((5, k)).astype(np.float32), 32, symmetric)
    b, scales, zeros = iq.nbits_arrays(qw, np.float32)
    nb = -(-k // 32)
    assert b.shape == (5, nb, 16) and scales.shape == (5, nb)
    assert (zeros is None) == symmetric and (symmetric or zeros.shape == (5, (nb + 1) // 2))
    back = iq.from_nbits(b, scales, zeros, k, 32)
    np.testing.assert_array_equal(back.q, qw.q)
    np.testing.assert_array_equal(back.scale, qw.scale)
    np.testing.assert_array_equal(back.zero, qw.zero)


@pytest.mark.parametrize("signed", [True, False])
def test_int4_tensor_matches_onnx_unpacking(signed):
    codes = RNG.integers(1 if signed else 0, 16, size=(7, 3)).astype(np.uint8)
    back = numpy_helper.to_array(iq.int4_proto("w", codes, signed=signed)).astype(np.int16)
    np.testing.assert_array_equal(back, codes.astype(np.int16) - (8 if signed else 0))


@pytest.mark.parametrize("symmetric", [True, False])
def test_rtn_error_is_at_most_half_a_step(symmetric):
    wt = RNG.standard_normal((8, 96)).astype(np.float32)
    qw = iq.quantize_rtn(wt, 32, symmetric)
    step = np.repeat(qw.scale, 32, axis=1)
    assert np.all(np.abs(iq.dequantize(qw) - wt) <= step / 2 * (1 + 1e-5))


def on_grid(n, k, bs, symmetric):
    """A weight on the int4 grid: random codes, every block reaching both ends of its range."""
    nb = k // bs
    scale = RNG.uniform(0.01, 0.1, size=(n, nb)).astype(np.float32)
    if symmetric:
        zero = np.full((n, nb), 8, np.uint8)
        q = RNG.integers(1, 16, size=(n, nb, bs)).astype(np.uint8)
        q[:, :, 0] = 15  # +7 · s: the block's max |w|
    else:
        zero = RNG.integers(0, 16, size=(n, nb)).astype(np.uint8)
        q = RNG.integers(0, 16, size=(n, nb, bs)).astype(np.uint8)
        q[:, :, 0], q[:, :, 1] = 0, 15
    return iq.dequantize_values(q, scale[..., None], zero[..., None]).reshape(n, k)


@pytest.mark.parametrize("search", [False, True])
@pytest.mark.parametrize("symmetric", [True, False])
def test_weight_on_the_grid_survives(symmetric, search):
    wt = on_grid(6, 64, 32, symmetric)
    back = iq.dequantize(iq.quantize_rtn(wt, 32, symmetric, search))
    np.testing.assert_allclose(back, wt, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("symmetric", [True, False])
def test_range_search_never_increases_a_block_error(symmetric):
    wt = (RNG.standard_t(3, size=(16, 256))).astype(np.float32)  # heavy tails: clipping pays
    err = {}
    for search in (False, True):
        qw = iq.quantize_rtn(wt, 32, symmetric, search)
        err[search] = np.square(iq.dequantize(qw) - wt).reshape(16, 8, 32).sum(axis=-1)
    assert np.all(err[True] <= err[False] * (1 + 1e-6)) and err[True].sum() < 0.99 * err[False].sum()


def test_gptq_beats_rtn_on_its_objective():
    k, n = 128, 48
    x = RNG.standard_normal((512, k)).astype(np.float32) @ RNG.standard_normal((k, k)).astype(np.float32)
    wt = RNG.standard_normal((n, k)).astype(np.float32)
    xtx = gq.hessian_update(None, x)
    for symmetric in (True, False):
        rtn = iq.dequantize(iq.quantize_rtn(wt, 32, symmetric))
        gptq = iq.dequantize(gq.quantize_gptq(wt, xtx, 32, symmetric))
        err = lambda w: np.linalg.norm(x @ (wt - w).T)
        assert err(gptq) < 0.85 * err(rtn)


def test_gptq_keeps_on_grid_weight():
    wt = on_grid(8, 64, 32, True)
    x = RNG.standard_normal((256, 64)).astype(np.float32)
    back = iq.dequantize(gq.quantize_gptq(wt, gq.hessian_update(None, x), 32, True))
    np.testing.assert_allclose(back, wt, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_factor_is_the_upper_cholesky_of_the_inverse(act_order):
    x = RNG.standard_normal((200, 48)).astype(np.float32) * RNG.uniform(0.1, 3, 48).astype(np.float32)
    xtx = gq.hessian_update(None, x)
    u, dead, order = gq.gptq_factor(xtx, 0.01, act_order=act_order)
    h = xtx + 0.01 * np.mean(np.diag(xtx)) * np.eye(48)
    if act_order:
        assert np.all(np.diff(np.diag(xtx)[order]) <= 0)  # most active input first
        h = h[np.ix_(order, order)]
    assert not dead.any() and np.array_equal(u, np.triu(u)) and np.all(np.diag(u) > 0)
    np.testing.assert_allclose(u.T.astype(np.float64) @ u, np.linalg.inv(h), rtol=1e-3, atol=1e-6 * np.abs(
        np.linalg.inv(h)).max())


def test_gptq_act_order_beats_rtn_and_keeps_on_grid_weight():
    k, n = 128, 48
    x = RNG.standard_normal((512, k)).astype(np.float32) @ RNG.standard_normal((k, k)).astype(np.float32)
    x *= np.where(np.arange(k) % 8 == 0, 10, 1).astype(np.float32)
    xtx = gq.hessian_update(None, x)
    wt = RNG.standard_normal((n, k)).astype(np.float32)
    err = lambda w: np.linalg.norm(x @ (wt - w).T)
    rtn = err(iq.dequantize(iq.quantize_rtn(wt, 32, True)))
    ordered = err(iq.dequantize(gq.quantize_gptq(wt, xtx, 32, True, act_order=True)))
    assert ordered < 0.8 * rtn
    grid = on_grid(8, 64, 32, True)
    back = iq.dequantize(gq.quantize_gptq(grid, gq.hessian_update(None, x[:, :64]), 32, True, act_order=True))
    np.testing.assert_allclose(back, grid, rtol=1e-5, atol=1e-6)


def outlier_inputs(k: int, rows: int = 512) -> np.ndarray:
    """Activations where every 16th input channel is 20× louder (what AWQ is for)."""
    return (RNG.standard_normal((rows, k)) * np.where(np.arange(k) % 16 == 0, 20, 1)).astype(np.float32)


def test_awq_search_never_loses_to_plain_rtn_and_its_error_is_the_output_error():
    k, n = 128, 32
    x, wt = outlier_inputs(k), RNG.standard_normal((n, k)).astype(np.float32)
    xtx = gq.hessian_update(None, x)
    np.testing.assert_array_equal(aw.scales_for(xtx, 0.0), np.ones(k, np.float32))
    s, alpha, errors = aw.search_scales([wt], xtx, 32, True)
    assert alpha > 0 and errors[alpha] == min(errors.values()) <= errors[0.0]
    output_error = lambda w: float(np.square(x.astype(np.float64) @ (w - wt).T).sum())
    scaled = iq.dequantize(iq.quantize_rtn(wt * s, 32, True)) / s
    assert output_error(scaled) == pytest.approx(errors[alpha], rel=1e-3)
    assert output_error(scaled) < 0.7 * output_error(iq.dequantize(iq.quantize_rtn(wt, 32, True)))
    h_scaled = aw.scaled_hessian(xtx, s)
    np.testing.assert_allclose(h_scaled, gq.hessian_update(None, x / s), rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_awq_in_the_pass_is_a_mul_by_one_over_s_and_beats_plain(method):
    k = 64
    gain = np.where(np.arange(k) % 16 == 0, 20, 1).astype(np.float32)
    model = build("g = Mul(x, G)\ny = MatMul(g, W)", f"float[8, {k}] x",
                  {"G": gain, "W": RNG.standard_normal((k, 24)).astype(np.float32)})
    fresh, ref = held_out(model, seed=9)
    err = {}
    for awq in ("false", "true"):
        out, report = int4(model, f"awq={awq},method={method},search=false,block_size=32,symmetric=true,"
                                  "accuracy_level=0", samples=16)
        err[awq] = sum(float(np.square(r - run_ort(out, f)[0]).sum()) for r, f in zip(ref, fresh))
    assert report.rewrites["awq input scaling (Mul)"] == 1 and report.metrics["awq_alpha"][0] > 0
    inv = next(v for name, v in inits(out).items() if "awq_inv_scale" in name)
    (w_deq,) = dequantized_weights(out)
    x = fresh[0]["x"]
    np.testing.assert_allclose(run_ort(out, fresh[0])[0], (x * gain * inv) @ w_deq, rtol=1e-4, atol=1e-3)
    assert err["true"] < 0.8 * err["false"]
    assert report.metrics["weight_ratio"] == pytest.approx((k * 24 / 2 + 24 * 2 * 4 + k * 4) / (k * 24 * 4), rel=1e-3)


def test_float_weights_are_read_without_caching_them_in_the_graph():
    w = RNG.standard_normal((64, 48)).astype(np.float32)
    graph = gs.import_onnx(build(MATMUL, "float[2, 64] x", {"W": w}))
    const = graph.nodes[0].inputs[1]
    assert isinstance(const._values, LazyValues)
    np.testing.assert_array_equal(int4_target.read(const), w)
    assert isinstance(const._values, LazyValues)  # still not loaded: no second float copy kept


def test_external_data_model_is_quantized(tmp_path):
    w = RNG.standard_normal((256, 64)).astype(np.float32)
    path = save_proto(build(MATMUL, "float[2, 256] x", {"W": w}), tmp_path / "m.onnx", external_data=True)
    assert (tmp_path / "m.onnx.data").stat().st_size == w.nbytes
    model = load_proto(path)
    out, report = int4(model, "accuracy_level=0")
    (w_deq,) = dequantized_weights(out)
    x = feeds(model)
    np.testing.assert_allclose(run_ort(out, x)[0], x["x"] @ w_deq, rtol=1e-4, atol=1e-4)
    assert report.rewrites == {"MatMul→int4 nbits": 1}


# --- the pass on graphs --------------------------------------------------------------------

MATMUL = "y = MatMul(x, W)"


@pytest.mark.parametrize("fmt", ["nbits", "qdq"])
@pytest.mark.parametrize("symmetric", ["true", "false"])
def test_matmul_computes_a_times_dequantized_weight(fmt, symmetric):
    model = build(MATMUL, "float[2, 3, 96] x", {"W": RNG.standard_normal((96, 40)).astype(np.float32)})
    out, report = int4(model, f"format={fmt},symmetric={symmetric},block_size=32,accuracy_level=0")
    ops = [n.op_type for n in out.graph.node]
    assert ("MatMulNBits" in ops) == (fmt == "nbits") and ("DequantizeLinear" in ops) == (fmt == "qdq")
    (w_deq,) = dequantized_weights(out)
    x = feeds(model)
    np.testing.assert_allclose(run_ort(out, x)[0], x["x"] @ w_deq, rtol=1e-4, atol=1e-4)
    assert report.metrics["weight_ratio"] < (0.16 if symmetric == "true" else 0.17)
    assert report.verification["status"] == "drift"


@pytest.mark.parametrize("fmt", ["nbits", "qdq"])
def test_on_grid_weight_gives_the_float_outputs(fmt):
    wt = on_grid(24, 64, 32, True)
    model = build(MATMUL, "float[4, 64] x", {"W": np.ascontiguousarray(wt.T)})
    out, _ = int4(model, f"format={fmt},block_size=32,symmetric=true,accuracy_level=0")
    x = feeds(model)
    np.testing.assert_allclose(run_ort(out, x)[0], run_ort(model, x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["nbits", "qdq"])
def test_gemm_alpha_beta_transb_bias(fmt):
    b = RNG.standard_normal((24, 64)).astype(np.float32)  # transB: [N, K]
    c = RNG.standard_normal(24).astype(np.float32)
    model = build('y = Gemm<alpha=0.5, beta=2.0, transB=1>(x, B, C)', "float[3, 64] x", {"B": b, "C": c})
    out, _report = int4(model, f"format={fmt},accuracy_level=0")
    assert "Gemm" not in [n.op_type for n in out.graph.node]
    (w_deq,) = dequantized_weights(out)
    x = feeds(model)
    np.testing.assert_allclose(run_ort(out, x)[0], x["x"] @ w_deq + 2.0 * c, rtol=1e-4, atol=1e-4)
    assert cosine(run_ort(out, x)[0], run_ort(model, x)[0]) > 0.99


def test_default_accuracy_level_4_quantizes_activations_only_slightly():
    model = build(MATMUL, "float[8, 128] x", {"W": RNG.standard_normal((128, 64)).astype(np.float32)})
    fast, _ = int4(model)
    exact, _ = int4(model, "accuracy_level=0")
    levels = [a.i for n in fast.graph.node for a in n.attribute if a.name == "accuracy_level"]
    assert levels == [4] and not [a for n in exact.graph.node for a in n.attribute if a.name == "accuracy_level"]
    x = feeds(model)
    a, b = run_ort(exact, x)[0], run_ort(fast, x)[0]
    assert not np.array_equal(a, b) and cosine(a, b) > 0.999


def test_float16_weights_get_float16_scales_and_float_compute():
    w16 = RNG.standard_normal((64, 24)).astype(np.float16)
    model = fp16_tests.build(MATMUL, "float16[4, 64] x", {"W": w16}, outputs="float16 y", opset=13)
    out, _ = int4(model)
    node = next(n for n in out.graph.node if n.op_type == "MatMulNBits")
    assert not [a for a in node.attribute if a.name == "accuracy_level"]
    assert inits(out)[node.input[2]].dtype == np.float16
    x = {"x": feeds(model)["x"].astype(np.float16)}
    assert cosine(run_ort(out, x)[0], run_ort(model, x)[0]) > 0.99


def test_skips_are_counted():
    model = build("h = MatMul(x, W)\nt = Transpose(h)\ny = MatMul(h, t)",
                  "float[8, 32] x", {"W": RNG.standard_normal((32, 8)).astype(np.float32)})
    _out, report = int4(model)
    assert report.skipped == {"weight is not a 2-D constant": 1}
    assert report.rewrites == {"MatMul→int4 nbits": 1}


def test_short_reduction_is_skipped():
    model = build(MATMUL, "float[2, 8] x", {"W": RNG.standard_normal((8, 16)).astype(np.float32)})
    _out, report = int4(model)
    assert report.skipped == {"reduction axis K < 16": 1} and not report.modified


@pytest.mark.parametrize("head", ["float", "int8"])
def test_skip_last_keeps_the_head(head):
    model = build(
        "h = MatMul(x, W1)\nr = Relu(h)\ny = MatMul(r, W2)", "float[4, 64] x",
        {"W1": RNG.standard_normal((64, 64)).astype(np.float32), "W2": RNG.standard_normal((64, 10)).astype(np.float32)},
    )
    out, report = int4(model, f"skip_last=true,head={head}")
    assert report.rewrites["MatMul→int4 nbits"] == 1
    if head == "float":
        assert report.skipped == {"kept float (skip_last/exclude)": 1}
        assert "W2" in inits(out)
    else:
        assert report.rewrites["kept layer→int8"] == 1
        assert any(v.dtype == np.int8 and v.shape == (64, 10) for v in inits(out).values())


def test_heads_are_the_layers_nothing_quantized_follows():
    # the residual Add lets W1's output reach y without a MatMul: W1 is still not a head
    model = build("h1 = MatMul(x, W1)\na = Add(h1, x)\nh2 = MatMul(a, W2)\ny = Add(h2, a)", "float[4, 32] x",
                  {"W1": RNG.standard_normal((32, 32)).astype(np.float32),
                   "W2": RNG.standard_normal((32, 32)).astype(np.float32)})
    out, report = int4(model, "skip_last=true")
    assert report.rewrites == {"MatMul→int4 nbits": 1} and "W2" in inits(out) and "W1" not in inits(out)


def three_named_layers() -> onnx.ModelProto:
    model = build("h1 = MatMul(x, W1)\nh2 = MatMul(h1, W2)\ny = MatMul(h2, W3)", "float[4, 32] x",
                  {f"W{i}": RNG.standard_normal((32, 32)).astype(np.float32) for i in (1, 2, 3)})
    for node, name in zip(model.graph.node, ["enc/q", "enc/ffn", "dec/q"]):
        node.name = name
    return model


def test_exclude_selects_layers_by_name():
    model = three_named_layers()
    _out, report = int4(model, "exclude=re:ffn;re:^dec,head=int8")
    assert report.rewrites == {"MatMul→int4 nbits": 1, "kept layer→int8": 2}
    _out, report = int4(model, "exclude=last:MatMul:1;enc/q,head=int8")
    assert report.rewrites == {"MatMul→int4 nbits": 1, "kept layer→int8": 2}
    with pytest.raises(UserError, match="bad regular expression"):
        int4(model, "exclude=re:[a")
    with pytest.raises(UserError, match=r"'enc/fn' matches no node; closest: enc/ffn"):
        int4(model, "exclude=enc/fn")
    with pytest.raises(UserError, match="has no option 'keep'.*renamed: use exclude=re:REGEX"):
        int4(model, "keep=ffn")


@pytest.mark.parametrize("how", ["option", "global"])
def test_excluded_layer_is_left_as_it_was(how):
    """``exclude=`` (head=float) and the global ``--exclude`` (whatever ``head`` says) leave the
    selected MatMul exactly as it was: same node, same float weight; the others become int4."""
    model = three_named_layers()
    feed = CalibrationFeed(input_specs(model), None, num_samples=4)
    if how == "option":
        out, report = run_pipeline(model, parse_pass_list("int4(exclude=enc/ffn,max_ratio=0)"), feed)
        assert report.passes[0].skipped["kept float (skip_last/exclude)"] == 1
    else:
        out, report = run_pipeline(model, parse_pass_list("int4(head=int8,max_ratio=0)"), feed, exclude="enc/ffn")
        assert report.passes[0].skipped["excluded (--exclude)"] == 1
    assert report.passes[0].rewrites == {"MatMul→int4 nbits": 2}
    kept = [n for n in out.graph.node if n.name == "enc/ffn"]
    assert len(kept) == 1 and kept[0].op_type == "MatMul" and list(kept[0].input) == ["h1", "W2"]
    np.testing.assert_array_equal(inits(out)["W2"], inits(model)["W2"])
    assert sum(n.op_type == "MatMulNBits" for n in out.graph.node) == 2


def test_cli_exclude_matching_nothing_exits_2_with_one_line(tmp_path, capsys):
    line = cli_error(tmp_path, three_named_layers(), "int4(exclude=nope)", capsys)
    assert line.startswith("error: int4(exclude=...): 'nope' matches no node")


@pytest.mark.parametrize("sequential, rounds", [("true", 2), ("false", 1)])
def test_sequential_gptq_runs_a_round_per_depth(sequential, rounds):
    model = build("h = MatMul(x, W1)\nh2 = MatMul(x, W3)\ny = MatMul(h, W2)", "float[8, 32] x",
                  {f"W{i}": RNG.standard_normal((32, 32)).astype(np.float32) for i in (1, 2, 3)})
    _out, report = int4(model, f"method=gptq,sequential={sequential}")
    assert report.metrics["gptq_rounds"] == rounds and report.rewrites == {"MatMul→int4 nbits": 3}


def test_qdq_upgrades_old_opsets_or_says_why():
    model = build(MATMUL, "float[2, 64] x", {"W": RNG.standard_normal((64, 16)).astype(np.float32)}, opset=13)
    out, report = int4(model, "format=qdq")
    assert out.opset_import[0].version == 21 and report.rewrites == {"MatMul→int4 qdq": 1}
    out, report = int4(model, "format=qdq,upgrade_opset=false")
    assert not report.modified and list(report.skipped) == ["qdq needs opset 21, model has 13 (upgrade_opset=false)"]


def test_gptq_in_the_pass_beats_rtn():
    k = 64
    mix = RNG.standard_normal((k, k)).astype(np.float32)
    model = build("h = MatMul(x, M)\ny = MatMul(h, W)", f"float[16, {k}] x",
                  {"M": mix, "W": RNG.standard_normal((k, 32)).astype(np.float32)})
    fresh, ref = held_out(model, seed=7)
    cos = {}
    for method in ("rtn", "gptq"):
        out, _ = int4(model, f"method={method}", samples=16)
        cos[method] = min(cosine(r, run_ort(out, f)[0]) for r, f in zip(ref, fresh))
    assert cos["gptq"] > cos["rtn"]


@pytest.mark.realmodel
def test_mtcnn_onet_int4():
    from onnxslim_kit.model import load_proto
    from onnxslim_kit.zoo import fetch

    model = load_proto(fetch("mtcnn_onet"))
    out, report = int4(model, "method=gptq", samples=8)
    assert sum(report.rewrites.values()) == 4 and report.rewrites["MatMul→int4 nbits"] >= 1
    assert report.metrics["weight_ratio"] <= 0.16
    fresh = CalibrationFeed(input_specs(model), None, seed=5).take(2)
    for f in fresh:
        for a, b in zip(run_ort(model, f), run_ort(out, f)):
            assert cosine(a, b) > 0.99


# --- H-weighted range search, 8-bit blocks, mixed precision ----------------------------------

def test_importance_weighted_search_lowers_the_output_error():
    k, n = 128, 32
    loud = np.where(np.arange(k) % 8 == 0, 30.0, 1.0).astype(np.float32)  # a few loud input channels
    x = RNG.standard_normal((512, k)).astype(np.float32) * loud
    wt = RNG.standard_normal((n, k)).astype(np.float32)
    h = (x.T @ x).astype(np.float32)
    err = {}
    for name, importance in (("mse", None), ("diag", np.diag(h))):
        err[name] = aw.output_error(wt, iq.dequantize(iq.quantize_rtn(wt, 32, True, True, importance)), h)
    plain = aw.output_error(wt, iq.dequantize(iq.quantize_rtn(wt, 32, True)), h)
    assert err["diag"] < 0.9 * err["mse"] and err["diag"] < plain


def test_int8_blocks_round_trip_and_matmulnbits_bits8_is_exact():
    from onnxslim_kit.model import Model

    wt = RNG.standard_normal((24, 200)).astype(np.float32)
    codes, scale = iq.quantize_int8_blocks(wt, 128)
    deq = iq.dequantize_int8_blocks(codes, scale, 200)
    assert codes.shape == (24, 2, 128) and np.abs(deq - wt).max() <= scale.max() / 2 + 1e-6
    again, _ = iq.quantize_int8_blocks(deq, 128)
    np.testing.assert_array_equal(again, codes)  # on-grid values survive
    model = build(MATMUL, "float[3, 200] x", {"W": np.ascontiguousarray(wt.T)})
    m = Model.from_proto(model)
    target = int4_target.match(next(nd for nd in m.graph.nodes if nd.op == "MatMul"))
    consts = [gs.Constant("B8", codes), gs.Constant("S8", scale), None]
    int4_rewrite.rewrite_nbits(m, target, consts, (200, 24, 8, 128), {"accuracy_level": 0})
    m.commit()
    x = feeds(model)
    np.testing.assert_allclose(run_ort(m.to_proto(), x)[0], x["x"] @ deq.T, rtol=1e-4, atol=1e-4)


def test_mixed_precision_promotes_the_sensitive_layer_within_the_budget():
    k = 256
    loud = np.where(np.arange(k) < 8, 40.0, 1.0).astype(np.float32)
    model = build("a = MatMul(x, W1)\nb = Mul(a, G)\ny = MatMul(b, W2)", f"float[8, {k}] x",
                  {"W1": RNG.standard_normal((k, k)).astype(np.float32),
                   "G": loud, "W2": RNG.standard_normal((k, k)).astype(np.float32)})
    fresh, ref = held_out(model, seed=3)
    worst = {}
    for ratio in ("0", "0.21"):
        out, report = int4(model, f"method=rtn,max_ratio={ratio},accuracy_level=0", samples=8)
        worst[ratio] = min(cosine(r, run_ort(out, f)[0]) for r, f in zip(ref, fresh))
        bits = sorted(onnx.helper.get_attribute_value(a) for nd in out.graph.node if nd.op_type == "MatMulNBits"
                      for a in nd.attribute if a.name == "bits")
        if ratio == "0":
            assert bits == [4, 4] and "int8_layers" not in report.metrics
        else:
            # one 256×256 layer at 8 bits (0.258×) and one at int4 (0.143×): 0.201× ≤ 0.21; both would not fit
            assert bits == [4, 8] and len(report.metrics["int8_layers"]) == 1
            assert report.metrics["weight_ratio"] <= 0.21
    assert worst["0.21"] > worst["0"]


def test_gptq_hessians_in_small_rounds_give_the_same_model(monkeypatch):
    """Hessians are taken and dropped round by round (bounded memory); every round measures the
    model as it was on entry, so the rounds' size does not change a single byte of the result."""
    k = 64
    model = build("h = MatMul(x, W1)\nr = Relu(h)\ny = MatMul(r, W2)", f"float[8, {k}] x",
                  {"W1": RNG.standard_normal((k, k)).astype(np.float32),
                   "W2": RNG.standard_normal((k, k)).astype(np.float32)})
    one_round, _ = int4(model, "method=gptq,max_ratio=0", samples=8)
    rounds = []
    original = int4_rounds.hessian_rounds

    def counted(*args):
        for part in original(*args):
            rounds.append(sorted(part))
            yield part

    monkeypatch.setattr(int4_rounds, "HESSIAN_BYTES_PER_ROUND", 1)
    monkeypatch.setattr(int4_rounds, "hessian_rounds", counted)
    small_rounds, _ = int4(model, "method=gptq,max_ratio=0", samples=8)
    assert len(rounds) == 2 and all(len(r) == 1 for r in rounds)
    assert small_rounds.SerializeToString() == one_round.SerializeToString()


def test_int4_results_held_packed_give_the_same_model(monkeypatch):
    """The int4 results held for the mixed-precision choice keep their codes two to a byte: half
    the bytes, unpacked exactly, and the model is byte for byte the one made from unpacked codes."""
    qw = gq.quantize_gptq(RNG.standard_normal((24, 80)).astype(np.float32),
                          gq.hessian_update(None, RNG.standard_normal((40, 80))), 16, False)
    packed = int4_rounds.packed(qw)
    assert packed.q.nbytes * 2 == qw.q.nbytes
    assert np.array_equal(int4_rounds.codes(packed).q, qw.q) and int4_rounds.codes(qw) is qw
    assert np.array_equal(iq.dequantize(int4_rounds.codes(packed)), iq.dequantize(qw))
    k = 64
    model = build("h = MatMul(x, W1)\nr = Relu(h)\ny = MatMul(r, W2)", f"float[8, {k}] x",
                  {"W1": RNG.standard_normal((k, k)).astype(np.float32),
                   "W2": RNG.standard_normal((k, k)).astype(np.float32)})
    held, _ = int4(model, "method=gptq,max_ratio=0.25,target=none", samples=8)
    bits = sorted(next((a.i for a in n.attribute if a.name == "bits"), 0) for n in held.graph.node
                  if n.op_type == "MatMulNBits")
    assert bits == [4, 8]  # one layer chosen from the held int4 results' losses, one encoded from them
    monkeypatch.setattr(int4_rounds, "packed", lambda q: q)
    unpacked, _ = int4(model, "method=gptq,max_ratio=0.25,target=none", samples=8)
    assert held.SerializeToString() == unpacked.SerializeToString()
