"""What the ``svd`` pass needs to know about a layer's input: how many rows it processes per
inference (for FLOPs and the speed check) and, for the data-aware variant, the Gram matrix
``G = XᵀX / rows`` of those rows.

Rows of a layer ``Y = X W`` (``W``: ``k × n``):

* MatMul / Gemm: the activation ``X`` reshaped to ``(−1, k)``;
* Conv (2-D, group 1): the im2col patches — for output position ``(b, i, j)`` the row is
  ``Xpad[b, :, i·sh + dy·dh, j·sw + dx·dw]`` over the kernel offsets ``(dy, dx)``, flattened in
  the order of ``W.reshape(n, C·kh·kw)`` (channel, then kernel row, then kernel column).

Rows of one sample beyond ``MAX_ROWS`` are subsampled (seeded) for ``G``; ``rows`` always
counts all of them. With ``mask`` (the name of a model input such as ``attention_mask``), a
MatMul/Gemm input whose leading shape equals that input's shape contributes only the rows where
the mask is non-zero (padding tokens are not data: they would bias ``G`` towards the padding
token's activations); ``rows`` (the FLOPs) still counts all of them. Activations come from :func:`onnxslim_kit.activations.iter_activations`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.activations import iter_activations

from onnxslim_kit.passes._common.graph import const_value, exclusive_constant, is_onnx_op
from onnxslim_kit.passes._common.match import NOT_CONCERNED, MatchResult

FLOAT_KINDS = (np.float16, np.float32, np.float64)

MAX_ROWS = 4096
FLUSH_VALUES = 1 << 20  # row values gathered (float32) before they enter the Gram matrices: one GEMM, not one per sample


@dataclass(eq=False)
class Layer:
    """A node computing ``Y = X W`` with a constant ``W`` (``matrix``, ``k × n``)."""

    node: gs.Node
    graph: gs.Graph
    kind: str  # matmul | gemm | conv | batched (MatMul weight [heads, k, n])
    matrix: np.ndarray  # W as k × n (batched: the first head; the pass factorises every head)
    geometry: object = None  # ConvGeometry, filled in by collect()
    heads: int = 1

    @property
    def key(self) -> int:
        return id(self.node)

    @property
    def input_name(self) -> str:
        return self.node.inputs[0].name

    @property
    def k(self) -> int:
        return self.matrix.shape[0]

    @property
    def n(self) -> int:
        return self.matrix.shape[1]


def match_layer(node: gs.Node, graph: gs.Graph, main: gs.Graph) -> MatchResult:
    """Payload a :class:`Layer`; a failed match with the reason it does not apply, or with an
    empty reason for nodes that are not candidates."""
    if not is_onnx_op(node, "MatMul", "Gemm", "Conv") or len(node.inputs) < 2:
        return NOT_CONCERNED
    x, weight = node.inputs[0], node.inputs[1]
    values = const_value(weight)
    if values is None:
        return MatchResult.fail("constant on the left" if node.op == "MatMul" and isinstance(x, gs.Constant) else "")
    found = _layer_problem(node, graph, main, x, weight, values)
    if found is None:
        found = _LAYER_KINDS[node.op](node, graph, values)
    return MatchResult.fail(found) if isinstance(found, str) else MatchResult.of(found)


def _layer_problem(node, graph, main, x, weight, values) -> str | None:
    if values.dtype not in FLOAT_KINDS:
        return "weight is not float"
    if isinstance(x, gs.Constant):
        return "both inputs constant"
    if not exclusive_constant(weight, node):
        return "shared weight"
    if graph is not main:
        return "inside a subgraph"
    return None


def _matmul_layer(node, graph, values):
    if values.ndim == 3:
        return Layer(node, graph, "batched", values[0], heads=values.shape[0])
    if values.ndim != 2:
        return "weight is not 2-D or 3-D"
    return Layer(node, graph, "matmul", values)


def _gemm_layer(node, graph, values):
    if node.attrs.get("transA", 0):
        return "Gemm with transA"
    return Layer(node, graph, "gemm", values.T if node.attrs.get("transB", 0) else values)


def _conv_layer(node, graph, values):
    if values.ndim != 4:
        return "conv is not 2-D"
    if node.attrs.get("group", 1) != 1:
        return "grouped conv"
    return Layer(node, graph, "conv", values.reshape(values.shape[0], -1).T)


_LAYER_KINDS = {"MatMul": _matmul_layer, "Gemm": _gemm_layer, "Conv": _conv_layer}


@dataclass(frozen=True)
class ConvGeometry:
    kernel: tuple
    strides: tuple
    dilations: tuple
    pads: tuple  # (top, left, bottom, right)


@dataclass
class InputStats:
    """Row count and Gram statistics of a layer input; also kept per half of the samples
    (even / odd sample index) so that a rank can be chosen on one half and checked on the other."""

    rows_per_sample: int = 0
    samples: int = 0
    gram: np.ndarray | None = None
    gram_rows: int = 0
    fourth: float = 0.0  # Σ ‖x_i‖⁴ over the rows of the Gram matrix
    shape: tuple = field(default_factory=tuple)
    halves: list = field(default_factory=lambda: [[None, 0, 0.0], [None, 0, 0.0]])  # [gram, rows, fourth]
    pending: list = field(default_factory=lambda: [[], []])  # rows of each half not yet in the Gram matrices
    pending_rows: int = 0

    def add(self, rows: np.ndarray, total_rows: int, want_gram: bool, shape: tuple = ()) -> None:
        """Add one sample's rows; FLOPs and the speed check use the largest sample seen (samples
        of their own length, e.g. unpadded sentences, differ in size)."""
        which = self.samples % 2
        self.samples += 1
        if total_rows >= self.rows_per_sample:
            self.rows_per_sample, self.shape = total_rows, shape
        if want_gram:
            self.pending[which].append(rows.astype(np.float32))  # a copy: the activations are not kept
            self.pending_rows += len(rows)
            if self.pending_rows * rows.shape[1] >= FLUSH_VALUES:
                self.flush()

    def flush(self) -> None:
        """Add the gathered rows to the Gram matrices (whole and per half)."""
        for chunk, half in zip(self.pending, self.halves):
            if not chunk:
                continue
            r64 = np.concatenate(chunk).astype(np.float64)
            chunk.clear()
            g = r64.T @ r64
            fourth = float(np.sum(np.sum(r64**2, axis=1) ** 2))
            self.gram = g if self.gram is None else self.gram + g
            self.gram_rows += len(r64)
            self.fourth += fourth
            half[0] = g if half[0] is None else half[0] + g
            half[1] += len(r64)
            half[2] += fourth
        self.pending_rows = 0

    @property
    def normalized_gram(self) -> np.ndarray | None:
        return None if self.gram is None else self.gram / max(self.gram_rows, 1)

    def half(self, i: int) -> tuple:
        """``(normalised Gram, rows, Σ‖x‖⁴)`` of half ``i`` (Gram None when it saw no sample)."""
        gram, rows, fourth = self.halves[i]
        return (None if gram is None else gram / max(rows, 1)), rows, fourth


def conv_geometry(node, x_shape) -> ConvGeometry | None:
    """Kernel, strides, dilations and explicit pads of a 2-D Conv (None when not 2-D)."""
    kernel = tuple(node.inputs[1].values.shape[2:])
    if len(kernel) != 2 or len(x_shape) != 4:
        return None
    strides = tuple(node.attrs.get("strides", [1, 1]))
    dilations = tuple(node.attrs.get("dilations", [1, 1]))
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = []
        for size, k, s, d in zip(x_shape[2:], kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small = total // 2
            pads.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
        pads = (pads[0][0], pads[1][0], pads[0][1], pads[1][1])
    elif auto_pad == "VALID":
        pads = (0, 0, 0, 0)
    else:
        pads = tuple(node.attrs.get("pads", [0, 0, 0, 0]))
    return ConvGeometry(kernel, strides, dilations, pads)


def conv_rows(x: np.ndarray, geo: ConvGeometry, rng: np.random.Generator, max_rows: int = MAX_ROWS) -> tuple:
    """``(patches, total rows)``: im2col rows at (at most ``max_rows``) output positions."""
    (kh, kw), (sh, sw), (dh, dw), (pt, pl, pb, pr) = geo.kernel, geo.strides, geo.dilations, geo.pads
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    ho = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    wo = (xp.shape[3] - (kw - 1) * dw - 1) // sw + 1
    total = x.shape[0] * ho * wo
    pick = np.arange(total) if total <= max_rows else np.sort(rng.choice(total, max_rows, replace=False))
    b, rest = np.divmod(pick, ho * wo)
    oy, ox = np.divmod(rest, wo)
    iy = oy[:, None] * sh + np.arange(kh) * dh
    ix = ox[:, None] * sw + np.arange(kw) * dw
    channels = np.arange(x.shape[1])
    patches = xp[b[:, None, None, None], channels[None, :, None, None], iy[:, None, :, None], ix[:, None, None, :]]
    return patches.reshape(len(pick), -1), total


def matmul_rows(x: np.ndarray, k: int, rng: np.random.Generator, max_rows: int = MAX_ROWS,
                keep: np.ndarray | None = None) -> tuple:
    """``(rows, total rows)``; ``keep``: a mask of ``x``'s leading shape (rows where it is 0 are
    left out of the returned rows, not of the total)."""
    rows = x.reshape(-1, k)
    total = len(rows)
    if keep is not None and keep.shape == x.shape[:-1]:
        rows = rows[keep.reshape(-1) != 0]
    if len(rows) > max_rows:
        rows = rows[np.sort(rng.choice(len(rows), max_rows, replace=False))]
    return rows, total


def collect(proto, layers: list, samples, want_gram: bool, seed: int = 0, mask: str = "") -> dict:
    """``{layer.key: InputStats}`` over ``samples`` (one pass through ONNX Runtime); layers that
    read the same tensor the same way (Q/K/V projections) share one :class:`InputStats`;
    ``mask``: input name of a padding mask (see the module docstring)."""
    rng = np.random.default_rng(seed)
    names = sorted({layer.input_name for layer in layers})
    shared, by_layer = {}, {}
    samples = list(samples)
    for sample, values in zip(samples, iter_activations(proto, names, samples, threads=1)):
        keep = sample.get(mask) if mask else None
        seen = set()
        for layer in layers:
            x = values[layer.input_name]
            if layer.kind == "conv" and layer.geometry is None:
                layer.geometry = conv_geometry(layer.node, x.shape)
            key = (layer.input_name, layer.kind, layer.k, layer.geometry)
            entry = by_layer[layer.key] = shared.setdefault(key, InputStats())
            if key in seen:
                continue
            seen.add(key)
            if layer.kind == "conv":
                rows, total = conv_rows(x, layer.geometry, rng)
            else:
                rows, total = matmul_rows(x, layer.k, rng, keep=None if keep is None else np.asarray(keep))
                if layer.kind == "batched":  # x broadcast against [heads, k, n]: every head's rows
                    batch = int(np.prod(x.shape[:-2], dtype=np.int64))
                    total = total // max(batch, 1) * int(np.prod(np.broadcast_shapes(x.shape[:-2], (layer.heads,))))
            entry.add(rows, total, want_gram, tuple(x.shape))
    for entry in shared.values():
        entry.flush()
    return by_layer
