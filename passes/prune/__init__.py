"""``prune`` — remove channels for real: strip what is provably constant, or prune by importance.

Modes (chosen by the options):

* ``target=none`` (or ``0``) — **strip** only (lossless): channel units whose values are constant
  wherever they are read (all-zero filters, possibly with a bias ``b`` → ``f(b)`` after
  activations) are removed from every tensor of their dependency group; their constant
  contribution moves into the consumers' biases (:mod:`onnxslim_kit.passes.prune.strip`,
  :mod:`onnxslim_kit.passes.prune.apply`). Strip always runs first, in every mode.
* no options — strip, then **as much compute as the fidelity budget allows** (issue 18): the
  amount ``r`` of ``prune(ratio=r)`` below is searched by bisection (at most 6 judged
  candidates and a back-off's, each cut and re-fitted on the fit samples, judged per output
  view against the original on the held-out samples and, where it holds there, on up to 64 fit
  samples the re-fit did not use, :mod:`onnxslim_kit.passes.prune.search`), and the largest that holds
  ``ctx.fidelity`` (the pipeline's ``--target`` share, or the pass's own ``target=``: ``cos:V``,
  ``top1:V``, ``rel:V``, a bare number = ``cos:V``) is kept. The pipeline's ``--target none``
  means no search. Reported: ``ratio_reached`` (the share of the prunable compute removed),
  ``target``, ``budget_used``, ``budget_allowed``, the per-view figures, every trial
  (``search``: ``[r, ratio reached, budget used, held]``) and a note naming the binding view and
  the judged samples (:mod:`onnxslim_kit.passes.prune.judged`).
* ``ratio=r`` — structured pruning. **What ``r`` means** (``alloc=sensitivity``, the default, with
  ``scope=global`` and no ``max_loss``): the pruned model has lost at least the
  fraction ``r`` of the *prunable compute* (the MACs of the Conv/Gemm/MatMul channels that can be
  cut, counted with channel counts rounded up to blocks of ``multiple`` as ONNX Runtime's CPU
  kernels compute them; with ``cost=latency`` the measured milliseconds of the nodes those channels
  touch), and at least what the fraction ``r`` of the prunable channel units with the lowest
  importance carries — whichever is more (the least important channels can sit in the costly
  layers, then more than ``r`` goes), as far as ``max_ratio``, ``min_channels`` and ``multiple``
  allow. That budget is spread
  over the groups by the measured loss of the model's outputs per saved cost and checked against
  the ranked selection (:mod:`onnxslim_kit.passes.prune.sensitivity`, :mod:`onnxslim_kit.passes.prune.cost`); with ``alloc=rank`` the
  fraction ``r`` of the prunable units with the lowest importance (``criterion``, default
  ``obs``, :mod:`onnxslim_kit.passes.prune.importance`; with ``cost=macs`` per unit of compute, with
  ``cost=latency`` per millisecond of ONNX Runtime time measured node by node,
  :mod:`onnxslim_kit.passes.prune.latency`) are cut, per group (``scope=layer``) or ranked over the whole model
  (``scope=global``). Either way at least ``min_channels`` and a multiple of ``multiple`` stay
  per group, no group is cut by more than ``max_ratio`` nor (``max_loss``) by more than a share
  of its importance mass (:mod:`onnxslim_kit.passes.prune.ratio`). The removed channels' means move into the
  consumers' biases, then the consumers are re-fitted by ridge least squares toward their pruned
  weights against the model before pruning, the ridge strength chosen on held-out calibration
  samples (``refit``, :mod:`onnxslim_kit.passes.prune.refit`; one teacher run, truncated student runs,
  :mod:`onnxslim_kit.passes.prune.student`), on ``samples`` calibration samples (the ones the
  pipeline lets the passes fit). ``ratio=`` is an explicit request: exactly that ratio is cut,
  whatever the target; its verdict (the same figures as the search's) is reported, and the
  pipeline reports a missed target.
* ``sparsity=s`` / ``nm=N:M`` — unstructured / N:M magnitude sparsity on Conv/Gemm/MatMul
  weights (:mod:`onnxslim_kit.passes.prune.sparsity`); the file compresses better, inference is not faster.
  With one of them and no ``ratio=`` no amount is searched (the sparsity asked for is the request).

Dependency groups (:mod:`onnxslim_kit.passes.prune.groups`) decide what must be cut together; what cannot be
cut is skipped with the reason counted in the report.

``exclude=SELECTOR`` (:mod:`onnxslim_kit.selection`: ``NAME``, ``re:REGEX``, ``op:TYPE``,
``first:TYPE:N``, ``last:TYPE:N``, ``all``, separated by ``;``) and the global ``--exclude``
(``ctx.exclude``) keep the **output channels** of every selected node: its output layout is
blocked ("unprunable: excluded"), and with it every channel unit coupled to it (a residual
Add, a depthwise Conv after it) — channels that must be cut together are kept together. A
selected node that *reads* the channels of a pruned layer before it still loses those input
channels (its weight is sliced along the input axis and re-fitted): keeping them would keep
the producer's channels too, which ``exclude=`` of the producer does. With ``sparsity`` /
``nm`` a selected node's weight is left dense. The pass's own ``exclude=`` must select at
least one node (exit 2 with the closest names otherwise); terms of ``--exclude`` that match
nothing are ignored. ``explain=true`` adds each group's
description to the notes.

Concrete tensor shapes, needed to see through Reshape/Flatten and Resize, come from one
ONNX Runtime run of the model on the first calibration sample. Only the main graph is
pruned (convs inside If/Loop bodies are left alone).

Why ``multiple=16`` is the default: ONNX Runtime's CPU convolutions work on blocks of 16
channels with AVX-512 (8 with AVX2; a multiple of 16 is one of 8 too) — a 3×3 conv 96→24 on
120×160 takes as long as 96→32 (10.2 ms both), 96→16 takes 5.4 ms — so a channel count between
two blocks buys nothing: MTCNN-O at ``ratio=0.3`` ran at 0.83 of ``fuse``'s latency with
``multiple=8`` (MACs 0.56; 24 and 40 channels kept) and 0.59 with 16 (MACs 0.49)
(``benchmarks/prune_channel_blocks.py``, ``benchmarks/results/prune-2026-11-29-s3.md``).

Why ``obs`` is the default: on the real-looking inputs of ``benchmarks/inputs.py``,
``prune(ratio=0.3)`` on ppocr_cls_v2 keeps 100% agreement with ``taylor``/``obs`` but flips
every decision with ``l1``/``l2``/``random`` (magnitude says little about which channels the
data use; with random calibration data the difference does not show). Between the two, after
``fuse`` learned its activation rewrites (the float baseline got 10–27 % faster), ``taylor``
left PP-OCRv4 det at 0.778 of ``fuse``'s latency (cosine 0.9910) and ``obs`` at 0.738
(0.9915) for the same MACs; ``obs`` also keeps O-Net closer (0.971 vs 0.947), and it is
≥ 1.3× faster than ``fuse`` on det, rec, ppocr_cls_v2, orientation and O-Net, where
``taylor`` misses det — orientation is the one it speeds up less (0.671 vs 0.557)
(``benchmarks/results/prune-2026-11-29-s4-*``).
"""

