"""``svd``: factorisation math, rank rules, im2col rows, rewrites (exact at full rank), skips."""

import numpy as np
import onnx
import pytest
from conftest import assert_left_float, run_ort, run_zoo
from onnx import TensorProto, helper, numpy_helper
from onnxslim_kit.passes.svd.maths.factor import Factorization, breakeven_rank, shrinkage
from onnxslim_kit.passes.svd.speed import decide, measured_ratio
from onnxslim_kit.passes._common.layer_stats import ConvGeometry, conv_rows

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.errors import UserError
from onnxslim_kit.metrics import compare, cosine
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline


def model_with(nodes, inputs, weights, opset=13):
    """A float model with output ``y`` (its shape found by running it once)."""
    def build(out_shape):
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
            [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in weights.items()],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    probe = run_ort(build(None), {n: np.zeros(s, np.float32) for n, s in inputs})[0]
    model = build(list(probe.shape))
    onnx.checker.check_model(model, full_check=True)
    return model


def run_svd(model, spec, calib=None):
    feed = CalibrationFeed(input_specs(model), calib)
    out, report = run_pipeline(model, parse_pass_list(spec), feed)
    return out, report.passes[0]


def variants(rng):
    w = rng.standard_normal
    return {
        "matmul-3d": model_with([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [2, 5, 12])], {"w": w((12, 7))}),
        "gemm": model_with([helper.make_node("Gemm", ["x", "w", "c"], ["y"], alpha=0.7, beta=1.3)],
                           [("x", [4, 12])], {"w": w((12, 9)), "c": w(9)}),
        "gemm-transB": model_with([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], [("x", [4, 12])],
                                  {"w": w((9, 12))}, opset=11),
        "conv1x1-stride-pad": model_with(
            [helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 0, 1, 0])],
            [("x", [1, 6, 9, 9])], {"w": w((10, 6, 1, 1)), "b": w(10)}),
        "conv3x3-dilated": model_with(
            [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[2, 1, 2, 1], dilations=[2, 1])],
            [("x", [2, 4, 8, 8])], {"w": w((8, 4, 3, 3)), "b": w(8)}),
        "conv-same-upper": model_with(
            [helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
            [("x", [1, 3, 7, 7])], {"w": w((5, 3, 2, 2))}),
    }


@pytest.mark.parametrize("data", ["true", "false"])
@pytest.mark.parametrize("name", ["matmul-3d", "gemm", "gemm-transB", "conv1x1-stride-pad", "conv3x3-dilated",
                                  "conv-same-upper"])
def test_full_rank_reproduces_outputs(name, data, rng):
    model = variants(rng)[name]
    calib = CalibrationFeed(input_specs(model), None, num_samples=8, seed=3).take(8)
    out, entry = run_svd(model, f"svd(force=true,rank=-1,data={data})", calib)
    assert entry.lossless and entry.verification["status"] == "ok"
    assert sum(entry.rewrites.values()) == 1
    assert len(out.graph.node) == 2
    onnx.checker.check_model(out, full_check=True)
    for sample in calib[:3]:
        drift = compare(run_ort(model, sample)[0], run_ort(out, sample)[0])
        assert drift.max_rel <= 1e-5


def test_breakeven_rank():
    for k, n in [(4, 2), (120, 360), (256, 256), (1152, 256), (3, 1)]:
        r = breakeven_rank(k, n)
        assert r * (k + n) < k * n or r == 0
        assert (r + 1) * (k + n) >= k * n


def test_rank_rules_follow_singular_values(rng):
    u, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    v, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    s = np.array([3.0, 2.0, 1.0, 0.5, 0, 0, 0, 0])
    fact = Factorization(u @ np.diag(s) @ v.T)
    # kept energy: 9, 13, 14, 14.25 out of 14.25
    assert fact.choose_rank(energy=0.9)[0] == 2  # 13/14.25 = 0.912
    assert fact.choose_rank(cosine=0.99)[0] == 3  # needs 0.9801; 14/14.25 = 0.982
    assert fact.choose_rank(ratio=0.5)[0] == 2  # ⌊0.5·64/16⌋
    assert fact.choose_rank(rank=5)[0] == 5 and fact.choose_rank(rank=-1)[0] == 8
    a, b = fact.factors(4)
    np.testing.assert_allclose(a @ b, u @ np.diag(s) @ v.T, atol=1e-12)


