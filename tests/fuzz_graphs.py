"""Random valid ONNX graphs for property-based tests of the lossless passes (hypothesis).

A graph is a DAG grown op by op from one input (rank 2, 3 or 4, float32 or float16, small
static shapes): each step draws an op family of those ``fuse`` rewrites, one or two existing
tensors to read, and the op's constants; every tensor's shape is tracked here, so every op is
built valid for the shape it reads. Families: Conv (groups, pads, strides, bias, all-zero
filters for ``prune``'s strip), BatchNormalization, Gemm (transB, alpha/beta, bias of shape
[K], [1,K] or [], bias and weight one tensor), MatMul, Add/Mul/Sub/Div with constants of
broadcastable shapes (either side; Div only by a constant away from 0), elementwise pairs of
tensors, Relu, Clip, PRelu, LeakyRelu, HardSigmoid, HardSwish, Sigmoid, Transpose, Reshape
(0 and -1 targets), Flatten, Identity, Dropout, Cast (float32 ↔ float16, and to its own type),
Pad, Slice, Concat, Squeeze/Unsqueeze (attribute before opset 13, input after), shape
arithmetic (``Reshape(x, Concat(Slice(Shape(x)), [-1]))``, Gather of a Shape), producer →
elementwise → consumer chains with all-zero filters (what the strip removes), with constants
as initializers or Constant nodes, shared between nodes, duplicated under another name, and
graph outputs in the middle; opsets 11–21 at their minimal IR version.

The property (:func:`check_lossless`): the optimized model passes the full checker, keeps the
output names, dtypes and shapes, and under ONNX Runtime (optimisations off) matches the
original on random inputs within the pipeline's lossless rule ``max|a−b| ≤ 1e-6 + 1e-4·max|a|``
per output (a graph computing in float16 anywhere: 4 float16 steps at the output's scale,
``4·spacing(float16(max|a|))``); the input proto is not
modified. With verification on, a lossless pass on a valid graph must not be rolled back.
A failure's message holds the graph as ONNX text (``onnx.printer.to_text``).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

ort.set_default_logger_severity(3)  # generated graphs keep dead constants on purpose: no warnings

PASS_LISTS = ("fuse", "fuse,compact", "prune(target=none)")  # prune's lossless strip
F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
ONNX_TYPE = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16}
MAX_ELEMENTS = 400


class Graph:
    """A graph under construction: nodes, initializers, and the tracked shape of every tensor."""

    def __init__(self, opset: int, rng: np.random.Generator):
        self.opset, self.rng = opset, rng
        self.nodes, self.inits, self.inputs = [], [], []
        self.tensors = {}  # float tensors: name -> (shape, dtype)
        self.consts = {}  # (shape, dtype, positive) -> [names of float constants]
        self.count = 0
        self.force_zero = self.no_pad = False  # set by channel_chain

    def name(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def node(self, op: str, inputs: list, n_out: int = 1, **attrs) -> list:
        outs = [self.name(op.lower()[:4]) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name("n"), **attrs))
        return outs

    def add(self, op: str, inputs: list, shape, dtype, **attrs) -> str:
        out = self.node(op, inputs, **attrs)[0]
        self.tensors[out] = (tuple(int(d) for d in shape), np.dtype(dtype))
        return out

    def ints(self, values, as_node: bool = False) -> str:
        arr = np.asarray(values, dtype=np.int64)
        return self._emit(arr, "i", as_node)

    def _emit(self, arr, prefix: str, as_node: bool) -> str:
        if as_node:
            return self.node("Constant", [], value=numpy_helper.from_array(arr, self.name("v")))[0]
        name = self.name(prefix)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def const(self, draw, shape, dtype, positive=False, zero_rows=0) -> str:
        """A float constant: new (initializer or Constant node), shared, or a duplicate of one."""
        key = (tuple(shape), np.dtype(dtype), positive)
        how = draw(st.sampled_from(["init", "node", "share", "dup"]))
        existing = self.consts.get(key) if not zero_rows else None
        if how in ("share", "dup") and existing:
            name, arr = existing[draw(st.integers(0, len(existing) - 1))]
            if how == "share":
                return name
        else:
            values = self.rng.uniform(0.5, 1.5, size=shape)
            if not positive:
                values *= self.rng.choice([-1.0, 1.0], size=shape)
            if zero_rows and len(shape):
                values[self.rng.permutation(shape[0])[:zero_rows]] = 0.0
            arr = np.asarray(values, dtype=dtype)
        name = self._emit(arr.copy(), "c", how == "node")
        if not zero_rows:  # a weight with zero filters is never shared as, say, a divisor
            self.consts.setdefault(key, []).append((name, arr))
        return name


# --- op families: each draws what it needs and returns the new tensor, or None (does not apply)


def unary(draw, g, x):
    shape, dtype = g.tensors[x]
    ops = ["Relu", "Clip", "LeakyRelu", "HardSigmoid", "Sigmoid", "Identity", "Dropout"]
    ops += ["HardSwish"] if g.opset >= 14 else []
    op = draw(st.sampled_from(ops))
    if op == "Clip":
        lo, hi = sorted(g.rng.uniform(-1.5, 1.5, size=2))
        mode = draw(st.sampled_from(["both", "min", "max", "none"]))
        inputs = [x, g._emit(np.asarray(lo, dtype), "c", False) if mode in ("both", "min") else ""]
        inputs += [g._emit(np.asarray(hi, dtype), "c", draw(st.booleans()))] if mode in ("both", "max") else []
        return g.add("Clip", inputs if mode != "none" else [x], shape, dtype)
    attrs = {}
    if op == "LeakyRelu":
        attrs["alpha"] = draw(st.sampled_from([0.01, 0.1, 0.2]))
    if op == "HardSigmoid":
        attrs.update(alpha=draw(st.sampled_from([0.2, 1 / 6])), beta=0.5)
    return g.add(op, [x], shape, dtype, **attrs)


def broadcast_shape(draw, shape):
    """A constant shape that broadcasts against ``shape`` without changing it."""
    r = len(shape)
    options = [(), (1,), (shape[-1],), tuple(shape), (1,) * r]
    if r >= 2:
        options += [(shape[-2], shape[-1]), (shape[1],) + (1,) * (r - 2)]
    if r == 4:
        options += [(1, shape[1], 1, 1)]
    return draw(st.sampled_from(options))


def binary_const(draw, g, x):
    shape, dtype = g.tensors[x]
    op = draw(st.sampled_from(["Add", "Mul", "Sub", "Div"]))
    c = g.const(draw, broadcast_shape(draw, shape), dtype)
    first = op != "Div" and draw(st.booleans())
    return g.add(op, [c, x] if first else [x, c], shape, dtype)


def binary_pair(draw, g, x):
    shape, dtype = g.tensors[x]
    same = [t for t, v in g.tensors.items() if v == (shape, dtype)]
    y = same[draw(st.integers(0, len(same) - 1))]
    op = draw(st.sampled_from(["Add", "Mul", "Sub"]))
    return g.add(op, [x, y], shape, dtype)


def prelu(draw, g, x):
    shape, dtype = g.tensors[x]
    options = [(1,), (shape[-1],)] + ([(shape[1],) + (1,) * (len(shape) - 2)] if len(shape) >= 3 else [])
    return g.add("PRelu", [x, g.const(draw, draw(st.sampled_from(options)), dtype)], shape, dtype)


def conv(draw, g, x):
    shape, dtype = g.tensors[x]
    if len(shape) not in (3, 4):
        return None
    n, c, spatial = shape[0], shape[1], shape[2:]
    group = draw(st.sampled_from([d for d in range(1, c + 1) if c % d == 0]))
    m = group * draw(st.integers(1, 3))
    k = draw(st.integers(1, min(3, min(spatial) + 1)))
    pads = [0 if g.no_pad else draw(st.integers(0, 1)) for _ in range(2 * len(spatial))]
    stride = draw(st.integers(1, 2))
    out = [(d + pads[i] + pads[i + len(spatial)] - k) // stride + 1 for i, d in enumerate(spatial)]
    if min(out) < 1 or n * m * int(np.prod(out)) > MAX_ELEMENTS:
        return None
    zero = draw(st.integers(1, m)) if g.force_zero or draw(st.booleans()) else 0
    inputs = [x, g.const(draw, (m, c // group) + (k,) * len(spatial), dtype, zero_rows=zero)]
    if draw(st.booleans()):
        inputs.append(g.const(draw, (m,), dtype))
    return g.add("Conv", inputs, [n, m] + out, dtype, group=group, kernel_shape=[k] * len(spatial),
                 pads=pads, strides=[stride] * len(spatial))


def batchnorm(draw, g, x):
    shape, dtype = g.tensors[x]
    if len(shape) < 2:
        return None
    c = shape[1]
    ins = [x] + [g.const(draw, (c,), dtype, positive=i == 3) for i in range(4)]
    return g.add("BatchNormalization", ins, shape, dtype, epsilon=draw(st.sampled_from([1e-5, 1e-3])))


def gemm(draw, g, x):
    shape, dtype = g.tensors[x]
    if len(shape) != 2:
        return None
    b, f = shape
    k = f if draw(st.booleans()) else draw(st.integers(1, 6))
    trans = g.force_zero or draw(st.booleans())
    wshape = (k, f) if trans else (f, k)
    w = g.const(draw, wshape, dtype, zero_rows=draw(st.integers(int(g.force_zero), k)) if trans else 0)
    attrs = {"transB": int(trans)}
    if draw(st.booleans()):
        attrs.update(alpha=draw(st.sampled_from([1.0, 0.5])), beta=draw(st.sampled_from([1.0, 2.0])))
    inputs = [x, w]
    bias = draw(st.sampled_from(["none", "k", "1k", "scalar", "weight"]))
    if bias == "weight" and wshape[1] == k and wshape[0] in (1, b):
        inputs.append(w)  # weight and bias one tensor
    elif bias != "none":
        inputs.append(g.const(draw, {"k": (k,), "1k": (1, k), "scalar": (), "weight": (k,)}[bias], dtype))
    return g.add("Gemm", inputs, (b, k), dtype, **attrs)


def matmul(draw, g, x):
    shape, dtype = g.tensors[x]
    if len(shape) < 2:
        return None
    k = draw(st.integers(1, 6))
    out = tuple(shape[:-1]) + (k,)
    if int(np.prod(out)) > MAX_ELEMENTS:
        return None
    return g.add("MatMul", [x, g.const(draw, (shape[-1], k), dtype)], out, dtype)


def transpose(draw, g, x):
    shape, dtype = g.tensors[x]
    perm = draw(st.permutations(range(len(shape))))
    return g.add("Transpose", [x], [shape[p] for p in perm], dtype, perm=list(perm))


def reshape(draw, g, x):
    shape, dtype = g.tensors[x]
    kind = draw(st.sampled_from(["permuted", "flatten", "merge", "flatten_op", "shape_of"]))
    if kind == "flatten_op":
        axis = draw(st.integers(0, len(shape)))
        return g.add("Flatten", [x], (int(np.prod(shape[:axis])), int(np.prod(shape[axis:]))), dtype, axis=axis)
    if kind == "shape_of":  # Reshape(x, Concat(Slice(Shape(x), 0, k), [-1]))
        k = draw(st.integers(1, min(len(shape), 4)))
        s = g.node("Shape", [x])[0]
        head = g.node("Slice", [s, g.ints([0]), g.ints([k])])[0]
        target = g.node("Concat", [head, g.ints([-1], draw(st.booleans()))], axis=0)[0]
        return g.add("Reshape", [x, target], tuple(shape[:k]) + (int(np.prod(shape[k:])),), dtype)
    if kind == "permuted":
        new = list(draw(st.permutations(shape)))
    elif kind == "flatten":
        new = [int(np.prod(shape))]
    else:
        i = draw(st.integers(0, max(len(shape) - 2, 0)))
        new = list(shape[:i]) + [int(np.prod(shape[i:i + 2]))] + list(shape[i + 2:])
    target = list(new)
    if draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    if target[0] != -1 and new[0] == shape[0] and draw(st.booleans()):
        target[0] = 0
    return g.add("Reshape", [x, g.ints(target, draw(st.booleans()))], new, dtype)


def cast(draw, g, x):
    shape, dtype = g.tensors[x]
    to = draw(st.sampled_from([F32, F16]))
    return g.add("Cast", [x], shape, to, to=ONNX_TYPE[to])


def pad(draw, g, x):
    shape, dtype = g.tensors[x]
    pads = [draw(st.integers(0, 1)) for _ in range(2 * len(shape))]
    new = [d + pads[i] + pads[i + len(shape)] for i, d in enumerate(shape)]
    if int(np.prod(new)) > MAX_ELEMENTS:
        return None
    inputs = [x, g.ints(pads, draw(st.booleans()))]
    if draw(st.booleans()):
        inputs.append(g._emit(np.asarray(g.rng.uniform(-1, 1), dtype), "c", False))
    return g.add("Pad", inputs, new, dtype)


def slice_(draw, g, x):
    shape, dtype = g.tensors[x]
    axis = draw(st.integers(0, len(shape) - 1))
    d = shape[axis]
    start = draw(st.integers(0, d - 1))
    end = draw(st.integers(start + 1, d))
    step = draw(st.integers(1, 2))
    new = list(shape)
    new[axis] = len(range(start, end, step))
    ends = end if draw(st.booleans()) or end < d else 2**62
    inputs = [x, g.ints([start]), g.ints([ends]), g.ints([axis if draw(st.booleans()) else axis - len(shape)])]
    inputs += [g.ints([step])] if step != 1 or draw(st.booleans()) else []
    return g.add("Slice", inputs, new, dtype)


def concat(draw, g, x):
    shape, dtype = g.tensors[x]
    axis = draw(st.integers(0, len(shape) - 1))
    peers = [t for t, (s, dt) in g.tensors.items()
             if dt == dtype and len(s) == len(shape) and all(a == b for i, (a, b) in enumerate(zip(s, shape)) if i != axis)]
    others = [peers[draw(st.integers(0, len(peers) - 1))]]
    if draw(st.booleans()):
        extra = list(shape)
        extra[axis] = draw(st.integers(1, 2))
        others.append(g.const(draw, extra, dtype))
    new = list(shape)
    new[axis] = shape[axis] + sum(g.tensors[t][0][axis] if t in g.tensors else extra[axis] for t in others)
    if int(np.prod(new)) > MAX_ELEMENTS:
        return None
    return g.add("Concat", [x] + others, new, dtype, axis=axis)


def squeeze(draw, g, x):
    shape, dtype = g.tensors[x]
    ones = [i for i, d in enumerate(shape) if d == 1]
    if ones and len(shape) > 1 and draw(st.booleans()):
        axis = draw(st.sampled_from(ones))
        op, new = "Squeeze", [d for i, d in enumerate(shape) if i != axis]
    elif len(shape) < 5:
        axis = draw(st.integers(0, len(shape)))
        op, new = "Unsqueeze", list(shape[:axis]) + [1] + list(shape[axis:])
    else:
        return None
    if g.opset >= 13:
        return g.add(op, [x, g.ints([axis], draw(st.booleans()))], new, dtype)
    return g.add(op, [x], new, dtype, axes=[axis])


def gather_shape(draw, g, x):
    """y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): x as [dim0, rest]."""
    shape, dtype = g.tensors[x]
    if len(shape) < 2:
        return None
    s = g.node("Shape", [x])[0]
    d0 = g.node("Gather", [s, g.ints(0)], axis=0)[0]
    axes = {"axes": [0]} if g.opset < 13 else {}
    u = g.node("Unsqueeze", [d0] + ([g.ints([0])] if g.opset >= 13 else []), **axes)[0]
    target = g.node("Concat", [u, g.ints([-1])], axis=0)[0]
    return g.add("Reshape", [x, target], (shape[0], int(np.prod(shape[1:]))), dtype)


def channel_chain(draw, g, x):
    """Producer with all-zero filters → an elementwise step → a consumer (no padding): the
    channels ``prune``'s strip removes, their constants moved into the consumer's bias."""
    g.force_zero = True
    y = conv(draw, g, x) if len(g.tensors[x][0]) in (3, 4) else gemm(draw, g, x)
    g.force_zero = False
    if y is None:
        return None
    step = draw(st.sampled_from(["none", "unary", "batchnorm", "prelu", "binary_const"]))
    y = FAMILIES[step](draw, g, y) or y if step != "none" else y
    g.no_pad = True
    rank = len(g.tensors[y][0])
    z = conv(draw, g, y) if rank in (3, 4) else (gemm if draw(st.booleans()) else matmul)(draw, g, y)
    g.no_pad = False
    return z or y


RANKS = {"channel_chain": (2, 3, 4), "conv": (3, 4), "gemm": (2,), "batchnorm": (2, 3, 4), "matmul": (2, 3, 4), "gather_shape": (2, 3, 4)}
FAMILIES = {
    "unary": unary, "binary_const": binary_const, "binary_pair": binary_pair, "prelu": prelu,
    "conv": conv, "batchnorm": batchnorm, "gemm": gemm, "matmul": matmul, "transpose": transpose,
    "reshape": reshape, "cast": cast, "pad": pad, "slice": slice_, "concat": concat,
    "squeeze": squeeze, "gather_shape": gather_shape, "channel_chain": channel_chain,
}

WEIGHTED = tuple(FAMILIES) + ("channel_chain", "channel_chain", "conv", "batchnorm", "gemm")


@st.composite
def graphs(draw, max_ops: int = 8, families=WEIGHTED) -> onnx.ModelProto:
    """A random valid model (see the module docstring)."""
    opset = draw(st.integers(11, 21))
    g = Graph(opset, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))
    dtype = draw(st.sampled_from([F32, F16]))
    rank = draw(st.sampled_from([4, 2, 3]))
    shape = [draw(st.integers(1, 2))] + [draw(st.integers(1, 5)) for _ in range(rank - 1)]
    g.inputs.append(helper.make_tensor_value_info("x", ONNX_TYPE[dtype], shape))
    g.tensors["x"] = (tuple(shape), dtype)
    order = ["x"]
    for _ in range(draw(st.integers(1, max_ops))):
        family = draw(st.sampled_from(families))
        fits = [t for t in order if len(g.tensors[t][0]) in RANKS.get(family, (1, 2, 3, 4, 5))]
        if not fits:
            continue
        x = fits[len(fits) - 1 - draw(st.integers(0, len(fits) - 1))]
        out = FAMILIES[family](draw, g, x)
        if out is not None:
            order.append(out)
    outputs = [order[-1]] + [t for t in order[1:-1] if draw(st.integers(0, 4)) == 0]
    return finish(g, outputs if len(order) > 1 else ["x"])


def finish(g: Graph, outputs: list) -> onnx.ModelProto:
    if outputs == ["x"]:  # no op applied: one Identity
        outputs = [g.add("Identity", ["x"], *g.tensors["x"])]
    values = [helper.make_tensor_value_info(t, ONNX_TYPE[g.tensors[t][1]], list(g.tensors[t][0])) for t in outputs]
    graph = helper.make_graph(g.nodes, "fuzz", g.inputs, values, g.inits)
    opsets = [helper.make_opsetid("", g.opset)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


# --- the property --------------------------------------------------------------------------


def session(model: onnx.ModelProto):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def feeds_for(model: onnx.ModelProto, count: int = 2, seed: int = 1) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        feed = {}
        for vi in model.graph.input:
            t = vi.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
            feed[vi.name] = rng.normal(0, 1, size=[d.dim_value for d in t.shape.dim]).astype(dtype)
        out.append(feed)
    return out


def computes_in_float16(model: onnx.ModelProto) -> bool:
    """Whether any tensor of the graph is float16 (an input, a constant or a Cast to it)."""
    half = TensorProto.FLOAT16
    return (any(v.type.tensor_type.elem_type == half for v in model.graph.input)
            or any(t.data_type == half for t in model.graph.initializer)
            or any(a.name == "to" and a.i == half or a.name == "value" and a.t.data_type == half
                   for n in model.graph.node for a in n.attribute))


def lossless(ref: np.ndarray, got: np.ndarray, half: bool = False) -> str | None:
    """None when ``got`` matches ``ref`` by the lossless rule, else what differs; ``half``: the
    graph computes in float16 somewhere, so the error may be a few float16 steps."""
    if ref.dtype != got.dtype or ref.shape != got.shape:
        return f"dtype/shape {got.dtype}{list(got.shape)} instead of {ref.dtype}{list(ref.shape)}"
    a, b = ref.astype(np.float64), got.astype(np.float64)
    fa, fb = np.isfinite(a), np.isfinite(b)
    if np.any(fa != fb) or np.any(~fa & (a != b) & ~(np.isnan(a) & np.isnan(b))):
        return "non-finite values in other places"
    if not fa.any():
        return None
    err, scale = float(np.abs(a - b)[fa].max()), float(np.abs(a[fa]).max())
    limit = 1e-6 + 1e-4 * scale if not half else 4 * float(np.spacing(np.float16(max(scale, 6e-5))))
    return None if err <= limit else f"max abs error {err:.3g} > {limit:.3g} (scale {scale:.3g})"


def check_valid(model: onnx.ModelProto) -> list:
    """The generated model is valid (full checker, ORT runs it); its outputs on the feeds."""
    onnx.checker.check_model(model, full_check=True)
    sess = session(model)
    return [sess.run(None, f) for f in feeds_for(model)]


KNOWN = {"fp16-rollback": "issue 15: float16 folds whose rounding the lossless bound (4 float16 steps at "
         "the output's scale) cannot absorb are skipped (passes/fuse/fp16_guard.py); a rollback left is "
         "rounding that adds up over many folds (a known gap, see that module's docstring)"}


def check_lossless(model: onnx.ModelProto, passes: str, reference: list | None = None, stats=None) -> list:
    """Run ``passes`` with verification off, then on: the findings as ``(kind, message)``
    (empty when the property holds). Kinds: ``crash``, ``checker``, ``outputs``, ``mismatch``,
    ``rollback``, ``fp16-rollback`` (a rollback on a float16 graph by less than 4 float16 steps
    per output: :data:`KNOWN`), ``input-modified``. ``stats`` (a Counter) counts the passes that
    changed the graph and their rewrites, from the run with verification on."""
    import onnxslim_kit

    reference = check_valid(model) if reference is None else reference
    before = model.SerializeToString()
    findings = []
    try:
        result, _ = onnxslim_kit.optimize(model, passes, verify=False)
        findings += compare_result(model, result, reference)
        _, report = onnxslim_kit.optimize(model, passes, verify=True)
        findings += [rollback(model, p) for p in report.passes if p.rolled_back]
        for p in report.passes if stats is not None else ():
            stats[f"{p.name} modified"] += bool(p.modified)
            stats.update({f"{p.name}: {label}": n for label, n in p.rewrites.items()})
    except Exception as exc:  # noqa: BLE001 -- a crash is a finding, reported with the graph
        findings.append(("crash", f"{type(exc).__name__}: {exc}"))
    if model.SerializeToString() != before:
        findings.append(("input-modified", "the input proto was modified"))
    return findings


def rollback(model: onnx.ModelProto, entry) -> tuple:
    check = entry.verification or {}
    outputs = check.get("outputs") or {}
    within_fp16 = check.get("status") == "failed" and outputs and all(
        d["max_rel"] not in (0, None) and d["max_abs"] <= 4 * float(np.spacing(np.float16(d["max_abs"] / d["max_rel"])))
        or d["max_abs"] == 0 for d in outputs.values())
    kind = "fp16-rollback" if within_fp16 and computes_in_float16(model) else "rollback"
    worst = max(outputs.items(), key=lambda kv: kv[1]["max_rel"] or 0, default=(None, {}))
    return kind, (f"{entry.name} rolled back with verification on ({check.get('status')}: "
                  f"{check.get('message') or ''} worst output {worst[0]} {worst[1]})")


def describe(model: onnx.ModelProto, passes: str, findings: list) -> str:
    """A failure as text: the pass list, the findings, the graph as ONNX text."""
    lines = [f"passes {passes!r}:"] + [f"  {kind}: {message}" for kind, message in findings]
    return "\n".join(lines) + "\n" + onnx.printer.to_text(model)


def compare_result(model: onnx.ModelProto, result: onnx.ModelProto, reference: list) -> list:
    try:
        onnx.checker.check_model(result, full_check=True)
    except Exception as exc:  # noqa: BLE001
        return [("checker", f"checker rejects the result: {str(exc).splitlines()[0]}")]
    names = [o.name for o in model.graph.output]
    if [o.name for o in result.graph.output] != names:
        return [("outputs", f"outputs {[o.name for o in result.graph.output]} instead of {names}")]
    sess = session(result)
    half = computes_in_float16(model)
    problems = []
    for feed, ref in zip(feeds_for(model), reference):
        for name, a, b in zip(names, ref, sess.run(None, feed)):
            why = lossless(a, b, half)
            if why:
                problems.append(("mismatch", f"output {name}: {why}"))
    return problems[:3]