from __future__ import annotations

import zlib
from collections import Counter
from functools import partial

import numpy as np
import onnx_graphsurgeon as gs

from onnxslim_kit.activations import iter_activations
from onnxslim_kit.errors import UserError
from onnxslim_kit.api import Option, Pass, PassResult, check_target, register_pass
from onnxslim_kit.selection import Selector

from onnxslim_kit.passes._common.graph import const_value
from onnxslim_kit.passes.prune.apply import apply
from onnxslim_kit.passes.prune.groups import analyse
from onnxslim_kit.passes.prune.strip import strippable

PRUNABLE_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
CRITERIA = ("l1", "l2", "random", "bn_scale", "activation", "taylor", "obs")


def concrete_shapes(model, sample: dict) -> dict:
    """name → shape of every main-graph tensor on ``sample``; ("value", name) → 1-D int values."""
    graph = model.graph
    names = [t.name for t in graph.tensors().values()
             if isinstance(t, gs.Variable) and t.name and not any(t is i for i in graph.inputs)]
    shapes: dict = {name: tuple(v.shape) for name, v in sample.items() if isinstance(v, np.ndarray)}
    for acts in iter_activations(model.to_proto(), names, [sample], threads=1):
        for name, value in acts.items():
            if not isinstance(value, np.ndarray):  # a sequence / optional value: no channels
                continue
            shapes[name] = tuple(value.shape)
            if value.ndim == 1 and value.dtype.kind in "iu" and value.size <= 16:
                shapes[("value", name)] = value.tolist()
    for node in graph.nodes:
        if node.op == "Reshape" and isinstance(node.inputs[1], gs.Constant):
            shapes[("value", node.inputs[1].name)] = const_value(node.inputs[1]).tolist()
    return shapes