def test_whitening_minimises_output_error(rng):
    k, n, rows, r = 32, 24, 4000, 6
    mixing = rng.standard_normal((k, k)) * np.logspace(0, -3, k)  # strongly anisotropic inputs
    x = rng.standard_normal((rows, k)) @ mixing.T
    w = rng.standard_normal((k, n))
    gram = x.T @ x / rows
    fourth = float(np.sum(np.sum(x**2, axis=1) ** 2))
    plain = Factorization(w)
    white = Factorization(w, gram, rows, fourth)
    assert white.shrinkage < 0.05
    err = {}
    for label, fact in (("plain", plain), ("white", white)):
        a, b = fact.factors(r)
        err[label] = np.linalg.norm(x @ (w - a @ b)) / np.linalg.norm(x @ w)
    assert err["white"] < 0.5 * err["plain"]
    a, b = white.factors(r)
    estimated = np.sqrt(white.kept_energy(r))
    assert abs(cosine(x @ w, x @ a @ b) - estimated) < 0.01


def test_heldout_cosine_matches_direct_computation(rng):
    k, n = 20, 12
    x_fit = rng.standard_normal((300, k)) @ rng.standard_normal((k, k))
    x_other = rng.standard_normal((200, k)) @ rng.standard_normal((k, k))
    w = rng.standard_normal((k, n))
    fact = Factorization(w, x_fit.T @ x_fit / 300, 300, float(np.sum(np.sum(x_fit**2, 1) ** 2)))
    heldout = fact.heldout_cosine(w, x_other.T @ x_other / 200)
    for r in (1, 5, 12):
        a, b = fact.factors(r)
        assert abs(heldout[r - 1] - cosine(x_other @ w, x_other @ a @ b)) < 1e-9
    assert fact.choose_rank(cosine=0.99, heldout=heldout)[0] == int(np.argmax(heldout >= 0.99)) + 1


def test_shrinkage_is_large_for_few_rows(rng):
    x = rng.standard_normal((3, 20))
    gram = x.T @ x / 3
    many = rng.standard_normal((20000, 20)) * np.linspace(1, 3, 20)
    assert shrinkage(gram, 3, float(np.sum(np.sum(x**2, 1) ** 2))) > 0.3
    g2 = many.T @ many / len(many)
    assert shrinkage(g2, len(many), float(np.sum(np.sum(many**2, 1) ** 2))) < 0.05


@pytest.mark.parametrize("strides,dilations,pads", [((1, 1), (1, 1), (1, 1, 1, 1)), ((2, 1), (1, 2), (0, 2, 1, 0))])
def test_conv_rows_match_ort_conv(strides, dilations, pads, rng):
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    model = model_with([helper.make_node("Conv", ["x", "w"], ["y"], strides=list(strides), dilations=list(dilations),
                                         pads=list(pads))], [("x", list(x.shape))], {"w": w})
    y = run_ort(model, {"x": x})[0]
    rows, total = conv_rows(x, ConvGeometry((3, 2), strides, dilations, pads), np.random.default_rng(0), max_rows=10**6)
    assert total == y.shape[0] * y.shape[2] * y.shape[3]
    expected = y.transpose(0, 2, 3, 1).reshape(-1, 4)
    np.testing.assert_allclose(rows @ w.reshape(4, -1).T, expected, rtol=1e-4, atol=1e-4)


def low_rank_matmul(rng, k=256, n=256, rank=4, rows=64):
    w = rng.standard_normal((k, rank)) @ rng.standard_normal((rank, n))
    return model_with([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [rows, k])], {"w": w})


