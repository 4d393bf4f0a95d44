"""Rewrite a graph to a given float16 assignment, with one Cast per precision change.

Given the convertible slots (:mod:`onnxslim_kit.passes.fp16.plan`) and the set of nodes that run in float16:

* a float32 constant read only by float16 slots gets float16 values under its own name (a new
  array); one also read in float32 gets a float16 copy (``fp16/<name>``) for the float16 slots;
  converted constants with equal float16 values and shape are then read through one of them
  (exporters such as paddle2onnx write a scalar per use: 36 copies of one hard-swish constant
  on PP-OCR cls v2, 1.3 kB of the 305 kB float16 file);
* a float32 variable tensor takes the precision of its producer (graph inputs: float32 with
  ``keep_io``); readers that want the other precision read one shared ``Cast`` of it;
* a graph output keeps its name and the precision ``keep_io`` asks for: when its producer
  runs in the other precision, the producer writes a fresh tensor and a Cast writes the output.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from onnxslim_kit.passes.fp16.plan import F32, CastModel
from onnxslim_kit.passes._common.graph import consumers

F16 = np.dtype(np.float16)


def apply(model, infos: list, half: set, keep_io: bool, half_of=None) -> int:
    """Edit ``model.graph`` so the nodes ``infos[k]`` for k in ``half`` run in float16; returns Casts added.
    ``half_of(constant)``: the float16 values of a float32 weight (shared arrays; default: converted here)."""
    graph = model.graph
    cm = CastModel(graph, infos, keep_io)
    _convert_constants(model, infos, half, half_of or _to_half)
    tensors = dict(cm.tensors)
    if not keep_io:
        for t in list(graph.inputs) + list(graph.outputs):
            if t.dtype is not None and np.dtype(t.dtype) == F32:
                tensors[id(t)] = t
    casts = 0
    for tensor in tensors.values():
        casts += _settle(model, cm, tensor, half)
    return casts


def _to_half(constant: gs.Constant) -> np.ndarray:
    return np.asarray(constant.values).astype(np.float16)


def _convert_constants(model, infos: list, half: set, half_of) -> None:
    """Float16 values for constants read by float16 slots: in place of the float32 array (same
    name) when every reader is such a slot, else a float16 copy under a fresh name."""
    half_slots = {(id(infos[k].node), i) for k in half for i in infos[k].ins}
    copies, converted = {}, {}
    for k in half:
        node = infos[k].node
        for i in infos[k].ins:
            t = node.inputs[i]
            if not isinstance(t, gs.Constant) or np.dtype(t.dtype) != F32:
                continue
            readers = [(id(user), j) for user in consumers(t) for j, x in enumerate(user.inputs) if x is t]
            if all(slot in half_slots for slot in readers):
                t.values = half_of(t)  # a new array, not an in-place edit
                converted[id(t)] = t
                continue
            if id(t) not in copies:
                copies[id(t)] = gs.Constant(model.fresh_name(f"fp16/{t.name}"), half_of(t))  # shared, not copied
                converted[id(copies[id(t)])] = copies[id(t)]
            node.inputs[i] = copies[id(t)]
    _share_equal(model, list(converted.values()))


def _share_equal(model, constants: list) -> None:
    """Readers of converted float16 constants with equal shape and bytes read the first of them
    (main-graph readers only: a subgraph's own initializer is not visible elsewhere). Keyed by
    a digest of the bytes (no copy of them), equality checked on the arrays."""
    main = {id(n) for n in model.graph.nodes}
    first: dict = {}
    for c in constants:
        if not all(id(user) in main for user in consumers(c)):
            continue
        values = np.asarray(c.values)
        digest = hashlib.blake2b(memoryview(np.ascontiguousarray(values)).cast("B")).digest()
        group = first.setdefault((values.shape, values.dtype, digest), [])
        keep = next((k for k in group if np.array_equal(np.asarray(k.values), values)), None)
        if keep is None:
            group.append(c)
            continue
        for user in consumers(c):
            for j, x in enumerate(user.inputs):
                if x is c:
                    user.inputs[j] = keep


def _settle(model, cm: CastModel, tensor, half: set) -> int:
    """Give ``tensor`` its producer's precision; Cast for readers of the other one. Returns Casts added."""
    graph = model.graph
    p = cm.producer_half(tensor, half)
    readers = []
    for user in consumers(tensor):
        for i, t in enumerate(user.inputs):
            if t is tensor:
                k = cm.slot_of.get((id(user), i))
                readers.append((user, i, k is not None and k in half))
    is_output = id(tensor) in cm.graph_outputs
    is_input = id(tensor) in cm.graph_inputs
    want_out = (not cm.keep_io) if is_output else None
    if want_out is not None and want_out != p and not is_input and len(tensor.inputs) == 1:
        native = gs.Variable(model.fresh_name(f"fp16/{tensor.name}"), _dt(p), tensor.shape)
        producer = tensor.inputs[0]
        producer.outputs[next(j for j, t in enumerate(producer.outputs) if t is tensor)] = native
        tensor.dtype = _dt(want_out)
        graph.nodes.append(_cast(model, native, tensor, want_out))
        for user, i, precision in readers:
            if precision == p:
                user.inputs[i] = native
        return 1
    if tensor.dtype is not None or is_output or is_input:
        tensor.dtype = _dt(p)  # untyped intermediates stay untyped (no value_info to carry)
    others = [(user, i) for user, i, precision in readers if precision != p]
    if not others:
        return 0
    cast_out = gs.Variable(model.fresh_name("fp16/cast"), _dt(not p), tensor.shape)
    graph.nodes.append(_cast(model, tensor, cast_out, not p))
    for user, i in others:
        user.inputs[i] = cast_out
    return 1


def _dt(half: bool) -> np.dtype:
    return F16 if half else F32


def _cast(model, src, dst, to_half: bool) -> gs.Node:
    to = onnx.TensorProto.FLOAT16 if to_half else onnx.TensorProto.FLOAT
    return gs.Node("Cast", model.fresh_name("fp16/Cast"), {"to": to}, [src], [dst])


def emulate(model, infos: list, half: set, keep_io: bool, half_of=None) -> None:
    """Float32 graph that rounds like the float16 one: weights of float16 slots read as
    Cast(fp16(W) → float) (``half_of(constant)``: the float16 values, shared arrays; the Cast
    runs in the session, so no float32 copy of the rounded weights is ever stored), every
    float16 output (and, without ``keep_io``, every float input) passed through
    Cast(float16) → Cast(float32).

    ONNX Runtime's CPU provider computes float16 ops that lack a float16 kernel in float32
    *without* rounding between them, so the real float16 model measured on CPU hides drift a
    float16 device would show; the drift search measures this emulation instead.
    """
    graph = model.graph
    half_of = half_of or _to_half
    rounded = {}
    for k in half:
        node = infos[k].node
        for i in infos[k].ins:
            t = node.inputs[i]
            if isinstance(t, gs.Constant) and np.dtype(t.dtype) == F32:
                if id(t) not in rounded:
                    stored = gs.Constant(model.fresh_name(f"fp16/{t.name}"), half_of(t))  # shared, not copied
                    rounded[id(t)] = gs.Variable(model.fresh_name(f"fp16/{t.name}_f32"), F32, t.shape)
                    graph.nodes.append(_cast(model, stored, rounded[id(t)], False))
                node.inputs[i] = rounded[id(t)]
        for i in infos[k].outs:
            t = node.outputs[i]
            raw = gs.Variable(model.fresh_name("fp16/raw"), F32, t.shape)
            node.outputs[i] = raw
            _round_trip(model, raw, t)
    if not keep_io:
        for t in list(graph.inputs):
            if t.dtype is not None and np.dtype(t.dtype) == F32:
                rounded_in = gs.Variable(model.fresh_name("fp16/in"), F32, t.shape)
                for user in consumers(t):
                    for i, x in enumerate(user.inputs):
                        if x is t:
                            user.inputs[i] = rounded_in
                _round_trip(model, t, rounded_in)


def _round_trip(model, src, dst) -> None:
    mid = gs.Variable(model.fresh_name("fp16/half"), F16, src.shape)
    model.graph.nodes.append(_cast(model, src, mid, True))
    model.graph.nodes.append(_cast(model, mid, dst, False))