EXCLUDE_WHERE = "prune(exclude=…)"
EXCLUDED = "excluded"


def analyse_model(model, ctx, keep=frozenset(), shapes: dict | None = None):
    """The channel graph of the main graph; the output channels of the nodes named in ``keep``
    blocked. ``shapes``: the concrete shapes (measured on the first sample when None)."""
    model.graph.toposort()
    if shapes is None:
        shapes = concrete_shapes(model, ctx.feed.take(1)[0])
    cg = analyse(model.graph, shapes)
    keep_outputs(cg, keep)
    return cg


def keep_outputs(cg, keep) -> int:
    """Block the channels of every output of the nodes named in ``keep``; returns how many tensors."""
    blocked = 0
    for node in cg.graph.nodes:
        if node.name in keep:
            for out in node.outputs:
                if out.name in cg.layouts:
                    cg.block(cg.layouts[out.name], f"{EXCLUDED} ({node.name})")
                    blocked += 1
    return blocked


def excluded_names(model, ctx) -> set:
    """Names selected by the pass's ``exclude=`` (must match) and by the global ``--exclude``."""
    own = Selector.coerce(ctx.options.get("exclude"), EXCLUDE_WHERE)
    names = own.select(model.graph, where=EXCLUDE_WHERE, must_match=True)
    common = Selector.coerce(getattr(ctx, "exclude", None), "--exclude")
    return names | common.select(model.graph, where="--exclude", must_match=False)


def compressed_weight_bytes(model) -> int:
    """zlib-compressed size (level 6) of all constant tensors of the model."""
    total = 0
    for graph in model.all_graphs():
        for t in graph.tensors().values():
            if isinstance(t, gs.Constant):
                total += len(zlib.compress(np.ascontiguousarray(t.values).tobytes(), 6))
    return total


def no_search(target) -> bool:
    return str(target or "").strip().lower() == "none"  # every spelling of it, as check_target wrote it


def parse_nm(text: str):
    """``"2:4"`` → (2, 4); ``""`` → None."""
    if not text:
        return None
    n, sep, m = text.partition(":")
    if not sep or not n.strip().isdigit() or not m.strip().isdigit() or not 0 < int(n) < int(m):
        raise UserError(f"prune(nm={text}): expected N:M with 0 < N < M, e.g. 2:4")
    return int(n), int(m)


