"""What the ``int8`` pass keeps resident: the weight encodings as file pages, the float
weights' file pages only while a step reads them.

The resident set of a run over a model larger than memory splits in two (``docs/large-models.md``):
clean file pages (the weights mapped from the model's file, read again at no cost from the page
cache) and anonymous memory. Two things used to grow them with the model:

1. **The encodings.** ``plan.encodings`` (:mod:`onnxslim_kit.passes._quant.qdq`) holds every
   layer's integer weights from the first trial to the output: 0.25 × the float weights of heap
   (0.69 GB at 2.75 GB). :class:`ScratchEncodings` writes each array of at least
   :data:`MIN_BYTES` once to an unlinked scratch file (:class:`onnxslim_kit.streaming.ScratchArrays`)
   and keeps its read-only map instead: the same values (the trials, the twins and the output
   read the maps; ONNX Runtime reads them in place), as file pages, dropped after each step;
   after each layer's encoding is stored, the float weight it was made from can go too
   (``on_store``), so that encoding every layer never holds the whole model.
2. **The float weights' pages.** A pass over every weight (calibration, the first trial's
   encoding of every layer) leaves the whole model resident in the process; the next steps read
   only some of it. :func:`release` drops the pages of every file-mapped weight of a graph
   (``madvise(MADV_DONTNEED)``, :func:`onnxslim_kit.streaming.release_pages`): values unchanged,
   the next read maps them again.
"""

from __future__ import annotations

import numpy as np

from onnxslim_kit.streaming import ScratchArrays, release_pages

MIN_BYTES = 1 << 20  # encodings below this stay in memory (a page-aligned map each costs a page at least)


class ScratchEncodings(dict):
    """``plan.encodings`` whose large arrays (tuples of arrays, nested tuples too) are stored as
    read-only maps of a scratch file; :meth:`release` drops their resident pages."""

    def __init__(self, *args, on_store=None, **kwargs):
        super().__init__()
        self.scratch = ScratchArrays()
        self.on_store = on_store  # called after each store (the pass drops the float weights' pages there)
        self.update(dict(*args, **kwargs))

    def __setitem__(self, key, value):
        super().__setitem__(key, self._stored(value))
        if self.on_store is not None:
            self.on_store()

    def update(self, *args, **kwargs):
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def _stored(self, value):
        if isinstance(value, tuple):
            return tuple(self._stored(v) for v in value)
        if isinstance(value, np.ndarray) and not isinstance(value, np.memmap) and value.nbytes >= MIN_BYTES:
            return self.scratch.put(value)
        return value

    def release(self) -> None:
        self.scratch.release()


def file_map(values):
    """The ``np.memmap`` under ``values`` (itself, or the base of a view: ``np.asarray`` of a map,
    a transpose), or None."""
    while values is not None and not isinstance(values, np.memmap):
        values = getattr(values, "base", None)
    return values


def release(graph, plan=None) -> int:
    """Drop the resident pages of ``graph``'s file-mapped weights (and of a smoothed weight's
    source, and with ``plan`` its unsmoothed weights and encodings); returns how many maps."""
    count = 0
    for tensor in graph.tensors().values():
        values = getattr(tensor, "_values", None)
        count += release_pages(file_map(getattr(values, "rows", values)))  # a SmoothedWeight reads W from its rows
    if plan is not None:
        for spec in plan.layers:
            if spec.unsmoothed is not None:
                count += release_pages(file_map(spec.unsmoothed[1]))
        if isinstance(plan.encodings, ScratchEncodings):
            plan.encodings.release()
    return count
