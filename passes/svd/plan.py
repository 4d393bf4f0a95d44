"""The per-layer rule of ``svd`` (``alloc=layer``, or a rank / ratio / energy given): one
layer's rank, factorisation mode and whether it pays off.

Rank ``r`` from :meth:`.maths.factor.Factorization.choose_rank` (``rank``, ``ratio``,
``energy`` or, by default, the per-layer output cosine ``√(kept energy) ≥ cosine``; with
whitening and held-out statistics the held-out cosine of each rank). Whitening needs at
least ``MIN_ROWS_PER_INPUT · k`` calibration rows (a rank-deficient Gram matrix would not
generalise). Modes of a 2-D k×k Conv (``spatial``):

    kxk:        W ≈ A B,      cost r·(k + n) weights,          break-even r < k n / (k + n)
    separable:  k×1 then 1×k (:mod:`.maths.spatial`),  cost r·(C·kh + n·kw) weights

``separable`` is taken when asked for, or (``auto``) when its rank pays off and the k×k rank
does not, or it needs fewer FLOPs. Unless ``force``: a rank past the break-even, or a
factorised layer that is slower (:func:`.speed.decide`), keeps the layer (a counted reason).
The plan's ``damage`` orders plans for the end-to-end target: ``(1 − cos²) / ΔFLOPs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnxslim_kit.api import PassResult

from onnxslim_kit.passes._common.layer_stats import Layer
from onnxslim_kit.passes.svd.maths.factor import Factorization, HeadsFactorization, breakeven_rank
from onnxslim_kit.passes.svd.maths.spatial import (
    separable_attrs,
    separable_breakeven,
    separable_factorization,
    separable_flops,
)
from onnxslim_kit.passes.svd.speed import decide, flops

MIN_ROWS_PER_INPUT = 2  # whiten only with at least 2·k calibration rows (else Gram is rank-deficient)


@dataclass(eq=False)
class Plan:
    layer: Layer
    r: int
    a: np.ndarray
    b: np.ndarray
    rows: int
    damage: float  # (1 − kept energy) per FLOP saved
    note: str
    flops_after: int = 0
    params_after: int = 0
    mode: str = "kxk"  # or "separable" (k×1 then 1×k)


def layer_name(layer: Layer) -> str:
    return f"{layer.node.name or layer.node.op} {layer.k}×{layer.n}"


def weight_shape(layer: Layer) -> tuple:
    return layer.node.inputs[1].values.shape if layer.kind == "conv" else (layer.k, layer.n)


def node_attrs(layer: Layer) -> tuple:
    """The node's attributes as a hashable tuple (the speed measurements' cache key)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in layer.node.attrs.items()))


def plan_layer(layer: Layer, entry, opts, data_aware: bool, result: PassResult) -> tuple:
    """``(Plan or None, one-line note)`` for ``layer``."""
    name, fact, heldout = _factorization(layer, entry, data_aware)
    r, _rule = fact.choose_rank(opts["rank"], opts["ratio"], opts["energy"], opts["cosine"], heldout)
    cos = float(heldout[r - 1]) if heldout is not None else math.sqrt(fact.kept_energy(r))
    rows = entry.rows_per_sample
    cand = {"mode": "kxk", "r": r, "cos": cos, "breakeven": breakeven_rank(layer.k, layer.n), "fact": fact,
            "flops": flops(rows, layer.k, layer.n, r), "params": r * (layer.k + layer.n) * layer.heads}
    cand = _mode(layer, entry, opts, cand)
    r, cos, breakeven = cand["r"], cand["cos"], cand["breakeven"]
    if cand["mode"] == "separable":
        name += " separable"
    if not opts["force"]:
        kept = _kept(layer, entry, opts, cand, result)
        if kept is not None:
            return None, f"{name}: {kept}"
    a, b = cand["fact"].factors(r)
    saved = max(flops(rows, layer.k, layer.n) - cand["flops"], 1)
    fact = cand["fact"]
    shrunk = f", shrinkage {fact.shrinkage:.2f}" if fact.shrinkage is not None else ""
    where = "held-out" if heldout is not None and cand["mode"] == "kxk" else "est."
    note = f"{name}: r={r} (break-even {breakeven}), {where} output cosine {cos:.5f}{shrunk}"
    return Plan(layer, r, a, b, rows, (1 - cos**2) / saved, note, cand["flops"], cand["params"],
                cand["mode"]), note


