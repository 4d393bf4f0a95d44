"""Offline, deterministic synthesis of benchmark inputs: rendered text, pages, faces, audio.

Everything is drawn from a ``numpy.random.Generator`` passed in, so the same seed gives the
same pixels and samples on every machine with the same font file (recorded in the results).

Fonts (first found wins; :func:`font_file` says which):
  1. ``$BENCH_FONT_DIR/DejaVuSans.ttf`` if set,
  2. Debian's ``fonts-dejavu-core`` (``/usr/share/fonts/truetype/dejavu``),
  3. matplotlib's bundled DejaVu (``pip install matplotlib``),
  4. Pillow's built-in scalable default font (always there; not DejaVu — noted in the results).

Images are returned as uint8 RGB arrays (H, W, 3); the model-specific preprocessing
(channel order, resize, normalisation, layout) lives in ``inputs.py``.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_NAMES = ("DejaVuSans.ttf", "DejaVuSans-Bold.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf")
SAMPLE_RATE = 16000


# --- fonts -------------------------------------------------------------------------------

def _font_dirs() -> list:
    dirs = []
    if os.environ.get("BENCH_FONT_DIR"):
        dirs.append(Path(os.environ["BENCH_FONT_DIR"]))
    dirs.append(Path("/usr/share/fonts/truetype/dejavu"))
    try:
        import matplotlib

        dirs.append(Path(matplotlib.get_data_path()) / "fonts" / "ttf")
    except ImportError:
        pass
    return dirs


@lru_cache(maxsize=None)
def font_files() -> tuple:
    """The DejaVu TTF files found in the first folder that has DejaVuSans.ttf (empty: none)."""
    for folder in _font_dirs():
        if (folder / FONT_NAMES[0]).is_file():
            return tuple(str(folder / n) for n in FONT_NAMES if (folder / n).is_file())
    return ()


def font_file() -> str:
    """Which font renders the text (a path, or Pillow's built-in font)."""
    files = font_files()
    return files[0] if files else f"Pillow {Image.__version__} built-in default font"


def font(size: int, variant: int = 0) -> ImageFont.FreeTypeFont:
    files = font_files()
    if files:
        return ImageFont.truetype(files[variant % len(files)], size)
    return ImageFont.load_default(size)


# --- text --------------------------------------------------------------------------------

def sentences() -> list:
    """Real English sentences, one a line, from ``benchmarks/data/sentences.txt``."""
    path = Path(__file__).with_name("data") / "sentences.txt"
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def text_snippet(rng: np.random.Generator, words: list, max_chars: int) -> str:
    """A short line: consecutive words of a sentence, a number, a date or a price."""
    kind = rng.integers(0, 6)
    if kind == 0:
        return f"{rng.integers(1, 29):02d}/{rng.integers(1, 13):02d}/{rng.integers(1990, 2031)}"
    if kind == 1:
        return f"${rng.integers(1, 9999)}.{rng.integers(0, 100):02d}"
    start = int(rng.integers(0, len(words)))
    text = words[start]
    for word in words[start + 1:]:
        if len(text) + 1 + len(word) > max_chars:
            break
        text += " " + word
    return text[:max_chars]


def _dark(rng) -> tuple:
    return tuple(int(v) for v in rng.integers(0, 80, size=3))


def _light(rng) -> tuple:
    return tuple(int(v) for v in rng.integers(200, 256, size=3))


def _finish(img: Image.Image, rng, noise: float = 4.0, blur: bool = True) -> np.ndarray:
    if blur and rng.random() < 0.5:
        img = img.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.3, 0.8))))
    arr = np.asarray(img, dtype=np.float32)
    arr = arr + rng.normal(0.0, noise, size=arr.shape)
    return np.clip(arr, 0, 255).astype(np.uint8)


def text_line(rng: np.random.Generator, text: str, height: int = 48) -> np.ndarray:
    """A cropped text line about ``height`` pixels high, dark text on a light background."""
    size = int(rng.integers(int(height * 0.55), int(height * 0.72)))
    face = font(size, int(rng.integers(0, 3)))
    left, top, right, bottom = face.getbbox(text)
    pad_x, pad_y = int(rng.integers(3, 10)), int(rng.integers(3, 8))
    width, tall = right - left + 2 * pad_x, bottom - top + 2 * pad_y
    img = Image.new("RGB", (width, tall), _light(rng))
    ImageDraw.Draw(img).text((pad_x - left, pad_y - top), text, font=face, fill=_dark(rng))
    return _finish(img, rng)


