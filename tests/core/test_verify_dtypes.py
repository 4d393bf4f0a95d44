"""The lossless tolerance knows the output's dtype (issue 15 item 6).

A lossless rewrite that reorders float arithmetic (a folded Mul into a Gemm's weight, a
MatMul + Add made one Gemm) moves a float16 output by about one float16 step (2⁻¹⁰ ≈ 9.8e-4
relative), ten times the default rtol 1e-4: ``fuse`` was rolled back on float16 models. The
tolerance is ``max(rtol, ULPS · eps(dtype))`` relative (see :mod:`onnxslim_kit.verify`).
"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxslim_kit
from onnxslim_kit.metrics import Drift, LOSSLESS_ULPS, dtype_rtol, within_tolerance
from onnxslim_kit.pipeline import Pass, PassResult, register_pass

AFFINE = """
<ir_version: 8, opset_import: ["" : 17]>
g (float16[16,32] x) => (float16[16,32] y) {
  m = MatMul (x, w)
  a = Add (m, b)
  y = Mul (a, k)
}
"""


def affine(dtype) -> onnx.ModelProto:
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = onnx.parser.parse_model(AFFINE.replace("float16", onnx.helper.tensor_dtype_to_string(elem)[len("TensorProto."):].lower()))
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([
        numpy_helper.from_array(rng.standard_normal((32, 32)).astype(dtype), "w"),
        numpy_helper.from_array(rng.standard_normal(32).astype(dtype), "b"),
        numpy_helper.from_array((rng.random(32) * 3 + 0.3).astype(dtype), "k"),
    ])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_dtype_rtol():
    assert dtype_rtol(1e-4, np.float32) == 1e-4  # 4·2⁻²³ ≈ 4.8e-7 is below the default
    assert dtype_rtol(1e-4, np.float64) == 1e-4
    assert dtype_rtol(1e-4, np.float16) == pytest.approx(LOSSLESS_ULPS * 2.0**-10)
    assert dtype_rtol(1e-2, np.float16) == 1e-2  # a looser user rtol wins
    assert dtype_rtol(1e-4, np.int64) == 1e-4


def test_within_tolerance_uses_the_dtype():
    drift = Drift(max_abs=7.4e-4, max_rel=7.4e-4, cosine=1.0)  # one float16 step at scale 1
    assert not within_tolerance(drift, 1e-4)
    assert within_tolerance(drift, 1e-4, dtype=np.float16)
    assert not within_tolerance(drift, 1e-4, dtype=np.float32)
    big = Drift(max_abs=2e-2, max_rel=2e-2, cosine=1.0)  # 20 float16 steps: a real change
    assert not within_tolerance(big, 1e-4, dtype=np.float16)


def test_fuse_on_float16_is_kept():
    model = affine(np.float16)
    out, report = onnxslim_kit.optimize(model, "fuse")
    entry = report.passes[0]
    assert entry.rewrites.get("affine→gemm") == 1
    assert not entry.rolled_back, entry.verification
    assert entry.verification["status"] == "ok"
    assert 1e-4 < entry.verification["outputs"]["y"]["max_rel"] < LOSSLESS_ULPS * 2.0**-10  # the float16 step itself
    assert [n.op_type for n in out.graph.node] == ["Gemm"]


def test_float32_tolerance_is_unchanged():
    out, report = onnxslim_kit.optimize(affine(np.float32), "fuse")
    entry = report.passes[0]
    assert not entry.rolled_back
    assert entry.verification["outputs"]["y"]["max_rel"] < 1e-6


@register_pass
class _ScaleBias16(Pass):
    """Test pass: claims to be lossless but scales every constant by 1.02 (20 float16 steps)."""

    name = "test_scale16"
    lossless = True

    def run(self, model, ctx):
        import onnx_graphsurgeon as gs

        result = PassResult()
        for tensor in model.graph.tensors().values():
            if isinstance(tensor, gs.Constant) and tensor.name == "b":
                tensor.values = (np.asarray(tensor.values, np.float32) + 0.05).astype(np.float16)
                result.rewrite("bias moved")
        return result


def test_a_real_change_in_float16_is_still_rolled_back():
    _, report = onnxslim_kit.optimize(affine(np.float16), "test_scale16")
    entry = report.passes[0]
    assert entry.rolled_back and entry.verification["status"] == "failed"
    assert entry.verification["outputs"]["y"]["max_rel"] > LOSSLESS_ULPS * 2.0**-10


def _cast_model(c: float):
    import onnx
    from onnx import numpy_helper

    model = onnx.parser.parse_model('''<ir_version: 8, opset_import: ["" : 13]>
    g (float[4, 8] x) => (float[4, 8] y) {
      h = Cast <to = 10> (x)
      m = Mul (h, c)
      y = Cast <to = 1> (m)
    }''')
    model.graph.initializer.append(numpy_helper.from_array(np.array([c], np.float16), "c"))
    return model


def test_a_float32_output_computed_in_float16_gets_float16s_bound():
    # found by the fuzzer: Cast → Conv → BN → Cast was rolled back for float16 rounding
    from onnxslim_kit.verify import Verifier, lowest_float_dtype

    c = np.float16(0.3)
    one_step = float(np.nextafter(c, np.float16(1)))
    samples = [{"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}]
    verifier = Verifier(_cast_model(float(c)), samples)
    assert lowest_float_dtype(_cast_model(0.3)) == np.float16
    assert verifier.check(_cast_model(one_step), lossless=True).status == "ok"
    assert verifier.check(_cast_model(0.33), lossless=True).status == "failed"  # 10 % still caught
