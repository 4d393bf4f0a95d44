"""The calibration feed: files, folders, Python iterables, generated data, shapes."""

import numpy as np
import pytest
from conftest import parse

from onnxslim_kit.calibration import CalibrationFeed, input_specs, parse_input_shapes
from onnxslim_kit.errors import UserError

MODEL = parse("""
<ir_version: 8, opset_import: ["" : 13]>
g (float[N,3,H,W] img, int64[N,L] ids) => (float[N,3,H,W] y, int64[N,L] z) {
  y = Identity (img)
  z = Identity (ids)
}
""")
SPECS = input_specs(MODEL)


def test_specs_and_generated_data_are_deterministic():
    assert [(s.name, s.dtype.name) for s in SPECS] == [("img", "float32"), ("ids", "int64")]
    a = CalibrationFeed(SPECS, None, {"img": [2, 3, 8, 8]}, num_samples=3, seed=1).take(3)
    b = CalibrationFeed(SPECS, None, {"img": [2, 3, 8, 8]}, num_samples=3, seed=1).take(3)
    assert len(a) == 3
    assert a[0]["img"].shape == (2, 3, 8, 8) and a[0]["img"].dtype == np.float32
    assert a[0]["ids"].shape == (1, 64) and a[0]["ids"].dtype == np.int64
    assert 0 <= a[0]["ids"].min() and a[0]["ids"].max() < 16
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x["img"], y["img"])


def test_npz_stack_is_split_and_dtype_cast(tmp_path):
    img = np.random.default_rng(0).random((5, 1, 3, 4, 4))  # float64 stack of 5 samples
    ids = np.zeros((5, 1, 7), np.int32)
    np.savez(tmp_path / "calib.npz", img=img, ids=ids)
    feed = CalibrationFeed(SPECS, tmp_path / "calib.npz")
    samples = list(feed)
    assert len(samples) == 5 and feed.count() == 5
    assert samples[2]["img"].dtype == np.float32 and samples[2]["ids"].dtype == np.int64
    np.testing.assert_allclose(samples[2]["img"], img[2].astype(np.float32))
    assert list(feed)[2]["img"] is samples[2]["img"] or np.array_equal(list(feed)[2]["img"], samples[2]["img"])


def test_folder_of_single_samples(tmp_path):
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", img=np.full((1, 3, 2, 2), i, np.float32), ids=np.zeros((1, 2), np.int64))
    samples = CalibrationFeed(SPECS, tmp_path).take(10)
    assert [float(s["img"][0, 0, 0, 0]) for s in samples] == [0.0, 1.0, 2.0]


def test_callable_source_is_re_iterable():
    calls = []

    def source():
        calls.append(1)
        return ({"img": np.zeros((1, 3, 2, 2), np.float32), "ids": np.zeros((1, 2), np.int64)} for _ in range(2))

    feed = CalibrationFeed(SPECS, source)
    assert len(list(feed)) == 2 and len(list(feed)) == 2 and len(calls) == 2


@pytest.mark.parametrize("arrays,match", [
    ({"img": np.zeros((1, 3, 2, 2), np.float32)}, "missing inputs ids"),
    ({"img": np.zeros((3, 2, 2), np.float32), "ids": np.zeros((1, 2), np.int64)}, "rank 3"),
    ({"img": np.zeros((1, 4, 2, 2), np.float32), "ids": np.zeros((1, 2), np.int64)}, "dimension 1 is 4"),
    ({"img": np.zeros((1, 3, 2, 2), np.float32), "ids": np.zeros((1, 2), np.float32)}, "expects int64"),
])
def test_bad_calibration_files(tmp_path, arrays, match):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(UserError, match=match):
        CalibrationFeed(SPECS, tmp_path / "bad.npz")


def test_npy_needs_single_input_and_missing_path(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 2, 2), np.float32))
    with pytest.raises(UserError, match="single-input"):
        CalibrationFeed(SPECS, tmp_path / "x.npy")
    with pytest.raises(UserError, match="no such file"):
        CalibrationFeed(SPECS, tmp_path / "nothing")


def test_input_shapes_parsing_and_validation():
    assert parse_input_shapes(["img:1,3,224,224", "ids:1,128"]) == {"img": [1, 3, 224, 224], "ids": [1, 128]}
    with pytest.raises(UserError, match="expected name"):
        parse_input_shapes(["1,3,224"])
    with pytest.raises(UserError, match="not inputs"):
        CalibrationFeed(SPECS, None, {"nope": [1]})
    with pytest.raises(UserError, match="rank 2"):
        CalibrationFeed(SPECS, None, {"img": [1, 3]})


def test_generated_scalars_are_arrays():
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (bool c, float s, int64 n) => (bool y, float z, int64 m) {
      y = Identity (c)
      z = Identity (s)
      m = Identity (n)
    }
    """)
    sample = CalibrationFeed(input_specs(model), None).take(1)[0]
    assert all(isinstance(v, np.ndarray) and v.shape == () for v in sample.values())


def test_generated_ids_stay_inside_gathered_tables():
    model = parse("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (int64[1,8] ids, int32[1,8] kind) => (float[1,8,4] y, float[1,8,4] z) <float[2,4] types = {1,2,3,4,5,6,7,8}, float[100,4] words = {0.0}> {
      k = Cast <to = 7> (kind)
      z = Gather (types, k)
      y = Gather (words, ids)
    }
    """.replace("{0.0}", "{" + ", ".join(["0.0"] * 400) + "}"))
    specs = {s.name: s for s in input_specs(model)}
    assert specs["kind"].int_high == 2 and specs["ids"].int_high == 16
    sample = CalibrationFeed(list(specs.values()), None, num_samples=1).take(1)[0]
    assert sample["kind"].max() < 2
