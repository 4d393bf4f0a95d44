"""The pipeline-level target: each lossy pass's share, the held-out split, the report and --strict."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import parse

import onnxslim_kit
from onnxslim_kit.api import Option, Pass, PassResult, check_target, pass_fidelity, register_pass
from onnxslim_kit.errors import UserError, VerificationError
from onnxslim_kit.fidelity.context import held_out

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,4] y) <float[4] b = {1.0, 2.0, 3.0, 4.0}> {
  y = Add (x, b)
}
"""

SEEN = []


@register_pass
class _Noise(Pass):
    """Test pass (lossy): adds ``amount`` to the bias; records what it was given."""

    name = "test_noise"
    lossless = False
    options = {"amount": Option(float, 0.0, "added to the bias"),
               "target": Option(str, "", "fidelity target", parse=check_target)}

    def run(self, model, ctx):
        fid = pass_fidelity(ctx)
        SEEN.append({"allowed": fid.allowed, "target": str(fid.target), "fit": [float(s["x"][0, 0]) for s in ctx.feed],
                     "judged": [float(s["x"][0, 0]) for s in fid.samples]})
        result = PassResult()
        for tensor in model.graph.tensors().values():
            if getattr(tensor, "values", None) is not None and tensor.name == "b":
                tensor.values = (tensor.values + ctx.options["amount"]).astype(np.float32)
                result.rewrite("noise")
        return result


def _calib(n: int) -> list:
    return [{"x": np.full((2, 4), float(i), np.float32)} for i in range(n)]


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()


def test_three_lossy_passes_share_the_budget():
    _, report = onnxslim_kit.optimize(parse(MODEL), "test_noise,test_noise,test_noise", calib=_calib(16))
    assert [round(s["allowed"], 6) for s in SEEN] == [pytest.approx(1 / 3), 0.5, 1.0]  # nothing spent: shares grow
    assert report.target == "cos:0.99" and report.views == ["y"]
    assert all(p.fidelity["met"] for p in report.passes if p.modified)


def test_the_passes_fit_three_samples_in_four_and_are_judged_on_the_fourth():
    _, report = onnxslim_kit.optimize(parse(MODEL), "test_noise(amount=0.001)", calib=_calib(16))
    seen = SEEN[0]
    assert seen["judged"] == [float(i) for i in range(16) if held_out(i)] and len(seen["judged"]) == 4
    assert seen["fit"] == [float(i) for i in range(16) if not held_out(i)]
    assert "held-out calibration samples" in report.verified_on
    assert report.passes[0].fidelity["samples"] == 4 and "only 4 held-out" in " ".join(report.load_notes)


def test_a_pass_given_its_own_target_holds_all_of_it():
    onnxslim_kit.optimize(parse(MODEL), "test_noise(target=top1:0.9),test_noise", calib=_calib(8))
    assert SEEN[0]["target"] == "top1:0.9" and SEEN[0]["allowed"] == 1.0
    assert SEEN[1]["target"] == "cos:0.99" and SEEN[1]["allowed"] == 1.0


def test_the_spent_budget_is_measured_and_the_missed_target_reported():
    # x = i ≥ 0, y = x + b: adding 50 to the bias turns cosine below 0.99 on the held-out x
    proto, report = onnxslim_kit.optimize(parse(MODEL), "test_noise(amount=50),test_noise", calib=_calib(8))
    first = report.passes[0].fidelity
    assert first["used"] > 1 and not first["met"] and "MISSED" in report.table()
    assert SEEN[1]["allowed"] == pytest.approx(first["used"])  # spent: the next may not make it worse
    assert "target cos:0.99 is missed" in report.table()
    with pytest.raises(VerificationError, match="missed"):
        onnxslim_kit.optimize(parse(MODEL), "test_noise(amount=50)", calib=_calib(8), strict=True)
    _, relaxed = onnxslim_kit.optimize(parse(MODEL), "test_noise(amount=50)", calib=_calib(8), target="none")
    assert relaxed.passes[0].fidelity["met"]


def test_lossless_only_pipelines_do_not_split_or_judge():
    _, report = onnxslim_kit.optimize(parse(MODEL), "fuse", calib=_calib(8))
    assert report.views == [] and report.verified_on == "calibration samples"


@pytest.mark.parametrize("target", ["cos:1.5", "psnr:30", "metric:0.9"])
def test_bad_targets_are_one_line_errors_before_any_pass(target):
    with pytest.raises(UserError):
        onnxslim_kit.optimize(parse(MODEL), "test_noise", calib=_calib(8), target=target)
    assert SEEN == []
