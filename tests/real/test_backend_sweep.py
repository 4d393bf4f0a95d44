"""ONNX's backend test cases through the lossless passes: a deterministic subset of the sweep.

``benchmarks/backend_sweep.py`` runs every node test onnx generates and every data model the
wheel ships; this test runs the node tests of the ops ``fuse`` rewrites or folds around
(:data:`MODULES`) and a few data models (:data:`DATA`), each through ``fuse``, ``fuse,compact``
and ``prune`` (strip) with the test's own inputs as calibration, verification on, and checks
the written model against the test's expected outputs (``benchmarks/backend_cases.py`` has the
rules). A case ORT itself does not pass is skipped with ORT's reason; a refusal of the tool
(exit 2) is allowed here (the sweep counts them). What must not happen on a case ORT passes:
a crash (exit 1), a rollback of a lossless pass, a written mismatch, the caller's model
modified, a timeout. The cases that still do are listed in :data:`KNOWN` with their issue
item; they are ``xfail(strict=True)``, so the list has to change when a fix lands.

:data:`VALUE_CASES`: the 46 tests the sweep of 2026-12-02 refused because their inputs are
sequences / optionals (18) or hold NaN by design (28, run with ``allow_nan``): ``fuse`` and
``fuse,compact`` and ``prune(target=none)`` must now be ``ok`` on each, not refused; bare ``prune`` is lossy, so on NaN data it
refuses (one line) and elsewhere must show no bug.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.realmodel

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "backend_cases.py"
_spec = importlib.util.spec_from_file_location("backend_cases", _PATH)
bc = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("backend_cases", bc)
_spec.loader.exec_module(bc)

MODULES = (
    "gemm", "matmul", "conv", "convtranspose", "batch_normalization", "instance_normalization",
    "layernormalization", "add", "sub", "mul", "div", "relu", "leakyrelu", "prelu", "sigmoid",
    "hardswish", "identity", "reshape", "flatten", "transpose", "squeeze", "unsqueeze", "pad",
    "gather", "slice", "expand", "constant", "constantofshape", "globalaveragepool", "sqrt",
    "erf", "where",
)
DATA = ("light/light_squeezenet", "pytorch-operator/test_operator_add_broadcast",
        "simple/test_expand_shape_model1", "simple/test_single_relu_model")
TIMEOUT = 30.0

_CASES = {c.name: c for c in bc.node_cases(MODULES) + bc.data_cases(names=set(DATA))}

VALUE_MODULES = ("ai_onnx_ml.tree_ensemble", "cast", "castlike", "identity", "isinf", "isnan", "loop", "mod",
                 "sequence_map", "sequenceinsert")
VALUE_CASES = (
    "test_ai_onnx_ml_tree_ensemble_set_membership", "test_identity_sequence", "test_identity_opt", "test_isinf",
    "test_isinf_positive", "test_isinf_negative", "test_isinf_float16", "test_isnan", "test_isnan_float16",
    "test_loop13_seq", "test_loop16_seq_none", "test_sequence_insert_at_back", "test_sequence_insert_at_front",
    *(f"test_{op}_{a}_to_{b}{x}" for op in ("cast", "castlike") for a, b in (
        ("FLOAT", "FLOAT16"), ("FLOAT", "DOUBLE"), ("FLOAT16", "FLOAT"), ("FLOAT16", "DOUBLE"), ("DOUBLE", "FLOAT"),
        ("DOUBLE", "FLOAT16")) for x in (("",) if op == "cast" else ("", "_expanded"))),
    *(f"test_mod_float_edge_cases_fmod_0_{t}" for t in ("float16", "float32", "float64")),
    *(f"test_sequence_map_{m}{x}" for m in ("identity_1_sequence", "identity_2_sequences",
                                             "identity_1_sequence_1_tensor", "add_2_sequences",
                                             "add_1_sequence_1_tensor", "extract_shapes") for x in ("", "_expanded")),
)
_VALUE = {c.name: c for c in bc.node_cases(VALUE_MODULES) if c.name in VALUE_CASES}
# case -> why prune still fails on it; strict: a fix must update this (prune's concrete_shapes
# skips non-array values since 2026-12-02: none left)
VALUE_KNOWN: dict = {}

# case -> why it still fails; strict: a fix must update this
KNOWN: dict = {}  # fixed: the caller's ConstantOfShape value tensors (model._own_attribute_tensors)


def _params():
    for name in _CASES:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN[name])] if name in KNOWN else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_params()))
def test_backend_case(name):
    case = _CASES[name]
    why = bc.ort_reference(case)
    if why:
        pytest.skip(f"ORT does not pass the original: {bc.reason_kind(why)}")
    outcomes = [bc.run_case(case, passes, TIMEOUT) for passes in bc.PASS_LISTS]
    bugs = [f"{o.passes}: {o.status}: {o.reason}" for o in outcomes if o.status in bc.BUG_STATUSES]
    assert not bugs, "\n".join(bugs)


def test_subset_is_the_intended_one():
    """The subset did not shrink silently (an onnx upgrade renaming modules or data folders)."""
    assert {c.split("/")[0] + "/" + c.split("/")[1] for c in _CASES if "/" in c} == set(DATA)
    assert sum("/" not in c for c in _CASES) >= 200
    assert set(KNOWN) <= set(_CASES)


def _value_params():
    for name in VALUE_CASES:
        marks = [pytest.mark.xfail(strict=True, reason=VALUE_KNOWN[name])] if name in VALUE_KNOWN else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(_value_params()))
def test_value_input_case(name):
    case = _VALUE[name]
    why = bc.ort_reference(case)
    assert not why, why  # ORT passed every one of them in the sweep
    lossless = [bc.run_case(case, passes, TIMEOUT) for passes in ("fuse", "fuse,compact")]
    assert [o.status for o in lossless] == ["ok", "ok"], [f"{o.passes}: {o.status}: {o.reason}" for o in lossless]
    pruned = bc.run_case(case, "prune(target=none)", TIMEOUT)  # the strip: lossless, NaN data allowed
    assert pruned.status == "ok", pruned
    lossy = bc.run_case(case, "prune", TIMEOUT)  # bare prune is lossy: NaN data is refused, in one line
    if bc.holds_nan(case.feeds):
        assert lossy.status == "refused" and "for lossless passes only" in lossy.reason, lossy


def test_value_subset_is_complete():
    assert len(VALUE_CASES) == len(set(VALUE_CASES)) == 46 and set(_VALUE) == set(VALUE_CASES)
    assert sum(bc.holds_nan(_VALUE[n].feeds) for n in VALUE_CASES) == 28
    assert set(VALUE_KNOWN) <= set(VALUE_CASES)
