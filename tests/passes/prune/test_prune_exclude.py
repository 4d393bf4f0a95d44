"""prune(exclude=…) and the global --exclude: selected nodes keep their output channels."""

from __future__ import annotations

import onnx
import pytest
from test_prune_ratio import NET, min_cosine
from test_prune_strip import assert_equivalent, conv_weight, residual_model, run_prune

import onnxslim_kit
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.cli import main
from onnxslim_kit.errors import UserError
from onnxslim_kit.model import Model
from onnxslim_kit.passes.prune import PrunePass
from onnxslim_kit.pipeline import PassContext
from onnxslim_kit.selection import Selector

RATIO = {"ratio": 0.5, "scope": "layer", "criterion": "l2", "multiple": 8, "min_channels": 8}


def test_ratio_without_exclude_cuts_c4():
    out, _ = run_prune(NET, **RATIO)
    assert conv_weight(out, "c4").shape[0] == 8  # the baseline the next tests compare with


@pytest.mark.parametrize("selector", ["c4", "re:^c4$", "last:Conv:2; op:Relu", "first:Conv:5"])
def test_selected_conv_keeps_its_output_channels(selector):
    out, result = run_prune(NET, exclude=Selector.parse(selector), **RATIO)
    assert conv_weight(out, "c4").shape[0] == 16  # c4 is selected by every form above: 16 channels stay
    assert result.skipped["unprunable: excluded"] >= 16
    if selector == "c4":  # the other groups are still cut
        assert conv_weight(out, "c1").shape[0] == 16
        assert conv_weight(out, "c5").shape[0] == 16
        assert conv_weight(out, "c5").shape[1] == 16 + 16  # concat: c4 (16, kept) + the residual group (16)
    assert min_cosine(out) > 0.5


def test_selected_consumer_still_loses_input_channels():
    """exclude=c3 keeps c3's outputs and so its residual group (c1, dw); c2 is still cut and
    c3 reads fewer channels; c5 — selected too — keeps its own 24 but loses c4's cut inputs."""
    out, _ = run_prune(NET, exclude=Selector.parse("c3; c5"), **RATIO)
    assert conv_weight(out, "c1").shape[0] == 32 and conv_weight(out, "dw").shape[0] == 32
    assert conv_weight(out, "c2").shape[0] == 16
    assert conv_weight(out, "c3").shape == (32, 16, 1, 1)
    assert conv_weight(out, "c4").shape[0] == 8
    assert conv_weight(out, "c5").shape == (24, 8 + 32, 3, 3)


def test_exclude_blocks_lossless_strip():
    proto = residual_model()
    out, result = run_prune(proto, exclude=Selector.parse("c2"), target="none")  # c2 is coupled to c1 by the residual Add
    assert "strip constant channel" not in result.rewrites
    assert conv_weight(out, "c1").shape == (16, 8, 3, 3)
    assert result.skipped["constant channel in a blocked group: excluded"] == 3
    assert_equivalent(proto, out)


def test_global_exclude_is_honoured_and_may_match_nothing():
    out, _ = run_prune(NET, exclude=Selector.EMPTY, **RATIO)  # baseline through the same path
    pass_ = PrunePass()
    opts = {k: o.default for k, o in pass_.options.items()} | RATIO | {"exclude": Selector.EMPTY}
    model = Model.from_proto(NET)
    ctx = PassContext(options=opts, feed=CalibrationFeed(input_specs(NET), None, num_samples=4), original=NET)
    ctx.exclude = Selector.parse("c4; gone_after_fuse")  # a term matching nothing is ignored here
    pass_.run(model, ctx)
    model.commit()
    kept = model.to_proto()
    assert conv_weight(out, "c4").shape[0] == 8
    assert conv_weight(kept, "c4").shape[0] == 16


def test_sparsity_leaves_selected_weights_dense():
    out, result = run_prune(NET, sparsity=0.5, exclude=Selector.parse("op:Gemm"))
    assert result.skipped["sparsity: excluded"] == 1
    fc = conv_weight(out, "fc")
    assert (fc == 0).sum() == 0 and (conv_weight(out, "c1") == 0).mean() >= 0.5


def test_selector_matching_nothing_is_a_user_error():
    with pytest.raises(UserError, match=r"prune\(exclude=…\): 'c44' matches no node; closest: c4"):
        onnxslim_kit.optimize(NET, passes="prune(ratio=0.5,exclude=c44)", verify=False)


def test_cli_selector_matching_nothing_exits_2(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(NET, path)
    assert main([str(path), "-q", "--passes", "prune(exclude=op:Cnv)"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: prune(exclude=…): 'op:Cnv' matches no node")
    assert "closest op types: Conv" in err[0]
    assert not list(tmp_path.glob("*.slim.onnx"))


def test_bad_selector_syntax_exits_2(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(NET, path)
    assert main([str(path), "-q", "--passes", "prune(exclude=first:Conv)"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "first:Conv" in err[0]
