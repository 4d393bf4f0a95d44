"""Output views found from the graph: what each output's fidelity is judged on.

A whole-output cosine sees only the largest numbers in it: a YOLOv8 head ``[1, 4+C, N]``
concatenates box coordinates (hundreds) with sigmoid class scores (0…1), so the scores can
lose their detections while the output's cosine reads 0.9995. The views:

1. **branches** — an output that is a ``Concat`` (possibly nested, behind ``Transpose``,
   ``Reshape``, ``Flatten``, ``Squeeze``, ``Unsqueeze``, ``Identity``, ``Cast``: the *layout
   tail*) of *leaves* of different kinds is split by kind, each part its own view on its own
   scale. A leaf's kind is that of the first op behind it that is not a slicing or layout op
   (``Split``, ``Slice``, ``Gather`` and the tail's ops are looked through): ``Sigmoid`` /
   ``HardSigmoid`` → ``scores``, ``Softmax`` / ``LogSoftmax`` → ``probs``, anything else →
   ``values`` (box regression: ``(σ·2 − 0.5 + grid)·stride`` is values, not scores).
2. **decisions** — beside the cosine of a ``scores`` part, the set of its elements above
   :data:`SCORE_THRESHOLD` (a detector's confidence cut); of a ``probs`` part (``Softmax``),
   the arg-max over the softmax axis, for every position of the other axes.
   An output *named* ``logits`` (or ``…logits``: :func:`names_logits`; Hugging Face's exports
   of classification, token-classification, question-answering, CTC and language-model heads,
   with no Softmax or Sigmoid behind it) is a ``probs`` view of raw logits: the arg-max over its last
   axis, per position of the others (masked like a leaf), margins read from the logits as they
   are. Without it a classifier exported without its Softmax was judged by its cosine alone.
   **CTC sequences** — such a ``logits`` output without a token mask, an unnamed output
   that a ``Gemm`` / ``MatMul`` with a constant weight (+ constant bias) projects to classes
   (ddddocr's ``[T, 1, 8210]``, named ``387``), and a 3-D ``Softmax`` output over its last axis
   without a token mask (PP-OCRv4 rec's ``[N, T, 6625]``) may be a recognizer's frames: where the
   original's outputs read as CTC (3-D, one class — the blank — winning most steps), the
   decision is each sequence's greedy-decoded string (:mod:`.strings`); elsewhere they are
   judged as before (arg-max rows for ``logits`` and Softmax outputs, values for the unnamed ones),
   except that an unnamed projection ``[N, C]`` whose rows read as a classifier's raw logits
   (a peaked softmax: :func:`.margins.reads_as_logits`) is judged as a ``logits`` output is — a
   torchvision-style classifier exported without its Softmax; regression heads stay values.
3. **exact** — integer and boolean outputs (``ArgMax``, ``TopK`` indices, masks) must agree
   element by element.
4. **padding masked** — an output whose first two axes are a graph input's that is an integer
   or boolean ``[batch, sequence]`` tensor named ``*mask*`` (a transformer's
   ``attention_mask``) is judged on the positions that input marks (non-zero) only. Padded
   positions are computed and then dropped by every consumer (mean pooling, a token head
   reading real tokens): on all-MiniLM-L6-v2 with sentences padded to 32 tokens, 19 of 32
   positions are padding on average, and dynamic int8 moved them so far that the
   ``token_embeddings`` cosine read 0.81 while the real tokens' was 0.987. The axes match by
   their symbolic names (``batch``, ``sequence``) or, for fixed shapes, by size (a sequence of
   more than one); each sample's mask must have the output's leading shape, else the whole
   output is judged.

Which element of an output came from which leaf, and which softmax row and class it is, is
found by sending *label arrays* through the tail: each leaf replaced by an integer array of its
shape (its branch, its row, its class index), the tail's layout ops applied to those in numpy.
That needs the leaves' shapes (and any shape input the tail computes at run time): they are read
once per input shape from one run of the original (:meth:`Views.labels`, ``runner``), and only
for outputs whose tail is not empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

SCORE_THRESHOLD = 0.25  # a sigmoid score above it is a decision (YOLO's default confidence)
LAYOUT_OPS = {"Identity", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat"}
LOOK_THROUGH = {"Identity", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Split", "Slice",
                "Gather"}
KIND_OF_OP = {"Sigmoid": "scores", "HardSigmoid": "scores", "Softmax": "probs", "LogSoftmax": "probs"}


def _integer_type(elem_type: int) -> bool:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).kind in "iub"
    except Exception:  # noqa: BLE001 - undefined / string / float8 types
        return False


@dataclass(frozen=True)
class View:
    """One view of one output. ``kind``: ``values`` (cosine / relative error), ``scores``
    (values + the set above the threshold), ``probs`` (values + the arg-max per softmax row),
    ``exact`` (element-wise equality). ``branch``: the leaf kind this view keeps of a split
    output (None: the whole output)."""

    output: str
    kind: str
    branch: str | None = None
    axis: int | None = None  # probs without a tail: the softmax axis of the output itself
    mask: str | None = None  # the [batch, sequence] mask input whose marked positions are judged
    logits: bool = False  # probs: raw logits (named so), arg-max over the last axis, margins as they are
    ctc: bool = False  # may be CTC sequences: judged by decoded strings where the data say so (:mod:`.strings`)

    @property
    def name(self) -> str:
        return f"{self.output}[{self.branch}]" if self.branch else self.output

    @property
    def decides(self) -> bool:
        return self.kind in ("scores", "probs", "exact") or self.ctc


@dataclass
class _Tail:
    """The layout ops between an output and its leaves (topological order) and the leaves."""

    nodes: list
    leaves: list  # (tensor name, kind, softmax axis or None, softmax coerces to 2-D (opset < 13))
    needs: list = field(default_factory=list)  # run-time tensors the tail's shape inputs read


class Views:
    """The views of a model's outputs (:func:`find_views`) and their label masks."""

    def __init__(self, views: list, tails: dict, constants: dict):
        self.views = views
        self._tails = tails  # output → _Tail (only outputs with a non-empty tail)
        self._constants = constants
        self._cache = {}

    def __iter__(self):
        return iter(self.views)

    def __len__(self) -> int:
        return len(self.views)

    @property
    def runtime_tensors(self) -> list:
        """Tensors of the original a run must return to label the tails (empty: none needed)."""
        names = []
        for tail in self._tails.values():
            names += [leaf[0] for leaf in tail.leaves if leaf[0] not in self._constants] + tail.needs
        names += [view.mask for view in self.views if view.mask]  # graph inputs: ORT passes them through
        return list(dict.fromkeys(names))

    def labels(self, output: str, values: dict) -> dict | None:
        """``{"branch": …, "row": …, "cls": …}`` integer arrays of the output's shape, from the
        run-time tensors ``values`` (name → array); None when the output has no tail."""
        tail = self._tails.get(output)
        if tail is None:
            return None
        values = {**{n: numpy_helper.to_array(self._constants[n]) for n, *_ in tail.leaves if n in self._constants},
                  **values}
        key = (output,) + tuple(tuple(np.shape(values[name])) for name in
                                [leaf[0] for leaf in tail.leaves]) + tuple(
            tuple(np.asarray(values[n]).ravel().tolist()) for n in tail.needs)
        if key not in self._cache:
            self._cache[key] = _trace(tail, values, self._constants)
        return self._cache[key]


