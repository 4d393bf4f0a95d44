"""Physically remove channel units found by :mod:`onnxslim_kit.passes.prune.groups`.

Given the set of removed units, every tensor with a layout keeps the positions whose unit
survives (``keep[name]``, a boolean mask). In this order:

1. parameters of pass-through nodes are sliced along their channel axis (BN γ/β/μ/σ², PRelu
   slopes, per-channel Add/Mul/… constants, depthwise weights and bias — and ``group`` becomes
   the new channel count); a Resize ``sizes`` entry is rewritten, and a flattening Reshape
   with a fixed feature count gets the target ``[0, …, 0, -1]`` (leading dims copied);
2. sources lose output channels: ``W ← W[keep]`` on the output axis (Conv axis 0,
   ConvTranspose axis 1, Gemm axis 0 with ``transB`` else 1, MatMul axis 1), bias/C likewise;
3. consumers lose input channels (for a flattened layout channel c is the rows
   ``o·C·inner + c·inner + i``). Removed inputs that carry a known constant ``v`` (strip) add
   their contribution to the consumer's bias first, so the output is unchanged::

       Conv:   b'[o] = b[o] + Σ_{k removed} v_k · Σ_{kh,kw} W[o, k, kh, kw]
       ConvTranspose: the same with W[k, o, kh, kw] / (sh·sw) — exact only for v = 0 (strip
               passes only zeros there); for a removed channel's mean it is the average over
               output pixels away from the borders
       Gemm:   C'    = C + (α/β) · v_removed · W_eff[removed, :]      (W_eff = Bᵀ if transB)
       MatMul: y' = x' W' + v_removed · W[removed, :]   (a following constant Add takes it,
               otherwise a new Add node)

   For a Conv with padding the contribution is not uniform at the borders, so callers only
   pass constants for Conv consumers without padding or with ``v = 0``.

Every changed constant is a new ``gs.Constant`` (``model.fresh_name("prune/...")``); nothing
shared is edited. Shapes recorded on changed intermediate tensors are dropped (they would be
stale); ONNX Runtime infers them again.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.passes._common.graph import attr, const_value, new_constant
from onnxslim_kit.passes.prune.held import constant, release_constant


def keep_masks(cg, removed: set) -> dict:
    removed_arr = np.array(sorted(removed), dtype=np.int64)
    return {name: ~np.isin(cg.units_of(name), removed_arr) for name in cg.layouts}


def expand(mask: np.ndarray, layout) -> np.ndarray:
    """Channel mask → feature mask for a flattened layout (identity otherwise)."""
    if layout.flat is None:
        return mask
    outer, inner = layout.flat
    return np.tile(np.repeat(mask, inner), outer)


def set_input(model, node, index: int, values: np.ndarray) -> None:
    """``node``'s input ``index`` becomes a new constant of ``values`` (:func:`.held.constant`);
    the pages of the map it held, if it was a weight left on disk, are dropped."""
    if index < len(node.inputs):
        release_constant(node.inputs[index])
    const = constant(model, f"prune/{node.name or node.op}", values)
    while len(node.inputs) <= index:
        node.inputs.append(gs.Variable.empty())
    node.inputs[index] = const


def apply(model, cg, removed: set, constants: dict | None = None) -> dict:
    """Remove ``removed`` units; ``constants``: consumer index → input values (NaN = not constant)."""
    keep = keep_masks(cg, removed)
    changed = {name for name, mask in keep.items() if not mask.all()}
    for p in cg.params:
        name = p.tensor.name
        if name not in changed:
            continue
        value = const_value(p.node.inputs[p.index])
        if p.axis == -1:  # Resize sizes: the channel entry becomes the new count
            value = value.copy()
            value[cg.layouts[name].axis] = int(keep[name].sum())
        else:
            value = np.compress(keep[name], value, axis=p.axis)
        set_input(model, p.node, p.index, value)
    for node, tensor in cg.depthwise:
        if tensor.name in changed:
            node.attrs["group"] = int(keep[tensor.name].sum())
    for node, pos in cg.reshapes:
        if node.inputs[0].name in changed:
            set_input(model, node, 1, np.array([0] * pos + [-1], dtype=np.int64))
    for s in cg.sources:
        name = s.node.outputs[0].name
        if name in changed:
            _slice_source(model, s, keep[name])
    for i, c in enumerate(cg.consumers):
        name = c.tensor.name
        if name not in changed:
            continue
        layout = cg.layouts[name]
        mask = expand(keep[name], layout)
        if constants and i in constants:
            values = expand(constants[i], layout)
            _fold_constant(model, c, np.where(mask, 0.0, np.nan_to_num(values)))
        w = const_value(c.node.inputs[1])
        set_input(model, c.node, 1, np.compress(mask, w, axis=c.in_axis))
    for name in changed:
        tensor = cg.tensors[name]
        if isinstance(tensor, gs.Variable) and not any(t is tensor for t in cg.graph.outputs):
            tensor.shape = None
    return keep


def _slice_source(model, s, mask) -> None:
    node = s.node
    w = const_value(node.inputs[1])
    set_input(model, node, 1, np.compress(mask, w, axis=s.out_axis))
    if len(node.inputs) > 2 and isinstance(node.inputs[2], gs.Constant):
        b = const_value(node.inputs[2])
        if b.ndim and b.shape[-1] == len(mask):
            set_input(model, node, 2, np.compress(mask, b, axis=b.ndim - 1))


def _has_bias(node) -> bool:
    return len(node.inputs) > 2 and isinstance(node.inputs[2], gs.Constant)


def _fold_constant(model, c, values: np.ndarray) -> None:
    """Add the removed inputs' constant contribution (``values``: 0 where kept) to the bias."""
    if not np.any(values):
        return
    node = c.node
    w_dtype = const_value(node.inputs[1]).dtype
    w = const_value(node.inputs[1]).astype(np.float64)
    if c.kind in ("conv", "convT"):
        taps = w.reshape(w.shape[0], w.shape[1], -1)
        if c.kind == "convT":  # [C_in, C_out, k…]: per output pixel, prod(k)/prod(strides) taps on average
            strides = attr(node, "strides", None) or [1] * (w.ndim - 2)
            taps = np.moveaxis(taps, 1, 0) / float(np.prod(strides))
        contrib = np.einsum("k,oks->o", values, taps)
        bias = const_value(node.inputs[2]).astype(np.float64) if _has_bias(node) else 0.0
        set_input(model, node, 2, (bias + contrib).astype(w_dtype))
        return
    w_eff = w.T if (c.kind == "gemm" and int(attr(node, "transB", 0))) else w
    contrib = values @ w_eff
    if c.kind == "gemm":
        alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
        contrib = alpha * contrib
        if _has_bias(node) and beta != 0.0:
            new_c = const_value(node.inputs[2]) + contrib / beta
        else:
            new_c = contrib
            node.attrs["beta"] = 1.0
        set_input(model, node, 2, new_c.astype(w_dtype))
        return
    _add_after_matmul(model, node, contrib.astype(w_dtype))


def _add_after_matmul(model, node, contrib: np.ndarray) -> None:
    out = node.outputs[0]
    users = out.outputs
    if len(users) == 1 and users[0].op == "Add" and not any(t is out for t in model.graph.outputs):
        add = users[0]
        other = 1 if add.inputs[0] is out else 0
        value = const_value(add.inputs[other])
        if value is not None and value.ndim <= 1:
            set_input(model, add, other, (value + contrib).astype(value.dtype))
            return
    mid = gs.Variable(model.fresh_name("prune/matmul_out"), dtype=out.dtype)
    node.outputs[0] = mid
    add = gs.Node("Add", name=model.fresh_name("prune/const_in"), inputs=[mid, new_constant(
        model, "prune/const_in", contrib)], outputs=[out])
    model.graph.nodes.append(add)
