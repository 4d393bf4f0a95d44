"""The ``dynamic`` pass: MatMul / Gemm → DynamicQuantizeLinear + MatMulInteger, fused by ORT into
DynamicQuantizeMatMul; Conv only on request (ConvInteger)."""

from __future__ import annotations

import numpy as np
from conftest import run_ort
from test_int8 import build, ops, optimized_ops, w

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.metrics import cosine
from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

RNG = np.random.default_rng(3)


def dynamic(model, options: str = ""):
    feed = CalibrationFeed(input_specs(model), None, num_samples=2)
    out, report = run_pipeline(model, parse_pass_list(f"dynamic({options})" if options else "dynamic"), feed)
    return out, report.passes[-1]


def mlp():
    return build(
        "h = MatMul (x, w1)\nr = Relu (h)\ng = Gemm <transB = 1, alpha = 0.5> (r, w2, b2)\ny = Gemm (g, w3, b3)",
        "float[4, 64] x",
        {"w1": w(64, 64), "w2": w(48, 64), "b2": w(48), "w3": w(48, 32), "b3": w(32)},
    )


def test_matmul_gemm_become_integer_and_fuse(tmp_path):
    model = mlp()
    out, rep = dynamic(model)
    assert rep.rewrites["MatMul→MatMulInteger"] == 1 and rep.rewrites["Gemm→MatMulInteger"] == 2
    assert ops(out)["MatMulInteger"] == 3 and ops(out)["DynamicQuantizeLinear"] == 3
    assert ops(out)["MatMul"] == ops(out)["Gemm"] == 0
    assert optimized_ops(out, tmp_path)["DynamicQuantizeMatMul"] == 3
    x = {"x": RNG.standard_normal((4, 64)).astype(np.float32)}
    ref, got = run_ort(model, x)[0], run_ort(out, x)[0]
    assert cosine(ref, got) > 0.999
    assert np.abs(ref - got).max() < 0.05 * np.abs(ref).max()


def test_small_weights_and_conv_are_left_float():
    model = build("c = Conv (x, wc, bc)\nf = Flatten (c)\ny = MatMul (f, w1)", "float[1, 3, 4, 4] x",
                  {"wc": w(4, 3, 3, 3), "bc": w(4), "w1": w(16, 8)})
    out, rep = dynamic(model)
    assert rep.skipped["Conv left float (conv=false; ConvInteger is slow on CPU)"] == 1
    assert rep.skipped["MatMul: weight below min_weights"] == 1 and not rep.modified
    out, rep = dynamic(model, "conv=true,min_weights=0")
    assert rep.rewrites["Conv→ConvInteger"] == 1 and ops(out)["ConvInteger"] == 1
    assert any("ConvInteger runs slowly" in note for note in rep.notes)
    x = {"x": RNG.standard_normal((1, 3, 4, 4)).astype(np.float32)}
    assert cosine(run_ort(model, x)[0], run_ort(out, x)[0]) > 0.999


def test_already_quantized_is_untouched():
    out, _ = dynamic(mlp())
    again, rep = dynamic(out)
    assert not rep.modified and rep.skipped["already quantized (has Q/DQ or integer ops)"] == 1
    assert ops(again) == ops(out)