def find_views(proto: onnx.ModelProto) -> Views:
    """The views of every graph output (see the module docstring)."""
    graph = proto.graph
    producers = {out: node for node in graph.node for out in node.output}
    constants = _constants(graph)
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    masks = _sequence_masks(graph)
    views, tails = [], {}
    for out in graph.output:
        if not out.type.HasField("tensor_type"):
            continue  # sequences, maps, optionals: judged by the verifier's own rules
        found, tail = _output_views(out, producers, constants, opset, masks.get(_leading_axes(out)))
        views += found
        if tail is not None:
            tails[out.name] = tail
    return Views(views, tails, constants)


def _output_views(out, producers: dict, constants: dict, opset: int, mask: str | None) -> tuple:
    """``(views, tail)`` of one tensor output; the tail only where labels are needed (branches,
    or softmax rows behind layout ops)."""
    if _integer_type(out.type.tensor_type.elem_type):
        return [View(out.name, "exact", mask=mask)], None
    logits = _logits_view(out, producers, constants, mask)
    if logits is not None:
        return [logits], None
    tail = _tail(out.name, producers, constants, opset)
    kinds = list(dict.fromkeys(kind for _, kind, _, _ in tail.leaves))
    if mask is None and kinds == ["values"] and len(tail.leaves) == 1 and _projected(
            tail.leaves[0][0], producers, constants):
        return [View(out.name, "values", ctc=True)], None  # a projection to classes: CTC where the data say so
    if not tail.nodes:  # the output is a leaf itself
        kind, axis = tail.leaves[0][1], tail.leaves[0][2]
        rank = len(out.type.tensor_type.shape.dim)
        if kind == "probs" and (axis is None or rank < 3 or axis % rank != rank - 1):
            mask = None  # a softmax over the masked axes, or not the last one: rows need every position
        ctc = kind == "probs" and rank == 3 and axis is not None and axis % rank == 2 and mask is None
        return [View(out.name, kind, axis=axis if kind == "probs" else None, mask=mask, ctc=ctc)], None
    if len(kinds) > 1:
        return [View(out.name, kind, branch=kind) for kind in kinds], tail
    # one kind behind layout ops: masked as a leaf would be (a softmax's rows need labels)
    return [View(out.name, kinds[0], mask=mask if kinds[0] != "probs" else None)], (
        tail if kinds[0] == "probs" else None)