def test_default_finds_the_true_rank(rng):
    out, entry = run_svd(low_rank_matmul(rng), "svd(measure=false)")
    assert entry.rewrites == {"matmul → 2 × matmul": 1}
    ranks = sorted(numpy_helper.to_array(t).shape for t in out.graph.initializer)
    assert ranks == [(4, 256), (256, 4)]
    assert entry.verification["outputs"]["y"]["cosine"] >= 0.999
    assert entry.metrics["flops_after"] == 2 * 64 * 4 * (256 + 256)
    assert entry.metrics["flops_before"] == 2 * 64 * 256 * 256
    assert any("plain SVD" in note for note in entry.notes)


def test_full_rank_weight_is_left_alone(rng):
    model = model_with([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [8, 64])],
                       {"w": rng.standard_normal((64, 64))})
    out, entry = run_svd(model, "svd(measure=false)")
    assert not entry.rewrites and entry.skipped == {"rank needed does not pay off": 1}
    assert len(out.graph.node) == 1


def test_calibration_data_makes_it_data_aware(rng):
    model = low_rank_matmul(rng, k=64, n=64, rank=2, rows=32)
    calib = CalibrationFeed(input_specs(model), None, num_samples=4).take(4)
    _, entry = run_svd(model, "svd(measure=false)", calib)
    assert any(note.startswith("data-aware") for note in entry.notes)
    assert entry.rewrites and entry.verification["outputs"]["y"]["cosine"] >= 0.999


def test_output_target_drops_damaging_rewrites(rng):
    w = rng.standard_normal
    model = model_with([helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["y"])],
                       [("x", [16, 64])], {"w1": w((64, 64)), "w2": w((64, 64))})
    calib = CalibrationFeed(input_specs(model), None, num_samples=4).take(4)
    _, free = run_svd(model, "svd(rank=2,measure=false,target=0)", calib)
    assert sum(free.rewrites.values()) == 2 and free.verification["outputs"]["y"]["cosine"] < 0.9
    out, held = run_svd(model, "svd(rank=2,measure=false,target=0.9999)", calib)
    assert not held.rewrites and held.skipped["dropped to hold the output target"] == 2
    assert len(out.graph.node) == 2


def test_output_target_keeps_the_harmless_rewrite(rng):
    w = rng.standard_normal
    exact = w((64, 2)) @ w((2, 64))  # rank 2: factorising at r=2 is exact
    model = model_with([helper.make_node("MatMul", ["x", "noisy"], ["h"]), helper.make_node("MatMul", ["h", "exact"], ["y"])],
                       [("x", [16, 64])], {"noisy": w((64, 64)), "exact": exact})
    calib = CalibrationFeed(input_specs(model), None, num_samples=4).take(4)
    out, entry = run_svd(model, "svd(rank=2,measure=false,target=0.999)", calib)
    assert entry.rewrites == {"matmul → 2 × matmul": 1}
    assert entry.skipped["dropped to hold the output target"] == 1
    names = {t.name for t in out.graph.initializer}
    assert "noisy" in names and "exact" not in names
    assert entry.verification["outputs"]["y"]["cosine"] >= 0.999


def two_low_rank_layers(rng):
    """A MatMul and a 1×1 Conv, both of rank 2 (each factorises exactly at r=2); nodes named."""
    w = rng.standard_normal
    model = model_with([helper.make_node("Conv", ["x", "cw"], ["c"], name="conv"),
                        helper.make_node("Flatten", ["c"], ["f"], name="flat"),
                        helper.make_node("MatMul", ["f", "mw"], ["y"], name="head")],
                       [("x", [4, 64, 1, 1])],
                       {"cw": (w((64, 2)) @ w((2, 64))).reshape(64, 64, 1, 1), "mw": w((64, 2)) @ w((2, 64))})
    return model


