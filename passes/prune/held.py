"""Where a pruned candidate's weights live: a scratch file, not the heap; read pages dropped.

A candidate (a search trial, or the model ``prune(ratio=…)`` cuts) gets new weights — the cut
sources and consumers, then the re-fitted consumers — about as many bytes as the weights it
keeps (0.5–1 × the model). Held as heap arrays, the kept candidate's and the one being judged
sit beside the original's weights: on the 2.75 GB decoder that was 2–3 × the model at once. Here:

* :func:`spill_to_scratch` gives a model a :class:`onnxslim_kit.streaming.ScratchArrays` (an
  unlinked temporary file); from then on every new constant of ``SPILL_BYTES`` or more that the
  pass makes for it (:func:`constant`, used by :func:`onnxslim_kit.passes.prune.apply.set_input`)
  is written there and held as a read-only map of it — file pages, resident only while read;
* :func:`release` drops the resident pages of every file map a model's constants hold — the
  scratch maps and the maps of the original's weights left on disk
  (:class:`onnxslim_kit.streaming.MappedValues`), which stay resident once read (the cut reads
  every weight it slices) and would be counted a second time beside an ONNX Runtime session's
  own map of the same file. Called after each session a candidate runs and before each trial:
  between runs the process holds no weight pages; during one, what that session reads.

The values are the same bytes either way; ONNX Runtime sessions read the maps in place
(:meth:`onnxslim_kit.model.Model.session_proto`). A map stays valid after its file object is
closed (the mapping holds the file), so the kept candidate's weights outlive its trial.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.streaming import ScratchArrays, release_pages

from onnxslim_kit.passes._common.graph import new_constant

SPILL_BYTES = 1 << 20
_SCRATCH = "_prune_scratch"


def spill_to_scratch(model) -> None:
    """From now on, the large constants made for ``model`` go to a scratch file (module docstring)."""
    if getattr(model, _SCRATCH, None) is None:
        setattr(model, _SCRATCH, ScratchArrays())


def constant(model, base: str, values: np.ndarray) -> gs.Constant:
    """A new constant named after ``base`` holding ``values`` — a map of the model's scratch
    file when it has one and ``values`` is a numeric array of ``SPILL_BYTES`` or more, a copy
    in memory otherwise."""
    scratch = getattr(model, _SCRATCH, None)
    values = np.asarray(values)
    if scratch is None or values.nbytes < SPILL_BYTES or values.dtype.kind not in "fiub":
        return new_constant(model, base, values)
    return gs.Constant(model.fresh_name(base), scratch.put(values))


def release_constant(tensor) -> None:
    """Drop the resident pages of ``tensor``'s values when they are a read-only file map."""
    release_pages(getattr(tensor, "_values", None))


def release(model) -> None:
    """:func:`release_constant` for every constant of ``model``'s graphs."""
    for graph in model.all_graphs():
        for tensor in graph.tensors().values():
            if isinstance(tensor, gs.Constant):
                release_constant(tensor)
