"""Property-based fuzzing of the lossless passes (issue 15): random valid graphs
(:mod:`fuzz_graphs`) through ``fuse``, ``fuse,compact`` and ``prune(target=none)`` (its lossless strip). With
verification off the result must pass the full checker and match the original under ONNX
Runtime within the lossless rule; with verification on no pass may be rolled back. A failure
is shrunk by hypothesis and printed as ONNX text.

About 200 graphs, derandomized (the same graphs every run); the full sweep of ≥ 5,000 is
``benchmarks/fuzz_lossless.py``.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from fuzz_graphs import FAMILIES, KNOWN, PASS_LISTS, check_lossless, check_valid, describe, graphs, lossless
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = 200
# known-failing families left out of the CI run while their fix is under way (see KNOWN)
TOLERATED: set = set()  # none at present: the derandomized 200 pass with "fp16-rollback" counted as a failure
COVER_OPS = {"Conv", "BatchNormalization", "Gemm", "MatMul", "Add", "Mul", "Sub", "Div", "Relu", "Clip",
             "PRelu", "LeakyRelu", "HardSigmoid", "Transpose", "Reshape", "Cast", "Pad", "Slice",
             "Concat", "Squeeze", "Unsqueeze", "Shape", "Gather", "Constant"}


def test_lossless_passes_keep_random_graphs_equivalent():
    seen_ops, seen_passes, tolerated = collections.Counter(), collections.Counter(), collections.Counter()

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(graphs(), st.sampled_from(PASS_LISTS))
    def prop(model, passes):
        seen_ops.update(n.op_type for n in model.graph.node)
        seen_passes[passes] += 1
        findings = check_lossless(model, passes)
        tolerated.update(kind for kind, _ in findings if kind in TOLERATED)
        failures = [f for f in findings if f[0] not in TOLERATED]
        assert not failures, describe(model, passes, failures)

    prop()
    assert sum(seen_passes.values()) >= EXAMPLES
    assert set(seen_passes) == set(PASS_LISTS)
    assert COVER_OPS <= set(seen_ops), f"never generated: {sorted(COVER_OPS - set(seen_ops))}"
    assert set(tolerated) <= set(KNOWN)


@given(graphs(max_ops=4))
@settings(max_examples=30, derandomize=True, database=None, deadline=None)
def test_generated_graphs_are_valid(model):
    outputs = check_valid(model)  # full checker + ORT; raises otherwise
    declared = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in model.graph.output]
    assert [[list(o.shape) for o in sample] for sample in outputs] == [declared] * len(outputs)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_is_built(family):
    built = []

    @given(graphs(max_ops=3, families=(family,)))
    @settings(max_examples=12, derandomize=True, database=None, deadline=None)
    def prop(model):
        check_valid(model)
        built.append(len(model.graph.node) > 1 or model.graph.node[0].op_type != "Identity")

    prop()
    assert sum(built) >= 3, f"{family}: built in {sum(built)} of {len(built)} graphs"


def test_lossless_rule_has_a_real_tolerance():
    ref = np.linspace(-2, 2, 12, dtype=np.float32)
    assert lossless(ref, ref + np.float32(1e-4) * 2) is None  # 2e-4 ≤ 1e-6 + 1e-4 · 2
    assert "max abs error" in lossless(ref, ref + np.float32(5e-4))
    half = ref.astype(np.float16)
    assert lossless(half, half, half=True) is None
    assert "max abs error" in lossless(half, (ref + 0.02).astype(np.float16), half=True)
    assert "non-finite" in lossless(ref, np.where(ref > 1, np.inf, ref).astype(np.float32))


def test_a_wrong_result_is_a_finding(monkeypatch):
    """The property can fail: a 'fuse' that scales every constant is reported with the graph."""
    import onnxslim_kit

    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1,3] x) => (float[1,3] y) <float[3] b = {1.0, 2.0, 3.0}> { y = Add (x, b) }
    """
    model = onnx.parser.parse_model(text)
    real = onnxslim_kit.optimize

    def wrong(proto, passes, **kw):
        result, report = real(proto, passes, **kw)
        out = onnx.ModelProto()
        out.CopyFrom(result)
        for t in out.graph.initializer:
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t) * 1.01, t.name))
        return out, report

    monkeypatch.setattr(onnxslim_kit, "optimize", wrong)
    findings = check_lossless(model, "fuse")
    assert {k for k, _ in findings} == {"mismatch"}  # one per sample
    assert "y = Add (x, b)" in describe(model, "fuse", findings)