def names_logits(name: str) -> bool:
    """Whether an output's name says it holds a classifier's raw logits: ``logits``, or ending
    so (``start_logits``, ``end_logits``), any case — the names Hugging Face exports give every
    classification, token-classification, question-answering, CTC and language-model head."""
    return name.lower().endswith("logits")


def _logits_view(out, producers: dict, constants: dict, mask: str | None) -> View | None:
    """The raw-logits view of an output :func:`names_logits` names (no Softmax or Sigmoid
    behind it, rank ≥ 1), else None; masked only when the classes are a third axis or later."""
    rank = len(out.type.tensor_type.shape.dim) if out.type.tensor_type.HasField("shape") else 0
    if not names_logits(out.name) or rank < 1 or _leaf_kind(out.name, producers, constants) != "values":
        return None
    mask = mask if rank >= 3 else None
    return View(out.name, "probs", axis=-1, mask=mask, logits=True, ctc=mask is None)


def _projected(name: str, producers: dict, constants: dict) -> bool:
    """Whether ``name`` is a projection to classes: a ``Gemm`` or ``MatMul`` with a constant
    weight, or such a one plus a constant bias."""
    node = producers.get(name)
    if node is not None and node.op_type == "Add" and len(node.input) == 2:
        rest = [i for i in node.input if i not in constants]
        node = producers.get(rest[0]) if len(rest) == 1 else None
    return node is not None and node.op_type in ("Gemm", "MatMul") and len(node.input) >= 2 and (
        node.input[1] in constants)


def _dim_key(dim):
    """A dimension's identity for matching: its symbolic name, or its size when fixed (None:
    unknown)."""
    if dim.HasField("dim_param") and dim.dim_param:
        return dim.dim_param
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return dim.dim_value
    return None


def _leading_axes(value_info) -> tuple | None:
    """The first two axes of a tensor (as :func:`_dim_key`), or None when unknown or rank < 2."""
    if not value_info.type.HasField("tensor_type") or not value_info.type.tensor_type.HasField("shape"):
        return None
    dims = value_info.type.tensor_type.shape.dim
    if len(dims) < 2:
        return None
    key = (_dim_key(dims[0]), _dim_key(dims[1]))
    return key if None not in key else None


def _sequence_masks(graph) -> dict:
    """``{(batch axis, sequence axis): input name}`` of the integer / boolean rank-2 graph inputs
    named ``*mask*`` (the first one per axis pair; a fixed sequence of length 1 matches nothing)."""
    found = {}
    initializers = {init.name for init in graph.initializer}
    for inp in graph.input:
        if inp.name in initializers or "mask" not in inp.name.lower():
            continue
        if not inp.type.HasField("tensor_type") or not _integer_type(inp.type.tensor_type.elem_type):
            continue
        key = _leading_axes(inp)
        if key is None or len(inp.type.tensor_type.shape.dim) != 2 or key[1] == 1:
            continue
        found.setdefault(key, inp.name)
    return found


def _constants(graph) -> dict:
    found = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = node.attribute[0].t
    return found


def _leaf_kind(name: str, producers: dict, constants: dict) -> str:
    seen = 0
    while name in producers and seen < 64:
        node = producers[name]
        if node.op_type in KIND_OF_OP:
            return KIND_OF_OP[node.op_type]
        if node.op_type not in LOOK_THROUGH or not node.input:
            return "values"
        name, seen = node.input[0], seen + 1
    return "values"


def _softmax_axis(node, opset: int) -> tuple:
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1 if opset >= 13 else 1)
    return axis, opset < 13


