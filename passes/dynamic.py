"""``dynamic`` — dynamic-range int8: weights quantized offline, activations at run time.

MatMul with a constant 2-D weight ``B`` (Gemm with ``transA = 0`` likewise, ``B`` transposed
when ``transB``; ``alpha`` folded into the scale, ``beta·C`` added after)::

    x ──▶ MatMul(B) ──▶ y
    x ──▶ DynamicQuantizeLinear ──▶ (x_q, s_x, z_x)
          MatMulInteger(x_q, B_q, z_x, 0) ──▶ Cast(float) ──▶ Mul(s_x · s_B) ──▶ y

``B_q = round(B / s_B)`` symmetric int8, ``s_B`` per output column (or per tensor). ONNX
Runtime fuses this exact pattern into DynamicQuantizeMatMul (checked by the tests). The
rewrite lives in :mod:`onnxslim_kit.passes._quant.dynamic` (the ``int8`` pass's ``dynamic`` rung uses it too). This
pays off on MatMul-heavy models (transformers, RNN-like heads).

With calibration samples, the MatMul/Gemm inputs are first rebalanced by SmoothQuant
(``smooth``, default ``auto``: α chosen by the fidelity it measures on the held-out samples;
:mod:`onnxslim_kit.passes._quant.dynamic_smooth`), so a few outlier channels no longer take
most of the run-time range.

Weight encoding (``weights``): ``u8`` (default) stores the int8 codes as uint8 with zero point
128: u8·u8 kernels, exact on every CPU (:mod:`onnxslim_kit.passes._quant.dynamic`). ``s8``
stores them as int8: ONNX Runtime's u8·s8 kernels, 8–10 % faster on x86-64 CPUs without VNNI
(measured on MiniLM: 0.530× against 0.570× of the float model), where they saturate int16
pair sums (the candidate is judged by the kernels of *this* machine, ORT level ``all``; a CPU
with VNNI computes the same codes exactly). A per-machine choice: ``plan`` measures it.

Conv only with ``conv=true``: ``ConvInteger`` + Cast + per-channel Mul + bias Add. ONNX
Runtime's CPU ConvInteger is slow (3–7× slower than float on conv nets, measured), hence off
by default.

Conditions: weight a float constant, activation a float tensor, main graph or subgraph alike
(no calibration is needed); weights with fewer than ``min_weights`` elements are left float;
the node is not selected by ``exclude=`` (a :mod:`onnxslim_kit.selection` selector, which
must match a node; ``NAME`` / ``re:`` / ``op:`` / ``all`` reach If/Loop bodies too,
``first`` / ``last`` count in the main graph) nor by the global ``--exclude``. Models already
quantized (any Q/DQ or integer op, e.g. quantize_dynamic's ConvInteger or DynamicQuantizeLSTM:
:func:`onnxslim_kit.passes._quant.qdq.is_quantized_op`) pass through untouched, with the counted
reason and a note naming the ops: their float layers were left float on purpose.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.errors import UserError
from onnxslim_kit.api import Option, Pass, PassResult, exclusions, register_pass
from onnxslim_kit.selection import SYNTAX, Selector
from onnxslim_kit.streaming import release_pages

from onnxslim_kit.fidelity.context import pass_fidelity
from onnxslim_kit.passes._common.graph import attr, const_value, is_onnx_op
from onnxslim_kit.passes._quant import dynamic_smooth
from onnxslim_kit.passes._quant.dynamic import dynamic_matmul, integer_op, rescale
from onnxslim_kit.passes._quant.qdq import already_quantized, quantize_weight, weight_scales


def _smooth_option(text) -> object:
    """``auto``, or α as a float in [0, 1)."""
    value = str(text).strip().lower()
    if value == "auto":
        return "auto"
    try:
        alpha = float(value)
    except ValueError:
        raise UserError(f"smooth: expected auto or a number in [0, 1), got {text!r}") from None
    if not 0.0 <= alpha < 1.0:
        raise UserError(f"smooth: α must be in [0, 1), got {alpha}")
    return alpha


@register_pass
class DynamicPass(Pass):
    name = "dynamic"
    summary = "dynamic-range int8 for MatMul/Gemm weights (MatMulInteger); Conv only on request"
    lossless = False
    options = {
        "per_channel": Option(bool, True, "per-output-column weight scales"),
        "conv": Option(bool, False, "also Conv via ConvInteger (slow on ORT's CPU provider)"),
        "min_weights": Option(int, 1024, "leave weights with fewer elements float"),
        "exclude": Option(str, "", f"leave these nodes float (a selector: {SYNTAX}); the global --exclude too", parse=Selector.parse),
        "smooth": Option(str, "auto", "SmoothQuant α for MatMul/Gemm inputs: auto (chosen by measured fidelity, "
                         "with calibration samples), 0 (off) or a value in (0, 1)", parse=_smooth_option),
        "weights": Option(str, "u8", "weight codes: u8 (zero point 128, exact on every CPU) or s8 (u8·s8 kernels: "
                          "faster on CPUs without VNNI, which saturate them)", choices=("u8", "s8")),
    }
    TARGETS = ("MatMul", "Gemm", "Conv")

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        if already_quantized(model, result):
            return result
        if model.opset < 10:
            result.skip("opset < 10 has no MatMulInteger")
            return result
        opts = ctx.options
        if opts["conv"]:
            result.notes.append("conv=true: ConvInteger runs slowly on ONNX Runtime's CPU provider "
                                "(often several times slower than float); prefer int8 for conv nets")
        alpha, peaks = self._smoothing(model, ctx, result)
        self._quantize(model, ctx, alpha, peaks, result)
        return result

    def _quantize(self, model, ctx, alpha: float, peaks: dict, result) -> None:
        """Smooth (``alpha`` > 0) the main graph's chosen MatMul/Gemm inputs, then rewrite every
        chosen layer of every graph."""
        opts = ctx.options
        graphs = list(model.all_graphs())
        excluded = self._excluded(graphs, ctx)
        dynamic_smooth.apply(model, self._smoothed_nodes(model, excluded, opts), peaks, alpha, result)
        for graph in graphs:
            for node in list(graph.nodes):
                if id(node) in excluded and is_onnx_op(node, *self.TARGETS):
                    result.skip(excluded[id(node)])
                elif is_onnx_op(node, "MatMul", "Gemm"):
                    self._matmul(model, graph, node, opts, result)
                elif is_onnx_op(node, "Conv"):
                    if opts["conv"]:
                        self._conv(model, graph, node, opts, result)
                    else:
                        result.skip("Conv left float (conv=false; ConvInteger is slow on CPU)")
        dynamic_smooth.smooth_mod.realize(model.graph)  # smoothed weights of layers left float get arrays

    def _smoothed_nodes(self, model, excluded: dict, opts) -> list:
        """The main graph's MatMul/Gemm nodes this pass rewrites (their inputs can be smoothed)."""
        return [node for node in model.graph.nodes if id(node) not in excluded and is_onnx_op(node, "MatMul", "Gemm")
                and _left_float(node, opts) is None]

    def _smoothing(self, model, ctx, result) -> tuple:
        """``(α, input peaks)`` per the ``smooth`` option (module docstring of
        :mod:`onnxslim_kit.passes._quant.dynamic_smooth`); α 0 when nothing is smoothed."""
        setting = ctx.options["smooth"]
        if setting == 0.0:
            return 0.0, {}
        nodes = self._smoothed_nodes(model, self._excluded(list(model.all_graphs()), ctx), ctx.options)
        if not nodes:
            return 0.0, {}
        if getattr(ctx.feed, "generated", False):
            result.notes.append("smooth: not applied (generated random samples do not show the model's activation "
                                "peaks; give --calib)")
            return 0.0, {}
        names = sorted(dynamic_smooth.smooth_mod.smoothable(dynamic_smooth.layers_of(nodes)))
        peaks = dynamic_smooth.input_peaks(model, names, ctx.feed.take(dynamic_smooth.PEAK_SAMPLES))
        if setting != "auto":
            return setting, peaks
        weight_bytes = sum(int(np.prod(n.inputs[1].shape)) * 4 for n in nodes)
        if weight_bytes > dynamic_smooth.SEARCH_MAX_BYTES:
            result.notes.append(f"smooth=auto: α {dynamic_smooth.LARGE_ALPHA} (not searched: "
                                f"{weight_bytes / 2**30:.1f} GB of weights, one copy per α)")
            return dynamic_smooth.LARGE_ALPHA, peaks
        fid = pass_fidelity(ctx)

        def trial(alpha):
            copy = model.snapshot()  # the arrays shared: the trial never mutates one
            self._quantize(copy, ctx, alpha, peaks, PassResult())
            return copy

        alpha, used = dynamic_smooth.choose_alpha(trial, fid)
        result.metrics["smooth_alpha"] = alpha
        result.metrics["smooth_trials"] = {str(a): round(u, 4) for a, u in used.items()}
        result.notes.append(f"smooth=auto: α {alpha} (budget used per α on {len(fid.samples)} "
                            f"{fid.judged_on or 'samples'}: " + ", ".join(f"{a}: {u:.0%}" for a, u in used.items()) + ")")
        return alpha, peaks

    @staticmethod
    def _excluded(graphs: list, ctx) -> dict:
        """``{id(node): skip reason}`` of the nodes ``exclude=`` or the global ``--exclude`` select
        (in every graph: :func:`onnxslim_kit.selection.exclusions`; a node both select: ``exclude``)."""
        return exclusions(graphs, ctx.options["exclude"], getattr(ctx, "exclude", None), "dynamic(exclude=...)",
                          ("excluded by exclude", "excluded by --exclude"), own_wins=True)

    # --- MatMul / Gemm --------------------------------------------------------------------
    def _matmul(self, model, graph, node, opts, result) -> None:
        reason = _left_float(node, opts)
        if reason is not None:
            return result.skip(reason)
        weight = node.inputs[1]
        w, alpha, bias = _matmul_weight(node)
        axis = 1 if opts["per_channel"] else None
        scales = weight_scales(w, axis)
        w_q = quantize_weight(w, scales, axis)
        dynamic_matmul(model, graph, node, node.inputs[0], w_q, (scales * alpha).astype(np.float32), bias,
                       signed=opts["weights"] == "s8")
        values = getattr(weight, "_values", None)  # a weight read from its file: its pages go
        release_pages(values.source if isinstance(values, dynamic_smooth.smooth_mod.SmoothedWeight) else values)
        result.rewrite(f"{node.op}→MatMulInteger")

    # --- Conv -----------------------------------------------------------------------------
    def _conv(self, model, graph, node, opts, result) -> None:
        x, weight = node.inputs[0], node.inputs[1]
        w = const_value(weight)
        if const_value(x) is not None or w is None or w.dtype != np.float32:
            return result.skip("Conv: weight not a float constant")
        bias = None
        if len(node.inputs) > 2:
            bias = const_value(node.inputs[2])
            if bias is None:
                return result.skip("Conv: bias not constant")
        axis = 0 if opts["per_channel"] else None
        scales = weight_scales(w, axis)
        w_q = quantize_weight(w, scales, axis)
        attrs = {k: v for k, v in node.attrs.items() if k in ("auto_pad", "dilations", "group", "kernel_shape",
                                                            "pads", "strides")}
        y, x_scale, _ = integer_op(model, graph, "ConvInteger", x, w_q, np.zeros((), np.int8), attrs)
        shape = [1, -1] + [1] * (w.ndim - 2)
        scale = scales.reshape(shape) if axis is not None else scales
        bias = bias.reshape(shape).astype(np.float32) if bias is not None else None
        rescale(model, graph, y, x_scale, scale, bias, node)
        release_pages(getattr(weight, "_values", None))
        result.rewrite("Conv→ConvInteger")


