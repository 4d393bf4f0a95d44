"""The ``int8`` pass's calibration in groups of tensors, at most :data:`CALIB_RUN_BYTES` a run.

One calibration run returns every tensor the pass calibrates (each layer's inputs and output,
Concat inputs, pool inputs) at once, and ONNX Runtime holds them all until the run returns —
fetching a subset of one session's outputs does not lower that (picodet_layout's Conv outputs:
171 MB fetched at once, 198 MB peak in four fetches). On detectors at 640 × 640 that run was the
pass's peak (``benchmarks/trace_int8_memory.py``, 32 samples: yolov8n_doclaynet 966 MB in the
calibration run, ≤ 764 MB in every other step; picodet_layout 727 MB against ≤ 480 MB).

So when the tensors' float32 bytes at the first sample's input shapes add up to more than
:data:`CALIB_RUN_BYTES`, they are cut, in graph order, into groups of at most that many bytes;
each group gets a session of its own (cut to the nodes its tensors depend on) and a pass over
the samples. Every tensor still sees the samples in the same order, computed by the same nodes,
so the statistics are the same numbers; the price is up to one more model run per sample and
group. Sizes: ONNX shape inference at the sample's shapes (no run); a tensor it leaves unknown
counts as the largest known one. Above :data:`EXPORT_MAX_BYTES` of weights, the graph's own
shapes, symbolic dims read from the sample (exporting the model for inference touches every
weight page and copies the graph; a decoder's activations at calibration length are small
beside its weights).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

CALIB_RUN_BYTES = 128 << 20  # float32 activations one calibration run may return at once
EXPORT_MAX_BYTES = 256 << 20  # weights above which sizes come from the graph's own shapes


def calibration_groups(model, names: list, sample: dict) -> list:
    """``names`` as one list when they fit in :data:`CALIB_RUN_BYTES`, else in groups (module docstring)."""
    sizes = tensor_bytes(model, names, sample)
    if sum(sizes.values()) <= CALIB_RUN_BYTES:
        return [list(names)]
    made = {out.name: i for i, node in enumerate(model.graph.nodes) for out in node.outputs}
    groups, current, held = [], [], 0
    for name in sorted(names, key=lambda n: made.get(n, -1)):
        if current and held + sizes[name] > CALIB_RUN_BYTES:
            groups.append(current)
            current, held = [], 0
        current.append(name)
        held += sizes[name]
    return groups + [current]


def tensor_bytes(model, names: list, sample: dict) -> dict:
    """``{name: float32 bytes}`` at ``sample``'s input shapes (module docstring)."""
    from onnxslim_kit.passes.int8.layer_speed import sample_shapes

    weights = sum(int(np.prod(t.shape)) * np.dtype(t.dtype).itemsize for t in model.graph.tensors().values()
                  if isinstance(t, gs.Constant) and t.shape is not None)
    shapes = sample_shapes(model, sample, weights > EXPORT_MAX_BYTES, measure=False)
    known = {n: 4 * int(np.prod(shapes[n])) for n in names if n in shapes}
    fill = max(known.values(), default=0)
    return {n: known.get(n, fill) for n in names}


def group_activations(model, groups: list, samples, threads: int = 0):
    """Each sample's activations of each group, one dict per (sample, group), sample by sample.

    One group: one session, as :func:`.fallback.activations`. More: the graph is cut into
    *segments* at the last node each group needs, in graph order; segment ``g``'s session takes
    the tensors it reads from earlier segments as inputs and returns its group's tensors plus
    those later segments read — so a sample runs every node once, not once per group (a
    group's session re-ran everything before it: yolov8n_doclaynet at 1024², three groups,
    72 + 121 + 203 ms a sample against 203 for the whole model). ORT holds one segment's
    outputs at a time; the tensors carried to later segments are dropped when no later one
    reads them. Sessions run node by node (``opt_level=disable``), so each tensor has the
    values the whole graph gives it. A graph with subgraphs (whose bodies may read outer
    tensors) or non-tensor values (a sequence crossing a cut has no tensor type to declare)
    keeps one session per group."""
    from onnxslim_kit.passes.int8.fallback import SharedWeights, activations, run

    if len(groups) == 1 or getattr(model, "value_types", None) or any(
            isinstance(v, gs.Graph) for node in model.graph.nodes for v in node.attrs.values()):
        for group in groups:
            yield from activations(model, group, samples, threads=threads)
        return
    segments = _segments(model, groups)
    sessions, shared = [None] * len(segments), SharedWeights(model.graph)  # the weights' OrtValues, made once
    for sample in samples:
        live = dict(sample)
        for g, segment in enumerate(segments):
            if segment.outputs and sessions[g] is None:
                sessions[g] = _segment_session(model, shared, segment, live, threads)
            if segment.outputs:  # (no name holds the run's dict: its tensors go when ``live`` drops them)
                live.update(run(sessions[g], {n: live[n] for n in segment.inputs}))
            yield {n: live[n] for n in groups[g]}
            for name in segment.done:
                live.pop(name, None)


class _Segment:
    """The nodes after the last segment's, up to the last one its group needs: ``inputs`` read
    from earlier segments or the graph's inputs, ``outputs`` its group's tensors made here and
    those later segments read, ``done`` the tensors no later segment reads or returns."""

    def __init__(self):
        self.inputs, self.outputs, self.done = [], [], []


def _segments(model, groups: list) -> list:
    nodes = model.graph.nodes
    made = {out.name: i for i, node in enumerate(nodes) for out in node.outputs}
    ends = [max((made.get(n, -1) for n in group), default=-1) for group in groups]
    for g in range(1, len(ends)):
        ends[g] = max(ends[g], ends[g - 1])
    wanted_by = {n: g for g, group in enumerate(groups) for n in group}
    segments, start = [], 0
    for g, end in enumerate(ends):
        segment = _Segment()
        inside = nodes[start:end + 1]
        segment.inputs = sorted({n for n in _reads(inside) if made.get(n, -1) < start})
        later = set(_reads(nodes[end + 1:])) | {n for n, h in wanted_by.items() if h > g}
        segment.outputs = sorted(o.name for node in inside for o in node.outputs
                                 if wanted_by.get(o.name) == g or o.name in later)
        segment.done = [n for n in segment.inputs + segment.outputs + groups[g] if n not in later]
        segments.append(segment)
        start = end + 1
    return segments


def _reads(nodes) -> list:
    """The names of the variable tensors ``nodes`` read."""
    return [t.name for node in nodes for t in node.inputs if isinstance(t, gs.Variable) and t.name]


def _segment_session(model, shared, segment: _Segment, live: dict, threads: int):
    """A session of the segment's nodes on ``shared``'s weights (:class:`.fallback.SharedWeights`),
    its inputs typed by the arrays ``live`` holds."""
    from onnxslim_kit.passes.int8.fallback import trial_copy
    from onnxslim_kit.runtime import add_outputs

    trial = trial_copy(model)
    tensors = trial.graph.tensors()
    for name in segment.inputs:
        tensor = tensors[name]
        tensor.inputs.clear()  # made by an earlier segment: an input here
        tensor.dtype, tensor.shape = np.asarray(live[name]).dtype, None
    trial.graph.inputs = [tensors[n] for n in segment.inputs]
    trial.graph.outputs = [tensors[n] for n in segment.outputs]
    trial.graph.cleanup(remove_unused_graph_inputs=False)
    shared.strip(trial.graph)
    proto = trial.to_proto()
    add_outputs(proto, segment.outputs)
    return shared.session(proto, prepack=False, threads=threads)