def _tail(output: str, producers: dict, constants: dict, opset: int) -> _Tail:
    """Walk back from ``output`` through layout ops; the first other tensors are leaves."""
    nodes, leaves, needs, stack, seen = [], [], [], [output], set()
    while stack:
        name = stack.pop()
        node = producers.get(name)
        if node is None or node.op_type not in LAYOUT_OPS or name in seen or name in constants:
            if name in seen:
                continue
            seen.add(name)
            kind, axis, coerce = _leaf_kind(name, producers, constants), None, False
            if kind == "probs" and node is not None and node.op_type in ("Softmax", "LogSoftmax"):
                axis, coerce = _softmax_axis(node, opset)
            elif kind == "probs":  # a slice of a softmax: its rows are not known here
                kind = "values"
            leaves.append((name, kind, axis, coerce))
            continue
        seen.add(name)
        nodes.append(node)
        data = list(node.input) if node.op_type == "Concat" else [node.input[0]]
        stack.extend(reversed(data))
        needs += [n for n in node.input[1:] if node.op_type != "Concat" and n and n not in constants]
    nodes.reverse()  # producers before consumers
    return _Tail(_toposort(nodes), leaves, list(dict.fromkeys(needs)))


def _toposort(nodes: list) -> list:
    made = {out for node in nodes for out in node.output}
    done, order, pending = set(), [], list(nodes)
    while pending:
        ready = [n for n in pending if all(i not in made or i in done for i in n.input)]
        if not ready:  # a cycle cannot happen in a valid graph; keep the order given
            return order + pending
        for node in ready:
            order.append(node)
            done.update(node.output)
            pending.remove(node)
    return order


# --- label arrays through the tail --------------------------------------------------------

def _leaf_labels(shape: tuple, branch: int, axis, coerce: bool, row_offset: int) -> dict:
    size = int(np.prod(shape, dtype=np.int64))
    index = np.arange(size, dtype=np.int64).reshape(shape)
    rank = len(shape)
    if axis is None or rank == 0:
        rows, cls = index + row_offset, np.zeros(shape, np.int64)
    else:
        axis = axis % rank
        if coerce:  # opset < 13: one distribution over every axis from `axis` on
            inner = int(np.prod(shape[axis:], dtype=np.int64))
            rows, cls = index // max(inner, 1) + row_offset, index % max(inner, 1)
        else:
            cls = np.indices(shape, dtype=np.int64)[axis] if size else np.zeros(shape, np.int64)
            rows = (index - cls * int(np.prod(shape[axis + 1:], dtype=np.int64))) + row_offset
    return {"branch": np.full(shape, branch, np.int64), "row": rows, "cls": cls}


def _trace(tail: _Tail, values: dict, constants: dict) -> dict:
    env, offset, kinds = {}, 0, []
    for name, kind, axis, coerce in tail.leaves:
        if kind not in kinds:
            kinds.append(kind)
        shape = tuple(np.shape(values[name]))
        env[name] = _leaf_labels(shape, kinds.index(kind), axis, coerce, offset)
        offset += int(np.prod(shape, dtype=np.int64))
    known = {n: numpy_helper.to_array(t) for n, t in constants.items()}
    known.update({n: np.asarray(values[n]) for n in tail.needs})
    out = None
    for node in tail.nodes:
        out = {key: _apply(node, [env[node.input[0]][key]] if node.op_type != "Concat" else
                           [env[i][key] for i in node.input], known) for key in ("branch", "row", "cls")}
        env[node.output[0]] = out
    labels = dict(out)
    labels["kinds"] = kinds
    return labels


def _attr(node, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _axes(node, known: dict):
    axes = _attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = known[node.input[1]].tolist()
    return None if axes is None else [int(a) for a in axes]


def _apply(node, arrays: list, known: dict) -> np.ndarray:
    x, op = arrays[0], node.op_type
    if op in ("Identity", "Cast"):
        return x
    if op == "Concat":
        return np.concatenate(arrays, axis=int(_attr(node, "axis", 0)))
    if op == "Transpose":
        perm = _attr(node, "perm")
        return np.transpose(x, perm if perm is not None else None)
    if op == "Flatten":
        axis = int(_attr(node, "axis", 1)) % max(x.ndim, 1) if x.ndim else 0
        return x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    if op == "Squeeze":
        axes = _axes(node, known)
        return np.squeeze(x, axis=tuple(axes) if axes is not None else None)
    if op == "Unsqueeze":
        axes = sorted(a % (x.ndim + len(_axes(node, known))) for a in _axes(node, known))
        for a in axes:
            x = np.expand_dims(x, a)
        return x
    # Reshape
    shape = [int(d) for d in known[node.input[1]].ravel()]
    if not _attr(node, "allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)