def _factorization(layer: Layer, entry, data_aware: bool) -> tuple:
    """``(note name, factorisation, held-out cosine per rank or None)``: whitened when the
    statistics allow it, plain otherwise (per head for a batched weight)."""
    name = layer_name(layer)
    whiten = data_aware and entry.gram_rows >= MIN_ROWS_PER_INPUT * layer.k and layer.kind != "batched"
    if data_aware and not whiten:
        name += f" (plain: {entry.gram_rows} rows < {MIN_ROWS_PER_INPUT}·k)"
    if layer.kind == "batched":
        name = f"{layer.node.name or layer.node.op} {layer.heads}×{layer.k}×{layer.n} (per head, plain)"
        fact = HeadsFactorization(layer.node.inputs[1].values)
    else:
        fact = Factorization(layer.matrix, entry.normalized_gram if whiten else None,
                             entry.gram_rows, entry.fourth)
    heldout = None
    if whiten and entry.half(1)[0] is not None:
        fit_gram, fit_rows, fit_fourth = entry.half(0)
        heldout = Factorization(layer.matrix, fit_gram, fit_rows, fit_fourth).heldout_cosine(
            layer.matrix, entry.half(1)[0])
    return name, fact, heldout


def _mode(layer: Layer, entry, opts, kxk: dict) -> dict:
    """The k×k candidate, or the separable one when ``spatial`` asks for it or it is cheaper."""
    separable = _separable(layer, entry, opts, weight_shape(layer))
    if separable is not None and (opts["spatial"] == "separable" or (
            separable["r"] <= separable["breakeven"] and
            (kxk["r"] > kxk["breakeven"] or separable["flops"] < kxk["flops"]))):
        return separable
    return kxk


def _kept(layer: Layer, entry, opts, cand: dict, result: PassResult) -> str | None:
    """Why the layer stays as it is (the rank does not pay off, or it would be slower), or None."""
    r, breakeven = cand["r"], cand["breakeven"]
    if r > breakeven:
        result.skip("rank needed does not pay off")
        return f"r={r} > break-even {breakeven}, kept"
    attrs = node_attrs(layer)
    kind = "matmul" if layer.kind != "conv" else ("separable" if cand["mode"] == "separable" else "conv")
    if kind == "separable":
        attrs = tuple(tuple((k, tuple(v)) for k, v in part.items()) for part in separable_attrs(layer.geometry))
    faster, how = decide(kind, entry.shape, weight_shape(layer), entry.rows_per_sample, layer.k, layer.n, r, attrs,
                         opts["measure"], after=cand["flops"])
    if not faster:
        result.skip("factorised layer would be slower")
        return f"r={r} would be slower ({how}), kept"
    return None


def _separable(layer: Layer, entry, opts, w_shape) -> dict | None:
    """The k×1-then-1×k candidate of a 2-D k×k Conv (None when it does not apply)."""
    if (layer.kind != "conv" or opts["spatial"] == "kxk" or layer.geometry is None
            or min(layer.geometry.kernel) < 2 or len(entry.shape) != 4):
        return None
    n, c, kh, kw = w_shape
    fact = separable_factorization(layer.node.inputs[1].values)
    r, _rule = fact.choose_rank(opts["rank"], opts["ratio"], opts["energy"], opts["cosine"])
    return {"mode": "separable", "r": r, "cos": math.sqrt(fact.kept_energy(r)), "fact": fact,
            "breakeven": separable_breakeven(n, c, kh, kw), "params": r * (c * kh + n * kw),
            "flops": separable_flops(entry.shape, entry.rows_per_sample, layer.geometry, n, c, r)}
