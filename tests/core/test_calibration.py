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


# --- ONNX Runtime CalibrationDataReader sources and transform= --------------------------------

def _sample(value: float) -> dict:
    return {"img": np.full((1, 3, 2, 2), value, np.float32), "ids": np.zeros((1, 2), np.int64)}


class _ReaderOnce:
    """get_next only (as many ONNX Runtime examples): readable once."""

    def __init__(self, n):
        self.items = [_sample(i) for i in range(n)]
        self.calls = 0

    def get_next(self):
        self.calls += 1
        return self.items.pop(0) if self.items else None


class _ReaderRewind(_ReaderOnce):
    def __init__(self, n):
        super().__init__(n)
        self.all, self.rewinds = list(self.items), 0

    def rewind(self):
        self.rewinds += 1
        self.items = list(self.all)


def test_a_reader_without_rewind_is_read_once_into_memory(caplog):
    import logging

    reader = _ReaderOnce(3)
    with caplog.at_level(logging.INFO, logger="onnxslim_kit"):
        feed = CalibrationFeed(SPECS, reader)
    assert [float(s["img"].flat[0]) for s in feed] == [0.0, 1.0, 2.0]
    assert [float(s["img"].flat[0]) for s in feed] == [0.0, 1.0, 2.0]  # re-iterable
    assert reader.calls == 4  # three samples and the None, once
    assert "has no rewind(): its 3 samples were read once into memory" in caplog.text


def test_a_reader_with_rewind_is_rewound_on_each_pass():
    reader = _ReaderRewind(2)
    feed = CalibrationFeed(SPECS, reader)
    assert feed.count() == 2 and feed.count() == 2 and reader.rewinds == 2
    assert feed.take(1)[0]["img"].shape == (1, 3, 2, 2)


def test_an_onnxruntime_calibration_data_reader_subclass_works():
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):  # its __len__ raises NotImplementedError: never called
        def __init__(self):
            self.items = iter([_sample(1.0), _sample(2.0)])

        def get_next(self):
            return next(self.items, None)

    assert CalibrationFeed(SPECS, Reader()).count() == 2


def test_a_reader_through_optimize():
    import onnxslim_kit

    _, report = onnxslim_kit.optimize(MODEL, "fuse", calib=_ReaderOnce(2), input_shapes={"img": [1, 3, 2, 2],
                                                                                            "ids": [1, 2]})
    assert report.ok and report.verified_on == "calibration samples"
    assert report.sources["calib"] == {"python": "CalibrationDataReader _ReaderOnce"}


def test_transform_is_applied_to_every_item():
    items = [(np.full((1, 3, 2, 2), i, np.float32), i) for i in range(3)]  # (image, label) pairs

    def transform(item):
        image, _label = item
        return {"img": image, "ids": np.zeros((1, 2), np.int32)}

    feed = CalibrationFeed(SPECS, items, transform=transform)
    samples = list(feed)
    assert [float(s["img"].flat[0]) for s in samples] == [0.0, 1.0, 2.0]
    assert samples[0]["ids"].dtype == np.int64  # checked and cast after the transform
    reader = _ReaderOnce(2)
    reader.items = [(s["img"], 0) for s in reader.items]
    assert CalibrationFeed(SPECS, reader, transform=transform).count() == 2


@pytest.mark.parametrize("source, transform, match", [
    (None, lambda s: s, "transform= needs a data source"),
    ([_sample(0)], 3, "transform= must be a function"),
    ([(1, 2)], None, "expected a dict of input name → array, got tuple"),
    ([_sample(0)], lambda s: [s], "got list from transform"),
    (object(), None, "a object is not a source"),
])
def test_bad_sources_and_transforms_are_user_errors(source, transform, match):
    with pytest.raises(UserError, match=match):
        CalibrationFeed(SPECS, source, transform=transform)