@pytest.mark.parametrize("how", ["exclude", "include", "global"])
def test_selected_layer_is_left_as_it_was(how, rng):
    """``exclude=`` (and the global ``--exclude``) keep the selected layer as it was; ``include=``
    factorises only what it selects; the others factorise (rank 2, exact)."""
    model = two_low_rank_layers(rng)
    feed = CalibrationFeed(input_specs(model), None)
    spec, exclude = {"exclude": ("svd(rank=2,measure=false,exclude=head)", None),
                     "include": ("svd(rank=2,measure=false,include=op:Conv)", None),
                     "global": ("svd(rank=2,measure=false)", "re:^head$")}[how]
    out, report = run_pipeline(model, parse_pass_list(spec), feed, exclude=exclude)
    entry = report.passes[0]
    assert entry.rewrites == {"conv → 2 × conv": 1}
    if how != "include":
        assert entry.skipped["excluded (--exclude)" if how == "global" else "excluded (exclude=)"] == 1
    assert model.graph.initializer[1].name == "mw" and [n.op_type for n in model.graph.node if n.name == "head"] == ["MatMul"]
    assert_left_float(model, out, "head", ["f", "mw"], "mw", gone="cw")


def test_selector_errors(rng):
    model = two_low_rank_layers(rng)
    with pytest.raises(UserError, match=r"svd\(include=\.\.\.\): 'op:Gem' matches no node; closest op types: "):
        run_svd(model, "svd(include=op:Gem)")
    with pytest.raises(UserError, match=r"svd\(exclude=\.\.\.\): 'haed' matches no node; closest: head"):
        run_svd(model, "svd(exclude=haed)")
    with pytest.raises(UserError, match=r"has no option 'ops'.*renamed: use include=op:MatMul;op:Gemm;op:Conv"):
        run_svd(model, "svd(ops=matmul)")
    _, entry = run_svd(model, "svd(rank=2,measure=false)")  # the default include needs no Gemm in the model
    assert entry.rewrites == {"conv → 2 × conv": 1, "matmul → 2 × matmul": 1}


def test_skip_reasons_are_counted(rng):
    w = rng.standard_normal
    model = model_with([
        helper.make_node("Conv", ["x", "dw"], ["a"], group=4),
        helper.make_node("Flatten", ["a"], ["f"]),
        helper.make_node("MatMul", ["f", "s"], ["m1"]),
        helper.make_node("MatMul", ["m1", "s2"], ["m2"]),
        helper.make_node("MatMul", ["m2", "s2"], ["m3"]),
        helper.make_node("Gemm", ["m3", "g"], ["m4"], transA=1),
        helper.make_node("MatMul", ["m4", "bw"], ["y"]),
    ], [("x", [1, 4, 4, 4])], {"dw": w((4, 1, 3, 3)), "s": w((16, 8)), "s2": w((8, 8)), "g": w((1, 8)),
                              "bw": w((2, 1, 8, 8))})
    _, entry = run_svd(model, "svd(measure=false)")
    assert entry.skipped["grouped conv"] == 1
    assert entry.skipped["shared weight"] == 2
    assert entry.skipped["Gemm with transA"] == 1
    assert entry.skipped["weight is not 2-D or 3-D"] == 1


def test_speed_decision():
    assert decide("matmul", (1, 64), (64, 64), 1, 64, 64, 40, measure=False) == (False, "saves < 5% of the FLOPs")
    assert decide("matmul", (4096, 512), (512, 512), 4096, 512, 512, 16) == (True, "FLOPs")
    ratio = measured_ratio("matmul", (8, 128), (128, 128), 8)
    assert 0 < ratio < 10


@pytest.mark.realmodel
def test_rec_matmuls_full_rank_is_lossless():
    _, _, entry = run_zoo("ppocrv4_rec", "svd(force=true,rank=-1,include=op:MatMul)", {"x": [1, 3, 48, 80]}, 2)
    assert entry.rewrites == {"matmul → 2 × matmul": 9} and not entry.rolled_back
    assert entry.verification["status"] == "ok"


