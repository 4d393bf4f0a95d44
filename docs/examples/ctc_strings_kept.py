"""A ``--metric`` for a CTC text recognizer whose graph ends in raw logits (no Softmax).

    python -m onnxslim_kit rec.onnx --passes fuse,int8 --calib lines.npz \\
        --metric ctc_strings_kept:strings_kept --target metric:0.99

The score is the share of the original's strings the candidate reads the same: greedy CTC
decoding (the arg-max per time step, repeats merged, blanks dropped) of both outputs, compared
as sequences of class indices — no character table needed. ``OUTPUT`` is the logits output
``[T, N, C]`` (time, lines, classes; ddddocr's ``387``), ``BLANK`` its blank class.
"""

import numpy as np

OUTPUT, BLANK = "387", 0


def decode(logits: np.ndarray, blank: int = BLANK) -> list:
    """Greedy CTC of ``[T, N, C]`` logits: one tuple of class indices per line."""
    best = np.asarray(logits).argmax(-1)
    strings = []
    for steps in best.T:
        keep = np.r_[True, steps[1:] != steps[:-1]] & (steps != blank)
        strings.append(tuple(steps[keep].tolist()))
    return strings


def strings_kept(reference: list, candidate: list) -> float:
    """The share of lines, over the judged samples, whose decoded strings are equal."""
    pairs = [(r, c) for ref, got in zip(reference, candidate)
             for r, c in zip(decode(ref[OUTPUT]), decode(got[OUTPUT]))]
    return sum(r == c for r, c in pairs) / len(pairs) if pairs else 1.0
