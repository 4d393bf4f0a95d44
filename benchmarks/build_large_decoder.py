"""A deterministic, seeded transformer decoder of any size — up to > 2.5 GB — written as one
``.onnx`` plus one external ``.data`` file, streamed tensor by tensor.

    python benchmarks/build_large_decoder.py --out /tmp/big/decoder.onnx          # full size, ≈ 2.75 GB
    python benchmarks/build_large_decoder.py --layers 2 --hidden 512 --mlp 2048 --out /tmp/s/decoder.onnx

The graph (opset 17), input ``features`` ``[batch, seq, F]`` (both dynamic), output ``logits``
``[batch, seq, V]``::

    x = Transpose(features) → Conv(k=3, causal pad, F→H) → BatchNormalization → Relu → Transpose   [B, T, H]
    mask = (Trilu(ones[T, T]) − 1) · 10⁴          causal, additive; T read from Shape(features)
    L × pre-LN block:
        h = LayerNorm(x);  q, k, v = h·W_q + b_q, h·W_k + b_k, h·W_v + b_v   (H/d heads of d = 64)
        x = x + (softmax(q·kᵀ/√d + mask)·v)·W_o + b_o
        h = LayerNorm(x);  x = x + gelu(h·W_1 + b_1)·W_2 + b_2              (gelu: erf form)
    logits = LayerNorm(x)·W_head                                              [B, T, V]

Parameters ≈ L·(4H² + 2H·M) + H·V; the defaults (L = 24, H = 1536, M = 6144, V = 4096) make
686 M float32 parameters, 2.75 GB. Weights: W ~ N(0, 1/fan_in) (W_2 also ÷ √(2L), so the
residual stream stays of unit scale), biases N(0, 0.02²), norm scales 1 + N(0, 0.05²),
BatchNormalization statistics drawn once; tensor *i* is drawn from
``numpy.random.default_rng([seed, i])`` on its own, so its values do not depend on the others.

Streaming, in onnx's own format: the graph is built with every large initializer as an
external-data stub; then, one tensor at a time, its array is drawn, put in ``raw_data`` and
appended to the data file by ``onnx.external_data_helper.save_external_data`` — the very call
``onnx.save_model(save_as_external_data=True)`` makes for each tensor, in the same order
(initializers in graph order, same ``size_threshold`` of 1024) — and dropped. The files are
byte-identical to what ``onnx.save_model(model, path, save_as_external_data=True,
location=<name>.data)`` writes for the same model held in memory
(``tests/core/test_large_builder.py`` checks it),
while the builder holds at most one tensor (the largest: H·M·4 bytes, 38 MB at full size).
Measured (``/usr/bin/time``): peak RSS 55 MiB for 1 MB, 78 MiB for 34 MB, 101 MiB for 219 MB.
Same flags → same bytes: no timestamps, names from the layer index, a fixed producer string.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import save_external_data, set_external_data

OPSET = 17
SIZE_THRESHOLD = 1024  # onnx.save_model's default: smaller tensors stay in the .onnx file
PRODUCER = "onnxslim_kit benchmarks/build_large_decoder.py"


@dataclass(frozen=True)
class Config:
    layers: int = 24
    hidden: int = 1536
    mlp: int = 6144
    heads: int = 0  # 0: hidden // 64
    features: int = 80
    vocab: int = 4096
    seed: int = 0

    @property
    def n_heads(self) -> int:
        return self.heads or max(1, self.hidden // 64)

    def check(self) -> None:
        for field in ("layers", "hidden", "mlp", "features", "vocab"):
            if getattr(self, field) < 1:
                raise ValueError(f"--{field} must be ≥ 1, got {getattr(self, field)}")
        if self.hidden % self.n_heads:
            raise ValueError(f"--hidden {self.hidden} is not a multiple of the head count {self.n_heads}")

    def parameters(self) -> int:
        return sum(math.prod(shape) for _, shape, _, _ in weight_specs(self))


# --- weights: (name, shape, how it is drawn), in the order they are written -----------------

def weight_specs(cfg: Config) -> list:
    """Every initializer of the model that holds weights: ``(name, shape, kind, scale)``."""
    h, m, f = cfg.hidden, cfg.mlp, cfg.features
    specs = [("front.conv.w", (h, f, 3), "normal", 1 / math.sqrt(3 * f)), ("front.conv.b", (h,), "normal", 0.02),
             ("front.bn.scale", (h,), "one", 0.1), ("front.bn.bias", (h,), "normal", 0.1),
             ("front.bn.mean", (h,), "normal", 0.1), ("front.bn.var", (h,), "var", 0.0)]
    for i in range(cfg.layers):
        p = f"layer{i}."
        specs += [(p + "ln1.g", (h,), "one", 0.05), (p + "ln1.b", (h,), "normal", 0.02)]
        for name in ("q", "k", "v", "o"):
            specs += [(p + f"attn.{name}.w", (h, h), "normal", 1 / math.sqrt(h)),
                      (p + f"attn.{name}.b", (h,), "normal", 0.02)]
        specs += [(p + "ln2.g", (h,), "one", 0.05), (p + "ln2.b", (h,), "normal", 0.02),
                  (p + "mlp.fc1.w", (h, m), "normal", 1 / math.sqrt(h)), (p + "mlp.fc1.b", (m,), "normal", 0.02),
                  (p + "mlp.fc2.w", (m, h), "normal", 1 / math.sqrt(m * 2 * cfg.layers)),
                  (p + "mlp.fc2.b", (h,), "normal", 0.02)]
    specs += [("final.ln.g", (h,), "one", 0.05), ("final.ln.b", (h,), "normal", 0.02),
              ("head.w", (h, cfg.vocab), "normal", 1 / math.sqrt(h))]
    return specs


def draw(cfg: Config, index: int, shape: tuple, kind: str, scale: float) -> np.ndarray:
    """Tensor ``index`` of the model, from its own generator ``default_rng([seed, index])``."""
    rng = np.random.default_rng([cfg.seed, index])
    if kind == "var":
        return rng.uniform(0.5, 1.5, size=shape).astype(np.float32)
    values = rng.standard_normal(size=shape, dtype=np.float32)
    values *= np.float32(scale)
    if kind == "one":
        values += np.float32(1.0)
    return values


# --- the graph -------------------------------------------------------------------------------

class GraphBuilder:
    """Nodes and small constants; names from a counter, so the same config gives the same graph."""

    def __init__(self):
        self.nodes: list = []
        self.constants: list = []
        self.count = 0

    def op(self, op_type: str, inputs: list, **attrs) -> str:
        self.count += 1
        out = f"{op_type.lower()}_{self.count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{op_type}_{self.count}", **attrs))
        return out

    def const(self, name: str, values, dtype=np.float32) -> str:
        self.constants.append(numpy_helper.from_array(np.asarray(values, dtype=dtype), name))
        return name


def _linear(g: GraphBuilder, x: str, prefix: str) -> str:
    return g.op("Add", [g.op("MatMul", [x, prefix + ".w"]), prefix + ".b"])


def _attention(g: GraphBuilder, cfg: Config, h: str, p: str, mask: str) -> str:
    heads = g.op("Reshape", [_linear(g, h, p + "attn.q"), "shape.heads"])
    q = g.op("Transpose", [heads], perm=[0, 2, 1, 3])
    k = g.op("Transpose", [g.op("Reshape", [_linear(g, h, p + "attn.k"), "shape.heads"])], perm=[0, 2, 3, 1])
    v = g.op("Transpose", [g.op("Reshape", [_linear(g, h, p + "attn.v"), "shape.heads"])], perm=[0, 2, 1, 3])
    scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), "scalar.attn_scale"]), mask])
    context = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])
    merged = g.op("Reshape", [g.op("Transpose", [context], perm=[0, 2, 1, 3]), "shape.merge"])
    return _linear(g, merged, p + "attn.o")


def _mlp(g: GraphBuilder, h: str, p: str) -> str:
    up = _linear(g, h, p + "mlp.fc1")
    erf = g.op("Erf", [g.op("Div", [up, "scalar.sqrt2"])])
    gelu = g.op("Mul", [g.op("Mul", [up, g.op("Add", [erf, "scalar.one"])]), "scalar.half"])
    return _linear(g, gelu, p + "mlp.fc2")


def _layer_norm(g: GraphBuilder, x: str, prefix: str) -> str:
    return g.op("LayerNormalization", [x, prefix + ".g", prefix + ".b"], axis=-1, epsilon=1e-5)


def _causal_mask(g: GraphBuilder) -> str:
    seq = g.op("Slice", [g.op("Shape", ["features"]), "index.one", "index.two"])
    square = g.op("ConstantOfShape", [g.op("Concat", [seq, seq], axis=0)],
                  value=numpy_helper.from_array(np.ones(1, np.float32), "one"))
    lower = g.op("Trilu", [square], upper=0)
    return g.op("Mul", [g.op("Sub", [lower, "scalar.one"]), "scalar.mask"])


def build_graph(cfg: Config) -> onnx.GraphProto:
    """The graph with weight initializers as names only (the caller adds them)."""
    g = GraphBuilder()
    d = cfg.hidden // cfg.n_heads
    g.const("shape.heads", [0, 0, cfg.n_heads, d], np.int64)
    g.const("shape.merge", [0, 0, cfg.hidden], np.int64)
    g.const("index.one", [1], np.int64)
    g.const("index.two", [2], np.int64)
    for name, value in (("scalar.attn_scale", 1 / math.sqrt(d)), ("scalar.sqrt2", math.sqrt(2)), ("scalar.one", 1.0),
                        ("scalar.half", 0.5), ("scalar.mask", 1e4)):
        g.const(name, value)
    mask = _causal_mask(g)
    conv = g.op("Conv", [g.op("Transpose", ["features"], perm=[0, 2, 1]), "front.conv.w", "front.conv.b"],
                kernel_shape=[3], pads=[2, 0])  # causal: t reads t-2 … t
    bn = g.op("BatchNormalization", [conv, "front.bn.scale", "front.bn.bias", "front.bn.mean", "front.bn.var"],
              epsilon=1e-5)
    x = g.op("Transpose", [g.op("Relu", [bn])], perm=[0, 2, 1])
    for i in range(cfg.layers):
        p = f"layer{i}."
        x = g.op("Add", [x, _attention(g, cfg, _layer_norm(g, x, p + "ln1"), p, mask)])
        x = g.op("Add", [x, _mlp(g, _layer_norm(g, x, p + "ln2"), p)])
    g.nodes.append(helper.make_node("MatMul", [_layer_norm(g, x, "final.ln"), "head.w"], ["logits"], name="head"))
    inputs = [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "seq", cfg.features])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", cfg.vocab])]
    return helper.make_graph(g.nodes, "decoder", inputs, outputs, initializer=g.constants)


def build(cfg: Config, out: Path) -> dict:
    """Write ``out`` and ``out.data`` (replacing both); returns what was written."""
    cfg.check()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data_name = out.name + ".data"
    out.unlink(missing_ok=True)
    (out.parent / data_name).unlink(missing_ok=True)  # save_external_data appends: start empty
    model = helper.make_model(build_graph(cfg), opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=PRODUCER)
    model.ir_version = 8
    # the same order and condition as onnx.save_model(save_as_external_data=True); each tensor is
    # a message of its own, dropped once written: a field cleared in the model itself would keep
    # its bytes in the model's protobuf arena, all weights in memory by the end
    for index, (name, shape, kind, scale) in enumerate(weight_specs(cfg)):
        tensor = numpy_helper.from_array(draw(cfg, index, shape, kind, scale), name)
        if sys.getsizeof(tensor.raw_data) >= SIZE_THRESHOLD:
            set_external_data(tensor, data_name)
            save_external_data(tensor, str(out.parent))
            tensor.ClearField("raw_data")
        model.graph.initializer.add().CopyFrom(tensor)
        del tensor
    onnx.save_model(model, str(out))  # every large tensor is already external: writes the graph only
    data = out.parent / data_name
    return {"model": str(out), "data": str(data), "parameters": cfg.parameters(),
            "bytes": out.stat().st_size + (data.stat().st_size if data.exists() else 0)}


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Config()
    for field in ("layers", "hidden", "mlp", "heads", "features", "vocab", "seed"):
        parser.add_argument(f"--{field}", type=int, default=getattr(defaults, field))
    parser.add_argument("--out", type=Path, required=True, help="the .onnx to write (its .data beside it)")
    return parser.parse_args(argv)


def main(argv: list | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    cfg = Config(**{k: getattr(args, k) for k in ("layers", "hidden", "mlp", "heads", "features", "vocab", "seed")})
    try:
        written = build(cfg, args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{written['model']}: {written['parameters']:,} parameters, {written['bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
