"""Default (generated) verification data the model can run on (issue 15 item 7).

Integer inputs get the values the graph implies (indices below the axis they index, Reshape /
Expand / Tile / Slice / axes / Split / Range / divisor inputs); when ONNX Runtime still refuses
the samples, the dynamic dimensions are searched (a sample length a first Conv needs, a state's
batch of 1), then constant integer inputs. What was derived is a load note. When nothing
runs, the message is the clear one it always was.
"""

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxslim_kit
from onnxslim_kit.calibration import CalibrationFeed, input_specs
from onnxslim_kit.errors import UserError

HEAD = '<ir_version: 8, opset_import: ["" : 18]>\n'
# each graph is refused by ORT on uniform [0, 16) integers or 64-long dynamic dimensions
GRAPHS = {
    "gather_input_table": "g (float[5,3] t, int64[4] i) => (float[4,3] y) { y = Gather (t, i) }",
    "gather_elements": "g (float[3,4] t, int64[3,2] i) => (float[3,2] y) { y = GatherElements <axis=1> (t, i) }",
    "reshape_shape": "g (float[2,3,4] x, int64[3] s) => (float[?,?,?] y) { y = Reshape (x, s) }",
    "expand_shape": "g (float[2,3] x, int64[2] s) => (float[?,?] y) { y = Expand (x, s) }",
    "unsqueeze_axes": "g (float[2,3] x, int64[2] a) => (float[?,?,?,?] y) { y = Unsqueeze (x, a) }",
    "reduce_axes": "g (float[2,3,4] x, int64[2] a) => (float[?,?,?] y) { y = ReduceSum (x, a) }",
    "slice": "g (float[4,6] x, int64[2] s, int64[2] e, int64[2] a) => (float[?,?] y) { y = Slice (x, s, e, a) }",
    "split_sizes": "g (float[10,3] x, int64[3] s) => (float[?,3] a, float[?,3] b, float[?,3] c) "
                   "{ a, b, c = Split <axis=0> (x, s) }",
    "topk": "g (float[3,5] x, int64[1] k) => (float[3,?] v, int64[3,?] i) { v, i = TopK (x, k) }",
    "cast_divisor": "g (int32[6] x, int32[6] d) => (int32[6] y) { e = Cast <to=6> (d)\n y = Div (x, e) }",
    "range": "g (int64 a, int64 b, int64 c) => (int64[?] y) { y = Range (a, b, c) }",
    "resize_scales": "g (float[1,1,2,2] x, float[4] s) => (float[?,?,?,?] y) { y = Resize (x, , s) }",
    "dropout_ratio": "g (float[3,4] x, float r) => (float[3,4] y) { y = Dropout (x, r) }",
    "onehot_float_depth": "g (int64[3] i, float d, float[2] v) => (float[3,?] y) { y = OneHot (i, d, v) }",
}


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_integer_inputs_get_data_the_graph_implies(name):
    model = onnx.parser.parse_model(HEAD + GRAPHS[name])
    onnx.checker.check_model(model, full_check=True)
    out, report = onnxslim_kit.optimize(model, "fuse")
    assert report.passes[0].rolled_back is False
    # the generated samples themselves run in ORT (checked above by the verifier), deterministically
    feed = CalibrationFeed(input_specs(model))
    first, again = feed.take(2), feed.take(2)
    for a, b in zip(first, again):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_values_derived():
    model = onnx.parser.parse_model(HEAD + GRAPHS["slice"])
    sample = CalibrationFeed(input_specs(model)).take(1)[0]
    assert sample["s"].tolist() == [0, 0] and sample["a"].tolist() == [0, 1] and sample["e"].min() >= 6
    split = CalibrationFeed(input_specs(onnx.parser.parse_model(HEAD + GRAPHS["split_sizes"]))).take(1)[0]
    assert split["s"].tolist() == [3, 3, 4]
    gather = CalibrationFeed(input_specs(onnx.parser.parse_model(HEAD + GRAPHS["gather_input_table"]))).take(4)
    assert max(int(s["i"].max()) for s in gather) < 5 and min(int(s["i"].min()) for s in gather) >= 0
    div = CalibrationFeed(input_specs(onnx.parser.parse_model(HEAD + GRAPHS["cast_divisor"]))).take(8)
    assert min(int(s["d"].min()) for s in div) >= 1


AUDIO = HEAD + """
g (float[?,?] wave, float[2,?,8] state) => (float[?,4,?] y, float[1,8] h)
  <int64[1] ax1 = {1}, int64[1] s0 = {0}, int64[1] e1 = {1}, int64[2] shape = {1, 8}> {
  u = Unsqueeze (wave, ax1)
  y = Conv <strides=[64]> (u, w)
  first = Slice (state, s0, e1, s0)
  h = Reshape (first, shape)
}
"""


def audio_model() -> onnx.ModelProto:
    """A front end: ``[batch, samples]`` into a Conv of kernel 200 (64 samples are too short) and
    a ``[2, batch, 8]`` state whose batch must be 1 (a Reshape to [1, 8])."""
    model = onnx.parser.parse_model(AUDIO)
    w = np.random.default_rng(0).standard_normal((4, 1, 200)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    onnx.checker.check_model(model, full_check=True)
    return model


def test_audio_sample_length_and_state_batch_are_searched():
    out, report = onnxslim_kit.optimize(audio_model(), "fuse")
    notes = " ".join(report.load_notes)
    assert "generated data derived" in notes and "wave:1,256" in notes and "state:2,1,8" in notes, notes
    assert report.passes[0].rolled_back is False


def test_int8_gets_the_derived_data_too():
    out, report = onnxslim_kit.optimize(audio_model(), "int8")
    entry = report.passes[0]
    assert entry.verification is None or entry.verification["status"] in ("ok", "drift"), entry.verification


def test_nothing_runs_keeps_the_clear_message():
    model = onnx.parser.parse_model(HEAD + """
    g (float[?] x) => (float[3,5] y) <int64[2] s = {3, 5}> { y = Reshape (x, s) }
    """)
    with pytest.raises(UserError, match="cannot run it on the sample inputs.*--input-shape"):
        onnxslim_kit.optimize(model, "fuse")


@pytest.mark.realmodel
def test_silero_vad_without_data():
    from onnxslim_kit.zoo import fetch

    path = fetch("silero_vad")
    out, report = onnxslim_kit.optimize(str(path), "fuse")
    assert any("input:1,256" in n and "state:2,1,128" in n for n in report.load_notes), report.load_notes
    assert report.passes[0].rolled_back is False


def test_zero_dim_value_is_an_empty_input():
    """``dim_value: 0`` is a fixed, empty dimension (ORT refuses any other size): generated as 0."""
    model = onnx.parser.parse_model(HEAD + "g (float[3,4] x, float[0] like) => (float[3,4] y) { y = CastLike (x, like) }")
    assert CalibrationFeed(input_specs(model)).take(1)[0]["like"].shape == (0,)
    _, report = onnxslim_kit.optimize(model, "fuse")
    assert report.passes[0].rolled_back is False