def page(rng: np.random.Generator, words: list, width: int, height: int) -> tuple:
    """A document-like page: a title, text lines and a rule. Returns (RGB array, line boxes)."""
    img = Image.new("RGB", (width, height), _light(rng))
    draw = ImageDraw.Draw(img)
    boxes = []
    y = int(rng.integers(8, 24))
    first = True
    while True:
        size = int(rng.integers(24, 34)) if first else int(rng.integers(14, 24))
        face = font(size, 1 if first else int(rng.integers(0, 3)))
        x = int(rng.integers(10, 40))
        text = text_snippet(rng, words, max_chars=int((width - x - 10) / (size * 0.6)))
        left, top, right, bottom = face.getbbox(text)
        if y + bottom - top + 4 > height - 8:
            break
        draw.text((x - left, y - top), text, font=face, fill=_dark(rng))
        boxes.append((x, y, x + right - left, y + bottom - top))
        y += bottom - top + int(rng.integers(size // 2, size + 4))
        if first or rng.random() < 0.1:
            draw.line([(x, y - size // 4), (width - 20, y - size // 4)], fill=_dark(rng), width=1)
        first = False
    return _finish(img, rng, noise=3.0), boxes


# --- faces and natural-ish images ----------------------------------------------------------

def _background(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """Smooth colour gradients plus blurred blobs: a stand-in for a natural scene."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.zeros((height, width, 3), np.float32)
    for c in range(3):
        a, b, c0 = rng.uniform(-1, 1), rng.uniform(-1, 1), rng.uniform(40, 200)
        base[..., c] = c0 + 60 * (a * xx / width + b * yy / height)
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 9))):
        x0, y0 = rng.integers(-width // 4, width), rng.integers(-height // 4, height)
        w, h = rng.integers(width // 8, width // 2), rng.integers(height // 8, height // 2)
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([int(x0), int(y0), int(x0 + w), int(y0 + h)], fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    return img.filter(ImageFilter.GaussianBlur(radius=max(1.0, width / 40)))


def natural_image(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    return _finish(_background(rng, width, height), rng, noise=5.0, blur=False)


def _draw_face(draw: ImageDraw.ImageDraw, rng, cx: float, cy: float, size: float) -> None:
    """A frontal face of height ``size`` centred at (cx, cy): skin, hair, eyes, brows, nose, mouth."""
    tone = rng.uniform(0.45, 1.0)
    skin = (int(230 * tone + 20), int(180 * tone + 15), int(150 * tone + 10))
    hair = tuple(int(v) for v in rng.integers(10, 90, 3))
    w, h = size * 0.78, size
    margin = size * 0.04
    draw.ellipse([cx - w / 2 - margin, cy - h / 2 - 1.5 * margin, cx + w / 2 + margin, cy + h * 0.05], fill=hair)
    draw.ellipse([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], fill=skin)
    eye_y, eye_dx, eye_r = cy - h * 0.08, w * 0.22, size * 0.055
    for side in (-1, 1):
        ex = cx + side * eye_dx + rng.uniform(-1, 1) * size * 0.01
        draw.ellipse([ex - eye_r * 1.6, eye_y - eye_r, ex + eye_r * 1.6, eye_y + eye_r], fill=(240, 240, 240))
        draw.ellipse([ex - eye_r * 0.8, eye_y - eye_r * 0.8, ex + eye_r * 0.8, eye_y + eye_r * 0.8], fill=(40, 30, 25))
        draw.line([ex - eye_r * 2, eye_y - eye_r * 2.4, ex + eye_r * 2, eye_y - eye_r * 2.6], fill=hair,
                  width=max(1, int(size * 0.03)))
    shade = tuple(int(v * 0.8) for v in skin)
    draw.polygon([(cx, eye_y + h * 0.05), (cx - w * 0.08, cy + h * 0.15), (cx + w * 0.08, cy + h * 0.15)], fill=shade)
    mouth_y = cy + h * 0.28
    draw.chord([cx - w * 0.2, mouth_y - h * 0.06, cx + w * 0.2, mouth_y + h * 0.06], 0, 180,
               fill=(int(rng.uniform(140, 200)), 50, 60))


def face_crop(rng: np.random.Generator, size: int = 48) -> np.ndarray:
    """A tight face crop (forehead to chin), drawn at 4× and downsampled (box filter)."""
    big = size * 4
    img = _background(rng, big, big)
    draw = ImageDraw.Draw(img)
    _draw_face(draw, rng, big / 2 + rng.uniform(-0.05, 0.05) * big, big / 2 + rng.uniform(-0.05, 0.05) * big,
               big * rng.uniform(0.85, 1.0))
    return _finish(img.resize((size, size), Image.BOX), rng, noise=3.0, blur=False)


def face_scene(rng: np.random.Generator, width: int, height: int) -> tuple:
    """A scene with 1–3 faces. Returns (RGB array, face boxes)."""
    img = _background(rng, width, height)
    draw = ImageDraw.Draw(img)
    boxes = []
    for _ in range(int(rng.integers(1, 4))):
        size = float(rng.uniform(0.2, 0.45) * min(width, height))
        cx = float(rng.uniform(size / 2, width - size / 2))
        cy = float(rng.uniform(size / 2, height - size / 2))
        _draw_face(draw, rng, cx, cy, size)
        boxes.append((cx - size * 0.4, cy - size / 2, cx + size * 0.4, cy + size / 2))
    return _finish(img, rng, noise=3.0), boxes


# --- audio -----------------------------------------------------------------------------------

def _resonator(signal: np.ndarray, freq: float, bandwidth: float, sr: int) -> np.ndarray:
    """Two-pole resonant filter (a formant), unit gain at DC normalised away."""
    from scipy.signal import lfilter

    r = np.exp(-np.pi * bandwidth / sr)
    theta = 2 * np.pi * freq / sr
    return lfilter([1 - r], [1, -2 * r * np.cos(theta), r * r], signal)


VOWELS = [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
          (660, 1720, 2410), (440, 1020, 2240)]  # formants F1–F3 (Hz) of English vowels


def speech_like(rng: np.random.Generator, seconds: float, sr: int = SAMPLE_RATE) -> tuple:
    """Voiced syllables (glottal pulses through vowel formants) with pauses and fricatives.

    Returns (float32 waveform in [-1, 1], per-sample voiced mask).
    """
    n = int(seconds * sr)
    out = np.zeros(n, np.float64)
    voiced = np.zeros(n, bool)
    t = int(rng.integers(int(0.05 * sr), int(0.2 * sr)))
    f0_base = rng.uniform(95, 230)
    while t < n:
        length = int(rng.uniform(0.12, 0.28) * sr)
        end = min(n, t + length)
        idx = np.arange(end - t)
        f0 = f0_base * (1 + 0.06 * np.sin(2 * np.pi * rng.uniform(3, 6) * idx / sr)) * rng.uniform(0.9, 1.1)
        phase = np.cumsum(f0 / sr)
        pulses = (np.diff(np.floor(phase), prepend=0) > 0).astype(np.float64)
        pulses += 0.02 * rng.standard_normal(len(idx))
        formants = VOWELS[int(rng.integers(0, len(VOWELS)))]
        syllable = sum(_resonator(pulses, f, 60 + 40 * k, sr) / (k + 1) for k, f in enumerate(formants))
        envelope = np.sin(np.pi * idx / len(idx)) ** 0.6
        syllable = syllable * envelope
        out[t:end] += syllable / (np.abs(syllable).max() + 1e-9) * rng.uniform(0.3, 0.8)
        voiced[t:end] = envelope > 0.2
        t = end
        if rng.random() < 0.3 and t < n:  # a fricative ("s", "f")
            f_len = min(n - t, int(rng.uniform(0.04, 0.1) * sr))
            hiss = np.diff(rng.standard_normal(f_len + 1)) * rng.uniform(0.03, 0.08)
            out[t:t + f_len] += hiss
            t += f_len
        t += int(rng.uniform(0.03, 0.25) * sr)  # pause between syllables / words
    out += 0.002 * rng.standard_normal(n)
    return np.clip(out, -1, 1).astype(np.float32), voiced


def non_speech(rng: np.random.Generator, seconds: float, sr: int = SAMPLE_RATE) -> np.ndarray:
    """Silence with faint room noise, or a slow tone chirp: no speech anywhere."""
    n = int(seconds * sr)
    noise = rng.standard_normal(n) * rng.uniform(0.0005, 0.005)
    if rng.random() < 0.5:
        return noise.astype(np.float32)
    t = np.arange(n) / sr
    f0, f1 = rng.uniform(200, 800), rng.uniform(1000, 3000)
    chirp = np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * seconds))) * rng.uniform(0.05, 0.2)
    return (chirp + noise).astype(np.float32)
