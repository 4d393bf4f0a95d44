"""The fidelity stop's runs of several samples as one batch, where that gives the same outputs.

A trial of :class:`.judged.Emulation` runs the same session on every judged sample ``s_1 … s_n``
with the same weights fed. When every graph input's first dim is symbolic and the samples
agree on the other dims, the stacked feed ``S = concat(s_1 … s_n; axis 0)`` gives, per
output, ``concat(y_1 … y_n; axis 0)`` for a model whose samples do not interact along axis 0
— and a run over ``S`` reads every weight once instead of ``n`` times (on issue 16's decoder
the runs are the weights' traffic, 2 samples of 32 tokens).

Not assumed, checked: the first trial runs the first sample alone *and* all of them stacked,
and the stacked runs are used — for that trial and the later ones — only when every output,
split along axis 0 by the samples' sizes, has the first sample's part equal to its own run bit
for bit (:meth:`Runs.run`); else the other samples run one by one too. The kernels ONNX Runtime
picks depend on the shapes, not on the values, so a batch that reproduces one sample exactly
reproduces the others (the first trial of issue 16's decoder, 2 samples: the stacked parts equal
both one-by-one runs); a model that mixes samples along axis 0, reduces differently at another
batch size, or has an output without the batch axis keeps the one-by-one runs. Cost of the check:
none where it holds (2 runs for the first trial instead of the ``n`` one-by-one runs), one run
where it fails. The proxy's input rows (:func:`.proxy.input_rows`) take the same check.
"""

from __future__ import annotations

import numpy as np


def stack(feeds: list, symbolic: set) -> tuple:
    """``(the feeds stacked along axis 0, [each sample's size on it])``, or ``(None, None)`` when
    an input is not in ``symbolic`` (the inputs whose first dim the session leaves open), the
    samples disagree on another dim or dtype, or there is one sample."""
    if len(feeds) < 2 or not feeds[0] or set(feeds[0]) - symbolic:
        return None, None
    sizes = []
    for feed in feeds:
        lead = {np.shape(v)[0] if np.ndim(v) else None for v in feed.values()}
        if len(lead) != 1 or None in lead or set(feed) != set(feeds[0]):
            return None, None
        sizes.append(lead.pop())
    for name, first in feeds[0].items():
        if any(np.shape(f[name])[1:] != np.shape(first)[1:] or np.asarray(f[name]).dtype != np.asarray(first).dtype
               for f in feeds):
            return None, None
    return {name: np.concatenate([f[name] for f in feeds]) for name in feeds[0]}, sizes


def split(outputs: dict, sizes: list):
    """[{name: sample k's part}] of stacked ``outputs``, or None when an output lacks the batch axis."""
    total = sum(sizes)
    if any(np.ndim(v) == 0 or np.shape(v)[0] != total for v in outputs.values()):
        return None
    cuts = np.cumsum(sizes)[:-1]
    parts = {name: np.split(v, cuts) for name, v in outputs.items()}
    return [{name: parts[name][k] for name in outputs} for k in range(len(sizes))]


def same(a: list, b: list) -> bool:
    return b is not None and all(
        x.keys() == y.keys() and all(x[n].dtype == y[n].dtype and x[n].shape == y[n].shape
                                     and np.array_equal(x[n], y[n], equal_nan=True) for n in x)
        for x, y in zip(a, b))


class Runs:
    """The outputs of ``session`` on ``feeds`` with ``weights`` fed: one by one until the stacked
    run has been checked equal, stacked after that (module docstring)."""

    def __init__(self, session, outputs: list, feeds: list):
        self.session, self.outputs, self.feeds = session, outputs, feeds
        symbolic = {i.name for i in session.get_inputs() if i.shape and not isinstance(i.shape[0], int)}
        self.stacked, self.sizes = stack(feeds, symbolic)
        self.checked = False  # the stacked run reproduced the one-by-one outputs

    def _one_by_one(self, weights: dict) -> list:
        return [dict(zip(self.outputs, self.session.run(self.outputs, {**feed, **weights}))) for feed in self.feeds]

    def _together(self, weights: dict):
        return split(dict(zip(self.outputs, self.session.run(self.outputs, {**self.stacked, **weights}))), self.sizes)

    def run(self, weights: dict) -> list:
        if self.checked:
            return self._together(weights)
        if self.stacked is None:
            return self._one_by_one(weights)
        first = dict(zip(self.outputs, self.session.run(self.outputs, {**self.feeds[0], **weights})))
        together = self._together(weights)
        self.checked = same([first], together[:1] if together is not None else None)
        if self.checked:
            return together
        self.stacked = None  # one by one from now on
        return [first] + [dict(zip(self.outputs, self.session.run(self.outputs, {**feed, **weights})))
                          for feed in self.feeds[1:]]
