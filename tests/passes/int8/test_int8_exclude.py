"""``int8`` and the one selector: its ``exclude=`` / ``include=`` and the global ``--exclude``
leave the selected layers as they were (float, same weights), the rest quantized; a selector
matching nothing exits 2 through the command line, in one line."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper
from conftest import cli_error
from test_int8 import conv_chain

from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.model import Model
from onnxslim_kit.pipeline import PassContext, parse_pass_list, resolve, run_pipeline
from onnxslim_kit.selection import Selector

NAMES = ("c1", "c2", "c3")


def named_chain():
    model = conv_chain(np.random.default_rng(7))
    for node, name in zip(model.graph.node[::2], NAMES):
        node.name = name
    return model


def run(model, options="target=none", exclude=None, passes=None):
    feed = CalibrationFeed(input_specs(model), None, num_samples=3)
    spec = passes or f"int8({options},speed_check=false)"
    out, report = run_pipeline(model, parse_pass_list(spec), feed, verify_samples=3, exclude=exclude)
    return out, report.passes[-1]


def conv_state(model) -> dict:
    """``{conv name: (quantized?, its float weight or None)}``."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.name: (n.input[1] not in inits, inits.get(n.input[1])) for n in model.graph.node if n.op_type == "Conv"}


def assert_kept_as_is(original, out, kept: set):
    before, after = conv_state(original), conv_state(out)
    assert {n for n, (q, _) in after.items() if q} == set(NAMES) - kept
    for name in kept:
        assert not after[name][0]
        np.testing.assert_array_equal(after[name][1], before[name][1])  # the same weights, bit for bit


@pytest.mark.parametrize("option", ["exclude=c2", "exclude=re:^c2$", "include=c1;c3", "exclude=first:Conv:2;c3;c1"])
def test_own_selector_keeps_layer_float(option):
    model = named_chain()
    out, rep = run(model, f"target=none,{option}")
    kept = {"c2"} if option != "exclude=first:Conv:2;c3;c1" else set(NAMES)
    if kept == set(NAMES):
        assert not rep.modified and rep.skipped["excluded by include/exclude"] == 3
        return
    assert_kept_as_is(model, out, kept)
    assert rep.rewrites["Conv→int8"] == 2 and rep.skipped["excluded by include/exclude"] == 1


@pytest.mark.parametrize("exclude", ["c2", ["re:^c2$"], ["op:Relu", "c2"]])
def test_global_exclude_keeps_layer_float(exclude):
    model = named_chain()
    out, rep = run(model, exclude=exclude)
    assert_kept_as_is(model, out, {"c2"})
    assert rep.rewrites["Conv→int8"] == 2 and rep.skipped["excluded by --exclude"] == 1
    assert "excluded by include/exclude" not in rep.skipped


def test_global_and_own_exclude_together():
    model = named_chain()
    out, rep = run(model, "target=none,exclude=c1", exclude="c3")
    assert_kept_as_is(model, out, {"c1", "c3"})
    assert rep.skipped["excluded by include/exclude"] == 1 and rep.skipped["excluded by --exclude"] == 1


def test_cle_leaves_excluded_conv_as_it_was():
    model = named_chain()
    out, rep = run(model, "target=none,cle=true,exclude=c2")
    assert_kept_as_is(model, out, {"c2"})
    assert rep.skipped["cle: excluded conv"] == 2  # the pairs (c1, c2) and (c2, c3)
    assert "cle: conv pair equalized" not in rep.rewrites
    out, rep = run(model, "target=none,cle=true,exclude=c3")
    assert rep.rewrites["cle: conv pair equalized"] == 1 and rep.skipped["cle: excluded conv"] == 1
    assert_kept_as_is(model, out, {"c3"})


def test_global_exclude_matching_nothing_is_ignored_by_the_pass():
    """After earlier passes renamed or removed nodes, ``--exclude`` may match nothing: no error."""
    model = named_chain()
    feed = CalibrationFeed(input_specs(model), None, num_samples=2)
    [(instance, options)] = resolve(parse_pass_list("int8(target=none,speed_check=false)"))
    ctx = PassContext(options=options, feed=feed, original=model, exclude=Selector.parse("gone; c2"))
    graph_model = Model.from_proto(model)
    result = instance.run(graph_model, ctx)
    assert result.rewrites["Conv→int8"] == 2 and result.skipped["excluded by --exclude"] == 1


def test_selector_matching_nothing_exits_2_in_one_line(tmp_path):
    model = named_chain()
    for passes, needle in [("int8(exclude=c4)", "int8(exclude=...): 'c4' matches no node; closest: "),
                           ("fuse,int8(include=op:Gem)", "'op:Gem' matches no node; closest op types: "),
                           ("fuse,int8(exclude=last:)", "int8(exclude=...): cannot read 'last:'")]:
        assert needle in cli_error(tmp_path, model, passes)
