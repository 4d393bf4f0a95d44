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
