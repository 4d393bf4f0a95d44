"""Int8 weight encodings on ONNX Runtime's CPU kernels: accuracy and speed (issue 13, helper E).

    python benchmarks/measure_int8_saturation.py --out benchmarks/results/int8-saturation-<date>.md

Why: on x86-64 CPUs with AVX2 (or AVX-512 without VNNI) MLAS multiplies uint8 activations by
int8 weights with ``vpmaddubsw``, which adds two u8·s8 products into a *saturating* int16
(``2 · 255 · 127 = 64770 > 32767``); CPUs with (AVX-)VNNI use ``vpdpbusd`` (int32, exact) and
u8·u8 takes a widening kernel (``vpmaddwd`` on int16 operands: exact everywhere). ONNX
Runtime's quantization guide says so ("When and why do I need to try U8U8?") and offers
``reduce_range`` (7-bit weights: ``2 · 255 · 64 = 32640 ≤ 32767``) or U8U8.

What runs, for each operator and weight encoding (ORT ``ORT_ENABLE_ALL``, one intra-op thread):

=============  ===========================================================================
case           graph (ORT's fused kernel in brackets, read from the optimized model)
=============  ===========================================================================
dyn MatMul     DynamicQuantizeLinear + MatMulInteger + Cast + Mul [DynamicQuantizeMatMul]
dyn Conv       DynamicQuantizeLinear + ConvInteger + Cast + Mul
QDQ MatMul     Q/DQ(x) · DQ(W) → Q/DQ(y) [QLinearMatMul]
QDQ MatMul→f   Q/DQ(x) · DQ(W), float output [MatMulIntegerToFloat]
QDQ Gemm       Q/DQ(x) · DQ(W) + b → Q/DQ(y) [QGemm]
QDQ Conv       Q/DQ(x) * DQ(W) + b → Q/DQ(y) [QLinearConv]
=============  ===========================================================================

Weight encodings (per output channel): ``s8`` symmetric int8 ``[−127, 127]``; ``s8/7bit``
symmetric int8 ``[−63, 63]`` (reduce range); ``u8 z128`` the ``s8`` values + 128 as uint8 with
zero point 128 (the same grid, another kernel); ``u8 asym`` uint8 over each channel's
``[min, max]``. Activations: uint8, asymmetric (dynamic: the tensor's own range at every run;
static: the range of the measured tensor itself, so the activation grid is the best possible).

Accuracy: ``1 − cos`` against the float model (lower is better) for ORT's integer kernels
(``ort``) and for the *same* quantized model computed exactly (``exact``: the fake-quantized
graph — every integer tensor dequantized, float MatMul/Conv — with graph optimizations off).
``ort ≫ exact`` is the kernel's own loss (saturation), not quantization. Data: ``normal``
(N(0, 1) activations and weights), ``relu`` (|N(0, 1)| activations, zero point 0: most
codes small), ``uniform`` (U(−1, 1) activations and weights: codes spread over [0, 255], many
weights near ±127 — the worst case for saturation), ``outlier`` (3 % of the activation
channels ×20, Student-t(3) weights).

Speed: median of ``--runs`` interleaved runs (every session once per round, order rotated)
on ``normal`` data.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from datetime import date

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

M, K, N = 64, 768, 768           # MatMul: [M, K] · [K, N]
C, HW, KS = 64, 28, 3            # Conv: [1, C, HW, HW] * [C, C, KS, KS], pads 1
ENCODINGS = ("s8", "s8/7bit", "u8 z128", "u8 asym")
DATA = ("normal", "relu", "uniform", "outlier")


# --- weight encodings ---------------------------------------------------------------------
def encode(w: np.ndarray, kind: str, axis: int) -> tuple:
    """(w_q, scale, zero point) per channel along ``axis`` of ``w``."""
    other = tuple(i for i in range(w.ndim) if i != axis)
    shape = [1] * w.ndim
    shape[axis] = -1
    if kind == "u8 asym":
        lo = np.minimum(w.min(axis=other), 0.0)
        hi = np.maximum(w.max(axis=other), 0.0)
        scale = np.where(hi > lo, (hi - lo) / 255.0, 1.0)
        zero = np.clip(np.round(-lo / scale), 0, 255)
        q = np.clip(np.round(w / scale.reshape(shape)) + zero.reshape(shape), 0, 255)
        return q.astype(np.uint8), scale.astype(np.float32), zero.astype(np.uint8)
    qmax = 63 if kind == "s8/7bit" else 127
    amax = np.abs(w).max(axis=other)
    scale = np.where(amax > 0, amax / qmax, 1.0)
    q = np.clip(np.round(w / scale.reshape(shape)), -qmax, qmax)
    if kind == "u8 z128":
        return (q + 128).astype(np.uint8), scale.astype(np.float32), np.full(scale.shape, 128, np.uint8)
    return q.astype(np.int8), scale.astype(np.float32), np.zeros(scale.shape, np.int8)


def act_params(x: np.ndarray) -> tuple:
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / 255.0 or 1.0
    return np.float32(scale), np.uint8(np.clip(round(-lo / scale), 0, 255))


# --- graphs -------------------------------------------------------------------------------
def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def model(nodes, inits, x_shape, y_shape) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return proto


def conv_attrs():
    return {"pads": [1, 1, 1, 1], "kernel_shape": [KS, KS]}


def dynamic_graphs(op: str, w: np.ndarray, kind: str) -> tuple:
    """(integer model, exact fake-quantized model)."""
    conv = op == "Conv"
    wq, ws, wz = encode(w, kind, 0 if conv else 1)
    bshape = [1, -1, 1, 1] if conv else [-1]
    shapes = ([1, C, HW, HW], [1, C, HW, HW]) if conv else ([M, K], [M, N])
    attrs = conv_attrs() if conv else {}
    integer_op = "ConvInteger" if conv else "MatMulInteger"
    # ConvInteger takes one weight zero point (ORT: "Non per-tensor quantization is not supported")
    wz_in = wz[0] if conv and np.all(wz == wz[0]) else wz
    inits = [const("wq", wq), const("wz", wz_in), const("ws", ws.reshape(bshape))]
    integer = model([
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node(integer_op, ["xq", "wq", "xz", "wz"], ["yi"], **attrs),
        helper.make_node("Cast", ["yi"], ["yf"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s"]),
        helper.make_node("Mul", ["yf", "s"], ["y"]),
    ], inits, *shapes)
    exact = model([
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws1", "wz"], ["wd"], axis=0 if conv else 1),
        helper.make_node(op, ["xd", "wd"], ["y"], **attrs),
    ], [const("wq", wq), const("wz", wz), const("ws1", ws)], *shapes)
    return integer, exact


def qdq_graph(op: str, w: np.ndarray, b: np.ndarray, kind: str, x: np.ndarray, y_ref: np.ndarray,
              out_q: bool) -> onnx.ModelProto:
    """Static QDQ model (activation range from ``x``, output range from the float ``y_ref``)."""
    conv = op == "Conv"
    wq, ws, wz = encode(w, kind, 0 if conv else 1)
    xs, xz = act_params(x)
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0 if conv else 1)]
    inits = [const("xs", xs), const("xz", xz), const("wq", wq), const("ws", ws), const("wz", wz)]
    inputs = ["xd", "wd"]
    if b is not None:  # int32 bias, s_b = s_x · s_w
        bs = (xs * ws).astype(np.float32)
        inits += [const("bq", np.round(b / bs).astype(np.int32)), const("bs", bs), const("bz", np.zeros(bs.shape, np.int32))]
        nodes.append(helper.make_node("DequantizeLinear", ["bq", "bs", "bz"], ["bd"], axis=0))
        inputs.append("bd")
    out = "yq_in" if out_q else "y"
    attrs = conv_attrs() if conv else {}
    nodes.append(helper.make_node(op, inputs, [out], **attrs))
    if out_q:
        ys, yz = act_params(y_ref)
        inits += [const("ys", ys), const("yz", yz)]
        nodes += [helper.make_node("QuantizeLinear", [out, "ys", "yz"], ["yq"]),
                  helper.make_node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    shapes = ([1, C, HW, HW], [1, C, HW, HW]) if conv else ([M, K], [M, N])
    return model(nodes, inits, *shapes)


def float_graph(op: str, w: np.ndarray, b) -> onnx.ModelProto:
    conv = op == "Conv"
    inputs = ["x", "w"] + (["b"] if b is not None else [])
    inits = [const("w", w)] + ([const("b", b)] if b is not None else [])
    shapes = ([1, C, HW, HW], [1, C, HW, HW]) if conv else ([M, K], [M, N])
    return model([helper.make_node(op, inputs, ["y"], **(conv_attrs() if conv else {}))], inits, *shapes)


# --- sessions -----------------------------------------------------------------------------
def session(proto, optimized=True, dump=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimized
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    if dump:
        so.optimized_model_filepath = dump
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def fused_ops(proto, tmp) -> str:
    session(proto, dump=tmp)
    ops = [n.op_type for n in onnx.load(tmp).graph.node]
    return "+".join(o for o in ops if o not in ("Cast",))


def one_minus_cos(a, b) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(1.0 - a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# --- data ---------------------------------------------------------------------------------
def make_data(kind: str, op: str, rng) -> tuple:
    conv = op == "Conv"
    x = rng.standard_normal((1, C, HW, HW) if conv else (M, K)).astype(np.float32)
    wshape = (C, C, KS, KS) if conv else (K, N)
    fan_in = C * KS * KS if conv else K
    w = rng.standard_normal(wshape) / np.sqrt(fan_in)
    if kind == "relu":
        x = np.abs(x)
    elif kind == "uniform":
        x = rng.uniform(-1.0, 1.0, x.shape).astype(np.float32)
        w = rng.uniform(-1.0, 1.0, wshape) / np.sqrt(fan_in)
    elif kind == "outlier":
        channels = rng.choice(C if conv else K, max(1, (C if conv else K) * 3 // 100), replace=False)
        x[:, channels] *= 20.0
        w = rng.standard_t(3, wshape) / np.sqrt(fan_in)
    b = (0.1 * rng.standard_normal(C if conv else N)).astype(np.float32)
    return x, w.astype(np.float32), b


CASES = {  # name: (op, graph kind, bias, output quantized)
    "dyn MatMul": ("MatMul", "dynamic", False, False),
    "dyn Conv": ("Conv", "dynamic", False, False),
    "QDQ MatMul": ("MatMul", "qdq", False, True),
    "QDQ MatMul→f": ("MatMul", "qdq", False, False),
    "QDQ Gemm": ("Gemm", "qdq", True, True),
    "QDQ Conv": ("Conv", "qdq", True, True),
}


def build(case: str, kind: str, data: tuple) -> tuple:
    """(integer model, exact model, float model)."""
    op, graph, bias, out_q = CASES[case]
    x, w, b = data
    b = b if bias else None  # Gemm(x, W[K, N]) + b: weights per column, as MatMul
    ref = float_graph(op, w, b)
    if graph == "dynamic":
        integer, exact = dynamic_graphs(op, w, kind)
        return integer, exact, ref
    y_ref = session(ref).run(None, {"x": x})[0]
    q = qdq_graph(op, w, b, kind, x, y_ref, out_q)
    return q, q, ref


def accuracy(rows: dict, tmp: str) -> None:
    rng = np.random.default_rng(0)
    for data_kind in DATA:
        cache = {}
        for case, (op, *_rest) in CASES.items():
            data = cache.setdefault(op if op != "Gemm" else "MatMul", make_data(data_kind, op, rng))
            for kind in ENCODINGS:
                row = rows.setdefault((case, kind), {})
                try:
                    integer, exact, ref = build(case, kind, data)
                    feed = {"x": data[0]}
                    y_ref = session(ref).run(None, feed)[0]
                    row[data_kind] = (one_minus_cos(session(integer).run(None, feed)[0], y_ref),
                                      one_minus_cos(session(exact, optimized=False).run(None, feed)[0], y_ref))
                    row.setdefault("fused", fused_ops(integer, tmp))
                except Exception as exc:  # an encoding ORT does not run: recorded, not fatal
                    row[data_kind] = None
                    message = str(exc).split("Status Message:")[-1].strip().splitlines()[0]
                    row.setdefault("fused", f"n/a: {message.split(') const ')[-1][:90]}")


def speed(rows: dict, runs: int) -> dict:
    rng = np.random.default_rng(1)
    data = {"MatMul": make_data("normal", "MatMul", rng), "Conv": make_data("normal", "Conv", rng)}
    sessions = {}
    for case, (op, *_rest) in CASES.items():
        d = data["Conv" if op == "Conv" else "MatMul"]
        sessions[(case, "float")] = (session(build(case, "s8", d)[2]), d[0])
        for kind in ENCODINGS:
            if rows[(case, kind)].get("normal") is not None:
                sessions[(case, kind)] = (session(build(case, kind, d)[0]), d[0])
    times = {key: [] for key in sessions}
    keys = list(sessions)
    for sess, x in sessions.values():  # warm-up
        for _ in range(5):
            sess.run(None, {"x": x})
    for r in range(runs):
        shift = r % len(keys)
        for key in keys[shift:] + keys[:shift]:
            sess, x = sessions[key]
            t0 = time.perf_counter()
            sess.run(None, {"x": x})
            times[key].append(time.perf_counter() - t0)
    return {key: statistics.median(v) * 1e3 for key, v in times.items()}


def cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return platform.processor()
    model_name = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), "?")
    flags = next((l.split(":", 1)[1].split() for l in text.splitlines() if l.startswith("flags")), [])
    simd = [f for f in flags if f.startswith(("avx", "amx")) or "vnni" in f]
    return f"{model_name}; SIMD flags: {' '.join(simd) or 'none'}"


def render(rows: dict, ms: dict, runs: int, command: str) -> str:
    fmt = lambda v: "—" if v is None else f"{v[0]:.1e} ({v[1]:.1e})"
    out = [f"# Int8 weight encodings on ONNX Runtime's CPU kernels — {date.today().isoformat()}", "",
           f"Command: `{command}`", "",
           f"Machine: {cpu_flags()}; onnxruntime {ort.__version__}, numpy {np.__version__}, Python "
           f"{platform.python_version()}.", "",
           f"Shapes: MatMul/Gemm [{M}, {K}]·[{K}, {N}]; Conv [1, {C}, {HW}, {HW}] * [{C}, {C}, {KS}, {KS}] pads 1. "
           "Accuracy cells: `1 − cos` vs float of ORT's integer kernels (in brackets: the same quantized model "
           "computed exactly, i.e. fake-quantized in float) — a cell far above its bracket is kernel loss "
           f"(saturation). Speed: median ms of {runs} interleaved runs, one intra-op thread, `normal` data.", "",
           "| case | weights | normal | relu | uniform | outlier | ms | float ms | ORT kernel |",
           "|---|---|---|---|---|---|---|---|---|"]
    for (case, kind), row in rows.items():
        t = ms.get((case, kind))
        out.append(f"| {case} | {kind} | {fmt(row.get('normal'))} | {fmt(row.get('relu'))} | "
                   f"{fmt(row.get('uniform'))} | {fmt(row.get('outlier'))} | {'—' if t is None else f'{t:.3f}'} | "
                   f"{ms[(case, 'float')]:.3f} | {row.get('fused', '')} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the markdown table here (printed anyway)")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args(argv)
    import tempfile
    rows: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        accuracy(rows, f"{tmp}/opt.onnx")
    ms = speed(rows, args.runs)
    command = "python benchmarks/measure_int8_saturation.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = render(rows, ms, args.runs, command.strip())
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