@pytest.mark.realmodel
def test_onet_output_target_is_held():
    from onnxslim_kit.model import load_proto
    from onnxslim_kit.zoo import fetch

    original = load_proto(fetch("mtcnn_onet"))
    specs = input_specs(original)
    calib = CalibrationFeed(specs, None, input_shapes={specs[0].name: [4, 48, 48, 3]}, num_samples=8).take(8)
    entries = {}
    for target in ("0", "0.99"):
        _, report = run_pipeline(original, parse_pass_list(f"svd(measure=false,target={target})"),
                                 CalibrationFeed(specs, calib))
        entries[target] = report.passes[0]
    free, held = entries["0"], entries["0.99"]
    assert free.rewrites and free.metrics["flops_after"] < free.metrics["flops_before"]
    assert sum(held.rewrites.values()) <= sum(free.rewrites.values())
    if held.rewrites:  # the verifier's samples are among the target's samples
        assert min(o["cosine"] for o in held.verification["outputs"].values()) >= 0.99


@pytest.mark.parametrize("name", ["conv3x3-dilated", "conv-same-upper"])
def test_separable_full_rank_reproduces_outputs(name, rng):
    model = variants(rng)[name]
    calib = CalibrationFeed(input_specs(model), None, num_samples=4, seed=3).take(4)
    out, entry = run_svd(model, "svd(force=true,rank=-1,spatial=separable)", calib)
    assert entry.rewrites == {"conv (k×1, 1×k) → 2 × conv": 1} and entry.verification["status"] == "ok"
    kernels = [tuple(numpy_helper.to_array(t).shape[2:]) for t in out.graph.initializer if t.dims and len(t.dims) == 4]
    assert sorted(kernels) == sorted([(variants(rng)[name].graph.initializer[0].dims[2], 1),
                                      (1, variants(rng)[name].graph.initializer[0].dims[3])])
    onnx.checker.check_model(out, full_check=True)
    for sample in calib:
        assert compare(run_ort(model, sample)[0], run_ort(out, sample)[0]).max_rel <= 1e-5


def test_auto_finds_a_separable_kernel(rng):
    """``W[o,c,y,x] = Σ_{j<2} U[(c,y),j] V[j,(o,x)]``: rank 2 as k×1·1×k, rank 2·k as k×k·1×1."""
    n, c, k, size = 32, 16, 5, 24
    w = (rng.standard_normal((c * k, 2)) @ rng.standard_normal((2, n * k))).reshape(c, k, n, k).transpose(2, 0, 1, 3)
    model = model_with([helper.make_node("Conv", ["x", "w"], ["y"], pads=[2, 2, 2, 2])], [("x", [1, c, size, size])],
                       {"w": w})
    _, entry = run_svd(model, "svd(measure=false)")
    assert entry.rewrites == {"conv (k×1, 1×k) → 2 × conv": 1}
    assert entry.verification["outputs"]["y"]["cosine"] >= 0.999
    rows = size * size
    assert entry.metrics["flops_before"] == 2 * rows * n * c * k * k
    assert entry.metrics["flops_after"] == 2 * (rows * 2 * c * k + rows * n * 2 * k)  # W_in = W_out here
    assert entry.metrics["params_after"] == 2 * (c * k + n * k)
    _, kxk = run_svd(model, "svd(measure=false,spatial=kxk)")
    assert kxk.metrics["flops_after"] == 2 * rows * 2 * k * (c * k * k + n)  # r = 2k filters of k×k, then 1×1
    assert kxk.metrics["flops_after"] > 2 * entry.metrics["flops_after"]


