"""An unnamed projection that reads as a classifier's raw logits is judged by its decisions.

A torchvision-style classifier exported without its Softmax ends in ``Gemm`` → ``[N, C]``,
named ``output`` or a number: no name says logits, and its cosine alone let decisions flip.
"""

import numpy as np
import onnx
import pytest

from onnxslim_kit.fidelity import Fidelity
from onnxslim_kit.fidelity.margins import reads_as_logits
from onnxslim_kit.fidelity.views import find_views

HEAD = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 6] x) => (float[1, 5] out) {
    w = Constant <value = float[5, 6] {1,0,0,0,0,0, 0,1,0,0,0,0, 0,0,1,0,0,0, 0,0,0,1,0,0, 0,0,0,0,1,1}> ()
    b = Constant <value = float[5] {0, 0, 0, 0, 0}> ()
    out = Gemm <transB = 1> (x, w, b)
}
"""


def _rows(seed: int, n: int, scale: float) -> list:
    """``n`` one-row outputs: a clear winner ``scale`` above four others near 0."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        row = rng.normal(0.0, 0.3, 5)
        row[i % 5] += scale
        rows.append(row[None].astype(np.float32))
    return rows


def test_peaked_rows_read_as_logits_and_regressions_do_not():
    assert reads_as_logits(_rows(0, 32, 6.0))
    assert not reads_as_logits(_rows(0, 32, 0.05))  # box offsets, landmarks: near-uniform softmax
    features = np.random.default_rng(3).normal(0.0, 4.5, (32, 32))  # peaked softmax, no winner
    assert not reads_as_logits([row[None] for row in features])
    assert not reads_as_logits([np.zeros((1, 5, 3), np.float32)])  # rank 3: the CTC view's to judge
    assert not reads_as_logits([np.ones((1, 1), np.float32)])  # one class: no decision
    assert not reads_as_logits([])


def _fidelity(reference: list) -> Fidelity:
    model = onnx.parser.parse_model(HEAD)
    (view,) = find_views(model)
    assert view.kind == "values" and view.ctc  # the graph only says: a projection
    return Fidelity.build(model, "cos:0.99", [{}] * len(reference), reference=[{"out": r} for r in reference])


def test_a_flipped_decision_fails_the_target_where_the_cosine_holds():
    reference = _rows(1, 16, 6.0)
    close = reference[3].copy()
    winner = int(np.argmax(close))
    close[0, (winner + 1) % 5] = close[0, winner] - 0.05  # a near tie the candidate will flip
    reference[3] = close
    candidate = [r.copy() for r in reference]
    candidate[3][0, winner] -= 0.1
    fid = _fidelity(reference)
    verdict = fid.judge([{"out": c} for c in candidate])
    (score,) = verdict.scores
    assert score.kind == "probs" and score.cosine > 0.999
    assert score.observed == pytest.approx(15 / 16)
    assert not fid.met(verdict) and "out agreement" in verdict.binding


def test_a_regression_head_stays_judged_by_its_values():
    reference = _rows(2, 16, 0.05)
    candidate = [r + np.float32(0.001) for r in reference]
    verdict = _fidelity(reference).judge([{"out": c} for c in candidate])
    (score,) = verdict.scores
    assert score.kind == "values" and score.agreement is None
