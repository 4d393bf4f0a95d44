"""Sessions that verify or calibrate keep no pre-packed weight copies (issue 16).

ONNX Runtime packs every constant MatMul weight into a copy of its own at session load
(anonymous memory, held for the session's life). With ``prepack=False`` the session reads the
weight where it lies. Measured here on one 64 MB MatMul weight: the growth of the process's
anonymous resident memory (``RssAnon``) while a session is open, by the sessions the passes
use to calibrate, against a session with pre-packing on (what bench times).
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from onnxslim_kit.runtime import NO_PREPACK, give_back, make_session, run, session_options

N = 4096  # W: N×N float32 = 64 MB
WEIGHT_BYTES = N * N * 4

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

MATMUL = f"""
<ir_version: 8, opset_import: ["" : 17]>
g (float[1,{N}] x) => (float[1,{N}] y) {{
  y = MatMul (x, w)
}}
"""


def _anon() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no RssAnon in /proc/self/status")


@pytest.fixture(scope="module")
def proto():
    model = onnx.parser.parse_model(MATMUL)
    w = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    return model


SAMPLE = {"x": np.ones((1, N), np.float32)}


def _held(open_session) -> int:
    """Anonymous bytes the process gains while ``open_session()``'s session is open and has run
    once (``open_session`` returns a handle that keeps the session alive)."""
    gc.collect()
    give_back()
    before = _anon()
    handle = open_session()
    held = _anon() - before
    del handle
    gc.collect()
    give_back()
    return held


def _session(proto, prepack):
    session = make_session(proto, threads=1, prepack=prepack)
    run(session, SAMPLE)
    return session


def _iter_activations(proto):
    from onnxslim_kit.activations import iter_activations

    it = iter_activations(proto, ["y"], [SAMPLE, SAMPLE])
    next(it)
    return it


def _int8_calibration(model):
    from onnxslim_kit.passes.int8.fallback import activations

    it = activations(model, ["y"], [SAMPLE, SAMPLE])
    next(it)
    return it


def _loaded(proto):
    """``proto`` as a Model whose weight is an array already (as a pass reads it)."""
    import onnx_graphsurgeon as gs

    from onnxslim_kit.model import Model

    model = Model.from_proto(proto)
    for tensor in model.graph.tensors().values():
        if isinstance(tensor, gs.Constant):
            tensor.values = np.array(tensor.values)
    return model


def test_options_carry_the_setting():
    assert session_options(prepack=False).get_session_config_entry(NO_PREPACK) == "1"
    with pytest.raises(RuntimeError):  # default: ORT's own (pre-packing on), the key unset
        session_options().get_session_config_entry(NO_PREPACK)


def test_prepacking_holds_a_copy_of_the_weight(proto):
    """The measurement the tests below rely on: on, ORT holds ≈ the weight again; off, nothing."""
    assert _held(lambda: _session(proto, True)) > 0.75 * WEIGHT_BYTES
    assert _held(lambda: _session(proto, False)) < 0.25 * WEIGHT_BYTES


def test_activations_session_does_not_prepack(proto):
    """:func:`onnxslim_kit.activations.iter_activations`: data-driven passes' calibration."""
    assert _held(lambda: _iter_activations(proto)) < 0.25 * WEIGHT_BYTES


def test_int8_calibration_session_does_not_prepack(proto):
    """int8's calibration session reads the model's own arrays in place (no copy) and packs none."""
    model = _loaded(proto)
    assert _held(lambda: _int8_calibration(model)) < 0.25 * WEIGHT_BYTES