def test_batched_weight_is_factorised_per_head(rng):
    """``[heads, k, n]`` weight, head ``i`` of rank ``i + 1``: common rank 3 (the largest)."""
    heads, k, n, rows = 3, 48, 40, 16
    w = np.stack([rng.standard_normal((k, i + 1)) @ rng.standard_normal((i + 1, n)) for i in range(heads)])
    model = model_with([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [2, heads, rows, k])], {"w": w})
    out, entry = run_svd(model, "svd(measure=false)")
    assert entry.rewrites == {"batched → 2 × matmul": 1}
    shapes = sorted(numpy_helper.to_array(t).shape for t in out.graph.initializer)
    assert shapes == [(heads, 3, n), (heads, k, 3)]
    assert entry.metrics["flops_before"] == 2 * 2 * heads * rows * k * n
    assert entry.metrics["flops_after"] == 2 * 2 * heads * rows * 3 * (k + n)
    assert entry.metrics["params_after"] == heads * 3 * (k + n)
    assert entry.verification["outputs"]["y"]["max_rel"] < 1e-4


def test_batched_full_rank_is_lossless(rng):
    model = model_with([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [5, 12])],
                       {"w": rng.standard_normal((4, 12, 7))})
    calib = CalibrationFeed(input_specs(model), None, num_samples=2).take(2)
    out, entry = run_svd(model, "svd(force=true,rank=-1)", calib)
    assert entry.lossless and entry.verification["status"] == "ok" and sum(entry.rewrites.values()) == 1
    for sample in calib:
        assert compare(run_ort(model, sample)[0], run_ort(out, sample)[0]).max_rel <= 1e-5


def two_layer_model(rng, noise=0.01):
    """``y = x W1 + x W2``: W1 nearly rank 4 (cheap to factorise), W2 full rank (costly)."""
    w = rng.standard_normal
    cheap = w((64, 4)) @ w((4, 64)) + noise * w((64, 64))
    return model_with([helper.make_node("MatMul", ["x", "cheap"], ["a"]), helper.make_node("MatMul", ["x", "full"], ["b"]),
                       helper.make_node("Add", ["a", "b"], ["y"])],
                      [("x", [16, 64])], {"cheap": cheap, "full": 3 * w((64, 64))})


@pytest.mark.parametrize("alloc,rule", [("auto", "spectrum sensitivity"), ("sensitivity", "measured sensitivity")])
def test_sensitivity_allocation_factorises_the_cheap_layer(alloc, rule, rng):
    model = two_layer_model(rng)
    calib = CalibrationFeed(input_specs(model), None, num_samples=24).take(24)
    out, entry = run_svd(model, f"svd(measure=false,alloc={alloc})", calib)  # ≥ 16 samples: auto → spectrum
    assert any(rule in note for note in entry.notes)
    assert entry.rewrites == {"matmul → 2 × matmul": 1}
    names = {t.name for t in out.graph.initializer}
    assert "full" in names and "cheap" not in names
    assert entry.metrics["target_cosine_measured"] >= 0.99
    assert entry.verification["outputs"]["y"]["cosine"] >= 0.98
    assert 0 < entry.metrics["flops_removed"] < 0.5


@pytest.mark.parametrize("alloc", ["spectrum", "sensitivity"])
def test_sensitivity_allocation_spends_a_looser_budget(alloc, rng):
    model = two_layer_model(rng, noise=0.3)
    calib = CalibrationFeed(input_specs(model), None, num_samples=24).take(24)
    _, strict = run_svd(model, f"svd(measure=false,target=0.9999,alloc={alloc})", calib)
    _, loose = run_svd(model, f"svd(measure=false,target=0.9,alloc={alloc})", calib)
    assert strict.metrics["flops_removed"] < loose.metrics["flops_removed"]
    assert loose.metrics["target_cosine_measured"] >= 0.9
    assert strict.metrics.get("target_cosine_measured", 1.0) >= 0.9999


def test_allocations_order_by_saving():
    from onnxslim_kit.passes.svd.alloc import Candidate, allocations

    cheap = Candidate(None, None, (), 100, [(8, 50, 1e-4), (4, 75, 1e-3)])
    costly = Candidate(None, None, (), 100, [(8, 50, 1e-1)])
    picks = allocations([cheap, costly])
    savings = [sum(s for c in (cheap, costly) for r, s, _l in c.options if p.get(id(c)) == r) for p in picks]
    assert savings == sorted(savings) and len(picks) == 3
    assert picks[0] == {id(cheap): 8} and picks[1] == {id(cheap): 4}
    assert picks[-1] == {id(cheap): 4, id(costly): 8}