@register_pass
class PrunePass(Pass):
    name = "prune"
    summary = ("remove channels: strip constant ones, then as many as the fidelity target allows "
               "(or ratio=), by measured loss per saved cost, with re-fit; target=none: strip only (lossless)")
    options = {
        "ratio": Option(float, 0.0, "share of the prunable compute to remove, at least — more where the least "
                        "important channels carry more (alloc=rank: share of channel units; 0: as much as the "
                        "fidelity target allows)"),
        "target": Option(str, "", "fidelity target (cos:V, top1:V, rel:V, none; 0 = none: strip only); default: "
                         "the pipeline's --target share. Without ratio= the pass removes as much compute as it "
                         "allows", parse=check_target),
        "criterion": Option(str, "obs", "channel importance", CRITERIA),
        "cost": Option(str, "none", "divide scores by each channel's MAC or measured-latency share",
                       ("none", "macs", "latency")),
        "alloc": Option(str, "sensitivity", "spread the cut over groups by measured output loss per saved cost "
                        "(scope=global), or by score rank only", ("sensitivity", "rank")),
        "scope": Option(str, "global", "rank channels over the model or per group", ("global", "layer")),
        "min_channels": Option(int, 8, "keep at least this many channels per group"),
        "max_ratio": Option(float, 0.0, "largest fraction of one group to cut (0: min(2·ratio, 0.9))"),
        "max_loss": Option(float, 0.0, "largest share of a group's importance to cut (0: no limit)"),
        "multiple": Option(int, 16, "keep channel counts at multiples of this (1: any); also the channel block "
                           "of the cost model"),
        "refit": Option(bool, True, "re-solve consumer weights by ridge least squares"),
        "sparsity": Option(float, 0.0, "unstructured magnitude sparsity of Conv/Gemm/MatMul weights"),
        "nm": Option(str, "", "N:M sparsity, e.g. 2:4"),
        "explain": Option(bool, False, "describe every dependency group in the notes"),
        "backoff": Option(float, 0.2, "without ratio=: keep (1 − backoff) of the largest amount that held the "
                          "target (an input a little harder than the judged ones fails at a smaller amount)"),
        "samples": Option(int, 16, "calibration samples used for importance and re-fit"),
        "seed": Option(int, 0, "seed of the random criterion and of position sampling"),
        "exclude": Option(str, "", "nodes whose output channels are kept (selector: NAME; re:REGEX; op:TYPE; "
                          "first:TYPE:N; last:TYPE:N; all). Channels coupled to them stay too; a selected "
                          "node still loses input channels of a pruned layer before it; its weight is not "
                          "sparsified", parse=Selector.parse),
    }

    def is_lossless(self, options: dict) -> bool:
        explicit = options.get("ratio") or options.get("sparsity") or options.get("nm")
        return not explicit and no_search(options.get("target"))

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        opts = ctx.options
        nm = parse_nm(opts["nm"])
        if not all(0 <= opts[key] < 1 for key in ("ratio", "sparsity", "backoff")):
            raise UserError("prune: ratio, sparsity and backoff must be in [0, 1)")
        keep = excluded_names(model, ctx)
        result.metrics["params_before"] = _param_count(model)
        for sub in list(model.all_graphs())[1:]:
            result.skip("layer in an If/Loop body (only the main graph is pruned)",
                        sum(1 for n in sub.nodes if n.op in PRUNABLE_OPS))
        cg = analyse_model(model, ctx, keep)
        groups = cg.groups()
        if opts["explain"]:
            result.notes.extend(cg.describe(g) for g in groups)
        blocked = cg.blocked_units()
        result.metrics["groups"] = len(groups)
        result.metrics["channel_units"] = len(cg.all_units())
        result.metrics["blocked_units"] = len(blocked)
        for reason, count in Counter(_short(r) for r in blocked.values()).items():
            result.skip(f"unprunable: {reason}", count)
        units, constants, reasons = strippable(cg)
        for reason, count in reasons.items():
            result.skip(_short(reason), count)
        if units:
            apply(model, cg, units, constants)
            result.rewrite("strip constant channel", len(units))
            model.graph.cleanup(remove_unused_graph_inputs=False)
        if opts["ratio"] > 0:
            from onnxslim_kit.passes.prune.ratio import prune_by_ratio

            prune_by_ratio(model, ctx, result, partial(analyse_model, keep=keep))
        elif not self.is_lossless(opts) and not (opts["sparsity"] > 0 or nm):
            from onnxslim_kit.passes.prune.search import prune_to_target

            prune_to_target(model, ctx, result, partial(analyse_model, keep=keep))
        if opts["sparsity"] > 0 or nm:
            from onnxslim_kit.passes.prune.sparsity import sparsify

            before = compressed_weight_bytes(model)
            sparsify(model, opts["sparsity"], nm, result, keep)
            result.metrics["zlib_bytes_before"] = before
            result.metrics["zlib_bytes_after"] = compressed_weight_bytes(model)
        result.metrics["params_after"] = _param_count(model)
        return result


def _param_count(model) -> int:
    model.graph.cleanup(remove_unused_graph_inputs=False)
    return int(sum(np.size(t.values) for t in model.graph.tensors().values() if isinstance(t, gs.Constant)))


def _short(reason: str) -> str:
    """A reason without the node name in parentheses, so equal reasons count together."""
    head, sep, _ = reason.rpartition(" (")
    return head if sep else reason
