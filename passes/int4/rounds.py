"""Quantizing ``int4`` layers: Hessians in rounds, RTN / GPTQ / AWQ per layer, constants to store.

Hessian of a layer's input ``X`` (rows = tokens over the calibration samples)::

    H = 2 XᵀX                       (summed over samples, :func:`.gptq.hessian_update`)

Layers reading one input tensor share ``H`` and its GPTQ factor (Cholesky of H⁻¹ with
dampening ``damp · mean(diag H)``, :func:`.gptq.gptq_factor`). Memory: :func:`hessian_rounds`
takes the Hessians in rounds of ≤ :data:`HESSIAN_BYTES_PER_ROUND` (K² · 8 bytes each), every
round from the model as it is when the round starts, so a caller that quantizes a round's
layers before taking the next holds one round's Hessians; results held for later (the
mixed-precision choice) keep their 4-bit codes two to a byte (:func:`packed`). A pass over the
samples reads every weight (issue 16's 2.75 GB decoder: ≈ 1.5 s a sample), and a round of
64 MB holds one Hessian of K = 2048 or three of 1536 — 25 rounds there, × 4 samples each. When
the calibration rows are few (X [R, K] smaller than XᵀX [K, K] when R < 2K: 4 samples × 32
tokens there), one pass keeps every input's rows (≤ :data:`ROWS_BYTES_ONE_PASS`, 133 MB there)
and every round sums its Hessians from them.

RTN without the range search (:func:`_rtn_layers`) quantizes :data:`LAYER_THREADS` layers at once
(each layer's read, rounding and the mixed-precision step's proxy and dequantized copy — numpy
and BLAS release the GIL; one BLAS thread each), at most one layer more in flight than threads, the
scratch writes in the layers' order: the same values as one at a time.

AWQ (:func:`apply_awq`): per input tensor, ``Y = (A·diag(1/s))·(diag(s)·W)``; ``s`` from
:func:`.awq.search_scales`, one ``Mul(A, 1/s)`` per input, Hessian of the scaled input
``diag(1/s)·H·diag(1/s)``.

Encoding (:func:`encode`): ``nbits`` = MatMulNBits B [N, n_blocks, bs/2] uint8, scales
[N·n_blocks], zero points packed; ``qdq`` = INT4/UINT4 [K, N] codes, scales [n_blocks, N].
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.model import Model
from onnxslim_kit.api import PassResult
from onnxslim_kit.runtime import give_back

import onnxslim_kit.passes.int4.awq as _int4_awq
import onnxslim_kit.passes.int4.gptq as _int4_gptq
import onnxslim_kit.passes.int4.quant as _int4_quant
from onnxslim_kit.passes.int4.target import Target
from onnxslim_kit.passes._common.blas import blas_threads
from onnxslim_kit.passes._common.graph import new_constant

HESSIAN_BYTES_PER_ROUND = 64 << 20
ROWS_BYTES_ONE_PASS = 256 << 20  # the inputs' rows one pass may keep for all rounds (module docstring)
LAYER_THREADS = 2  # RTN layers quantized at once (numpy and BLAS release the GIL; :func:`_rtn_layers`)


def hessian_rounds(model: Model, targets: list, ctx):
    """Yields {input tensor name: summed XᵀX} for the targets, one round (≤
    ``HESSIAN_BYTES_PER_ROUND``) at a time, from the model as it is when the first round starts
    (the caller changes the graph only after the last); a caller that quantizes a round's
    layers before taking the next holds one round's Hessians. With several rounds, one pass
    over the samples keeps the rows of every input when they take ≤ :data:`ROWS_BYTES_ONE_PASS`
    (:func:`_all_rows`), and each round's Hessians are summed from them (the same products in
    the same order: the same values); else each round runs its own pass."""
    inputs = {}
    for t in targets:
        inputs.setdefault(t.node.inputs[0].name, t.shape[1])
    graph_inputs = {t.name for t in model.graph.inputs}
    samples = ctx.feed.take(ctx.options["samples"])
    threads = ctx.options["threads"]
    batches = _batches(inputs)
    rows = _all_rows(model, list(inputs), graph_inputs, samples) if len(batches) > 1 else None
    for batch in batches:
        if rows is None:
            yield _round_hessians(model, batch, graph_inputs, samples, threads)
        else:
            yield _sums(rows, batch, threads)
        give_back()  # the caller's work on the round (GPTQ factors, copies), before the next session


def _batches(inputs: dict) -> list:
    """The input names in rounds of ≤ ``HESSIAN_BYTES_PER_ROUND`` of Hessians (K² · 8 bytes each; a
    larger one alone)."""
    batches, batch, used = [], [], 0
    names = list(inputs)
    for i, name in enumerate(names):
        batch.append(name)
        used += inputs[name] ** 2 * 8
        if used < HESSIAN_BYTES_PER_ROUND and i + 1 < len(names):
            continue
        batches.append(batch)
        batch, used = [], 0
    return batches


def _all_rows(model: Model, names: list, graph_inputs: set, samples: list):
    """Per sample, a copy of every ``names`` tensor (one ORT session), or None as soon as the
    copies would pass :data:`ROWS_BYTES_ONE_PASS` (the first sample's bytes × the samples)."""
    exposed = [n for n in names if n not in graph_inputs]
    acts = iter_activations(model.to_proto(), exposed, samples) if exposed else ({} for _ in samples)
    kept, used = [], 0
    for sample, values in zip(samples, acts):
        kept.append({n: np.array(sample[n] if n in graph_inputs else values[n], dtype=np.float32) for n in names})
        used += sum(x.nbytes for x in kept[-1].values())
        if max(used, used * len(samples) // len(kept)) > ROWS_BYTES_ONE_PASS:
            kept = None
            break
    acts = values = None  # the session (in the generator) and the last sample's tensors
    give_back()
    return kept


def _sums(rows: list, batch: list, threads: int) -> dict:
    """Summed XᵀX of the ``batch`` tensors from :func:`_all_rows`' copies, which it drops."""
    hessians = {}
    with blas_threads(threads):
        for per_sample in rows:
            for n in batch:
                hessians[n] = _int4_gptq.hessian_update(hessians.get(n), per_sample.pop(n))
    return hessians


def _round_hessians(model: Model, batch: list, graph_inputs: set, samples: list, threads: int) -> dict:
    """Summed XᵀX of the ``batch`` input tensors over ``samples`` (one ORT session)."""
    exposed = [n for n in batch if n not in graph_inputs]
    acts = iter_activations(model.to_proto(), exposed, samples) if exposed else ({} for _ in samples)
    hessians = {}
    with blas_threads(threads):
        for sample, values in zip(samples, acts):
            for n in batch:
                x = sample[n] if n in graph_inputs else values[n]
                hessians[n] = _int4_gptq.hessian_update(hessians.get(n), x)
    acts = values = None  # the session (in the generator) and the last sample's tensors
    give_back()  # the round's session and activations went back to malloc, which keeps them
    return hessians


def hessians(model: Model, targets: list, ctx) -> dict:
    """Summed XᵀX per input tensor name of the targets (all rounds at once)."""
    out = {}
    for part in hessian_rounds(model, targets, ctx):
        out.update(part)
    return out


def quantize_all(model: Model, targets: list, opts: dict, ctx, result: PassResult, visit=None) -> dict:
    """{target key: quantized weight} for the targets, Hessians (gptq, search) taken and dropped
    round by round — so a model of many large layers never holds all their Hessians and GPTQ
    factors at once; every Hessian comes from the model as it was on entry. ``visit(target,
    Wt, qw)``, when given, sees each layer's float weight and its result (codes a byte each)
    while the weight is read anyway (the mixed-precision step's proxy and emulation copies)."""
    keys = {}
    for t in targets:
        keys.setdefault(t.key, t)

    def one(t, xtx, factors):
        wt = t.load()
        qw = quantize(t, opts, xtx, factors, result, wt)
        if visit is not None:
            kept = visit(t, wt, qw)
            if kept is not None:
                kept()
        return packed(qw)

    if not (opts["method"] == "gptq" or opts["search"]):
        return _rtn_layers(keys, opts, result, visit)
    done = {}
    for round_h in hessian_rounds(model, list(keys.values()), ctx):
        factors: dict = {}  # per input tensor: layers reading one input share H and its factor
        for k, t in keys.items():
            if k not in done and t.node.inputs[0].name in round_h:
                done[k] = one(t, round_h[t.node.inputs[0].name], factors)
        del factors, round_h
    return done


def _rtn_layers(keys: dict, opts: dict, result: PassResult, visit) -> dict:
    """{key: packed RTN result} of ``keys``' targets, :data:`LAYER_THREADS` layers at a time (each
    layer's values do not depend on the others: the same results in any order); ``visit``'s
    returned callable (the scratch write) runs here, in the layers' order."""
    def one(t):
        wt = t.load()
        qw = quantize(t, opts, None, {}, result, wt)
        kept = visit(t, wt, qw) if visit is not None else None
        del wt
        return packed(qw), kept

    items, done = list(keys.items()), {}
    workers = max(1, min(LAYER_THREADS, os.cpu_count() or 1, len(items)))
    with blas_threads(1), ThreadPoolExecutor(workers) as pool:  # one BLAS thread per layer thread
        pending = deque()

        def take():
            k, future = pending.popleft()
            done[k], kept = future.result()
            if kept is not None:
                kept()

        for k, t in items:
            pending.append((k, pool.submit(one, t)))
            if len(pending) > workers:  # at most workers + 1 layers in flight
                take()
        while pending:
            take()
    return done


def quantize_awq(model: Model, targets: list, opts: dict, ctx, result: PassResult) -> dict:
    """``awq=true``: scale the targets' inputs (:func:`apply_awq`), then quantize each against
    the Hessian of its scaled input; {target key: quantized weight}."""
    scaled = apply_awq(model, targets, hessians(model, targets, ctx) if targets else {}, opts, result)
    factors: dict = {}  # per input tensor: layers reading one input share H and its factor
    return {t.key: quantize(t, opts, scaled.get(t.node.inputs[0].name), factors, result) for t in targets}


def packed(qw: _int4_quant.QuantizedWeight) -> _int4_quant.QuantizedWeight:
    """``qw`` with its codes two to a byte (held until encoding: 64 layers of 1024×1024, 32 MB less)."""
    return replace(qw, q=_int4_quant.pack_nibbles(qw.q))


def codes(qw: _int4_quant.QuantizedWeight) -> _int4_quant.QuantizedWeight:
    """``qw`` with a code per byte (unpacks a :func:`packed` result)."""
    width = qw.n_blocks * qw.block_size
    return qw if qw.q.shape[1] == width else replace(qw, q=_int4_quant.unpack_nibbles(qw.q, width))


def apply_awq(model: Model, targets: list, hessians: dict, opts: dict, result: PassResult) -> dict:
    """Per input tensor of ``targets``: search s (:mod:`onnxslim_kit.passes.int4.awq`), scale the weights by s, make
    the layers read ``Mul(A, 1/s)``; returns the Hessians keyed by the (new) input names."""
    groups: dict = {}
    for t in targets:
        groups.setdefault(t.node.inputs[0].name, []).append(t)
    out = dict(hessians)
    for name, group in groups.items():
        xtx = hessians.get(name)
        if xtx is None or not np.all(np.isfinite(xtx)):
            result.skip("awq: no usable activation statistics", len(group))
            continue
        s, alpha, _ = _int4_awq.search_scales([t.load() for t in group], xtx, opts["block_size"], opts["symmetric"],
                                              opts["search"])
        result.metrics.setdefault("awq_alpha", []).append(alpha)
        if alpha == 0:
            continue
        a = group[0].node.inputs[0]
        scaled = gs.Variable(model.fresh_name("int4/awq_in"), group[0].dtype, a.shape)
        inv = new_constant(model, "int4/awq_inv_scale", (1.0 / s).astype(group[0].dtype))
        result.metrics["awq_scale_bytes"] = result.metrics.get("awq_scale_bytes", 0) + inv.values.nbytes
        model.graph.nodes.append(gs.Node("Mul", model.fresh_name("int4/awq_Mul"), {}, [a, inv], [scaled]))
        for t in group:
            t.col_scale = s
            t.node.inputs[0] = scaled
        out[scaled.name] = _int4_awq.scaled_hessian(xtx, s)
        result.rewrite("awq input scaling (Mul)")
    return out


def quantize(target: Target, opts: dict, xtx, factors: dict, result: PassResult, wt=None) -> _int4_quant.QuantizedWeight:
    """GPTQ with the (shared, cached in ``factors``) factor of ``xtx`` when usable, else RTN
    (with the diag-H weighted range search when ``search``); ``wt``: the float weight when
    the caller read it (:meth:`Target.load`)."""
    wt = target.load() if wt is None else wt
    if opts["method"] == "gptq" and xtx is not None:
        name = target.node.inputs[0].name
        if name not in factors:
            try:
                factors[name] = _int4_gptq.gptq_factor(xtx, opts["damp"], opts["threads"], opts["act_order"]) if np.all(np.isfinite(xtx)) else None
            except np.linalg.LinAlgError:
                factors[name] = None
        if factors[name] is not None:
            return _int4_gptq.quantize_gptq(wt, xtx, opts["block_size"], opts["symmetric"], opts["damp"],
                                            search=opts["search"], factor=factors[name],
                                            threads=opts["threads"])
        result.skip("gptq: Hessian not usable (non-finite / not positive definite), RTN used")
    importance = np.diag(xtx).astype(np.float32) if opts["search"] and xtx is not None else None
    return _int4_quant.quantize_rtn(wt, opts["block_size"], opts["symmetric"], opts["search"], importance)


def encode(model: Model, qw, dtype, fmt: str) -> tuple:
    """(the layer's shape (k, n, block_size), [weight, scales, zero points or None] as constants,
    bytes they take). The codes of ``qw`` (a byte per weight) are not kept: the cache holds the
    packed constants only (streaming a 256 MB model: 64 MB less)."""
    shape = SimpleNamespace(k=qw.k, n=qw.n, block_size=qw.block_size)
    if fmt == "nbits":
        b, scales, zeros = _int4_quant.nbits_arrays(qw, dtype)
        consts = [new_constant(model, "int4/B", b), new_constant(model, "int4/scales", scales),
                  new_constant(model, "int4/zero_points", zeros) if zeros is not None else None]
        return shape, consts, b.nbytes + scales.nbytes + (zeros.nbytes if zeros is not None else 0)
    codes_, scales, zeros = _int4_quant.qdq_arrays(qw, dtype)
    consts = [
        _int4_quant.int4_tensor(model.fresh_name("int4/w"), codes_, signed=qw.symmetric),
        new_constant(model, "int4/scales", scales),
        _int4_quant.int4_tensor(model.fresh_name("int4/zero_points"), zeros, signed=False)
        if zeros is not None else None,
    ]
    size = (codes_.size + 1) // 2 + (((zeros.size + 1) // 2) if zeros is not None else 0)
    return shape, consts, size + scales.nbytes