def test_shrinkage_matches_ledoit_wolf_on_a_known_covariance(rng):
    """The weight from the closed-form sums equals the Ledoit–Wolf formula computed term by term,
    and shrinks more when the samples see the covariance less well."""
    cov = np.diag(np.linspace(0.5, 4.0, 12))
    x = rng.multivariate_normal(np.zeros(12), cov, size=40)
    s = x.T @ x / len(x)
    mu = np.trace(s) / 12
    d2 = np.sum((s - mu * np.eye(12)) ** 2)
    b2 = sum(np.sum((np.outer(r, r) - s) ** 2) for r in x) / len(x) ** 2
    expected = min(b2, d2) / d2
    got = shrinkage(s, len(x), float(np.sum(np.sum(x**2, 1) ** 2)), damping=0.0)
    assert abs(got - expected) < 1e-12 and 0.05 < got < 0.95
    many = rng.multivariate_normal(np.zeros(12), cov, size=4000)
    s_many = many.T @ many / len(many)
    assert shrinkage(s_many, len(many), float(np.sum(np.sum(many**2, 1) ** 2)), damping=0.0) < got / 10
    # the shrunk estimate is closer to the true covariance than the sample one (40 rows, 12 dims)
    shrunk = (1 - got) * s + got * mu * np.eye(12)
    assert np.linalg.norm(shrunk - cov) < np.linalg.norm(s - cov)