def _left_float(node, opts) -> str | None:
    """Why the MatMul/Gemm ``node`` stays float (None: the pass rewrites it), from the weight's
    type and shape alone (its values are not read: a weight left on disk stays there)."""
    x, weight = node.inputs[0], node.inputs[1]
    shape = tuple(getattr(weight, "shape", None) or ())
    if isinstance(x, gs.Constant) or not isinstance(weight, gs.Constant) or len(shape) != 2 or (
            np.dtype(weight.dtype) != np.float32):
        return f"{node.op}: weight not a 2-D float constant"
    if int(np.prod(shape)) < opts["min_weights"]:
        return f"{node.op}: weight below min_weights"
    if node.op == "Gemm":
        if attr(node, "transA", 0):
            return "Gemm: transA"
        if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].name and not isinstance(
                node.inputs[2], gs.Constant):
            return "Gemm: C not constant"
    return None


def _matmul_weight(node) -> tuple:
    """``(W as [K, N] float32, alpha, bias or None)`` of a MatMul/Gemm :func:`_left_float` passes.
    A smoothed weight is computed for this read only (``Constant.values`` would keep every
    ``diag(s)·W`` on its old constant: the 2.75 GB decoder's ``fuse,dynamic`` peaked at 2.19×)."""
    w = dynamic_smooth.smooth_mod.weight_array(node.inputs[1])
    alpha, bias = 1.0, None
    if node.op == "Gemm":
        w = w.T if attr(node, "transB", 0) else w
        alpha = float(attr(node, "alpha", 1.0))
        if len(node.inputs) > 2 and node.inputs[2] is not None and node.inputs[2].name:
            bias = (float(attr(node, "beta", 1.0)) * const_value(node.inputs[2])).astype(np.float32)
    return w, alpha, bias