def test_padding_rows_are_left_out_of_the_statistics(rng):
    from onnxslim_kit.passes._common.layer_stats import collect, match_layer

    import onnx_graphsurgeon as gs

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1, 6, 4] x, int64[1, 6] m) => (float[1, 6, 3] y, int64[1, 6] mo) {
            y = MatMul(x, w)
            mo = Identity(m)
        }""")
    model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"))
    graph = gs.import_onnx(model)
    found = match_layer(graph.nodes[0], graph, graph)
    assert found.ok
    layer = found.value
    x = rng.standard_normal((1, 6, 4)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 0, 0]], np.int64)
    x[0, 4:] = 50.0  # padding rows: large, must not count
    sample = {"x": x, "m": mask}
    masked = collect(model, [layer], [sample], want_gram=True, mask="m")[layer.key]
    plain = collect(model, [layer], [sample], want_gram=True)[layer.key]
    real = x[0, :4].astype(np.float64)
    assert masked.gram_rows == 4 and plain.gram_rows == 6
    assert masked.rows_per_sample == 6  # FLOPs still count every row
    np.testing.assert_allclose(masked.normalized_gram, real.T @ real / 4, rtol=1e-6)
    assert not np.allclose(plain.normalized_gram, masked.normalized_gram)
    # the option reaches the statistics: rank-1 factors fitted without the padding rows differ
    samples = [{"x": np.concatenate([rng.standard_normal((1, 4, 4)), np.full((1, 2, 4), 50.0)], 1).astype(np.float32),
                "m": mask} for _ in range(8)]  # the pipeline holds 2 out: the factors are fitted on 6
    outs = [run_svd(model, f"svd(rank=1,force=true,data=true,target=0{opt})", samples)[0] for opt in ("", ",mask=m")]
    real = [{"x": rng.standard_normal((1, 6, 4)).astype(np.float32), "m": np.ones((1, 6), np.int64)} for _ in range(8)]
    errors = [np.mean([np.sum((run_ort(o, r)[0] - run_ort(model, r)[0]) ** 2) for r in real]) for o in outs]
    assert errors[1] < 0.8 * errors[0]


def test_statistics_of_samples_of_their_own_length_keep_the_largest_shape(rng):
    from onnxslim_kit.passes._common.layer_stats import collect, match_layer

    import onnx_graphsurgeon as gs

    model = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1, N, 4] x) => (float[1, N, 3] y) { y = MatMul(x, w) }""")
    model.graph.initializer.append(numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w"))
    graph = gs.import_onnx(model)
    found = match_layer(graph.nodes[0], graph, graph)
    assert found.ok
    layer = found.value
    samples = [{"x": rng.standard_normal((1, n, 4)).astype(np.float32)} for n in (5, 9, 3)]
    entry = collect(model, [layer], samples, want_gram=True)[layer.key]
    assert entry.rows_per_sample == 9 and entry.shape == (1, 9, 4) and entry.gram_rows == 17
    rows = np.concatenate([s["x"][0] for s in samples]).astype(np.float64)
    np.testing.assert_allclose(entry.normalized_gram, rows.T @ rows / 17, rtol=1e-6)


def test_crossfit_error_matches_the_other_halfs_output_error(rng):
    from onnxslim_kit.passes.svd.alloc import Candidate, crossfit_error

    mix = rng.standard_normal((16, 16)) * np.linspace(0.2, 2, 16)
    x = [rng.standard_normal((300, 16)) @ mix for _ in range(2)]
    w = rng.standard_normal((16, 10))
    grams = tuple(h.T @ h / len(h) for h in x)
    halves = tuple(Factorization(w, g, len(h), float(np.sum(np.sum(h**2, 1) ** 2))) for g, h in zip(grams, x))

    class Layer:
        matrix = w

    err = crossfit_error(Candidate(Layer, None, halves, 1, half_grams=grams))
    for r in (2, 5, 9):
        direct = [1 - cosine(other @ w, other @ np.matmul(*f.factors(r))) ** 2 for f, other in zip(halves, x[::-1])]
        assert abs(err[r - 1] - np.mean(direct)) < 1e-9
    assert err[-1] < 1e-12 and np.all(np.diff(err) <= 1e-12)


def test_spectrum_predicts_the_measured_loss_of_one_layer(rng):
    """One MatMul: the end-to-end loss is the layer's own, 1 − cos ≈ ε/2, so the estimate made from
    one measured rank predicts the others (the transfer factor is ≈ ½)."""
    from onnxslim_kit.passes.svd.alloc import Candidate, Probe, crossfit_error, spectral, weight_value
    from onnxslim_kit.passes._common.layer_stats import collect, match_layer

    import onnx_graphsurgeon as gs

    mix = rng.standard_normal((32, 32)) * np.geomspace(0.05, 2, 32)
    w = rng.standard_normal((32, 32))
    model = model_with([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", [64, 32])], {"w": w})
    samples = [{"x": (rng.standard_normal((64, 32)) @ mix).astype(np.float32)} for _ in range(40)]
    graph = gs.import_onnx(model)
    found = match_layer(graph.nodes[0], graph, graph)
    assert found.ok
    layer = found.value
    stats = collect(model, [layer], samples, want_gram=True)[layer.key]
    halves = [stats.half(i) for i in (0, 1)]
    cand = Candidate(layer, Factorization(layer.matrix, stats.normalized_gram, stats.gram_rows, stats.fourth),
                     tuple(Factorization(layer.matrix, *h) for h in halves), 64 * 32 * 32,
                     half_grams=tuple(h[0] for h in halves))
    probe = Probe(model, samples)
    ranks = [4, 8, 12, 16]
    spectral(probe, cand, ranks, lambda r: 64 * r * 64, list(range(16)))
    assert 0.3 < cand.scale < 0.7
    measured = probe.layer_losses(layer, [(weight_value(layer, np.matmul(*cand.full.factors(r))), list(range(16, 40)))
                                          for r in ranks])
    for (_r, _saved, predicted), got in zip(cand.options, measured):
        assert predicted == pytest.approx(got, rel=0.35)
    assert crossfit_error(cand)[3] > crossfit_error(cand)[15]
