"""Sensitivity-aware allocation for ``prune(ratio=…, alloc=sensitivity)``: spend the cut where the
measured output loss per saved cost is smallest.

The default selection (:func:`._prune_ratio.select`) ranks local importance scores; it does not
know that some layers (the last convs, the heads) pass their error straight to the outputs
while others are forgiven by what follows. Here the model's *outputs* are measured instead:

1. **Masked model.** Every tensor ``T`` read by a consumer gets two extra graph inputs and is
   replaced, for the consumers only, by ``T·m_T + b_T``. With ``m = 1, b = 0`` this is the
   teacher; with ``m_c = 0, b_c = E[T_c]`` it is the model after removing channel ``c`` with
   its mean moved into the consumers' biases — what :func:`._prune_apply.apply` builds (exact
   away from padded borders), before the re-fit. One ONNX Runtime session serves every
   configuration below, so no model is rebuilt (no packed weight copies; closed after the curves
   and after each check, step 4, so it holds no weight pages while the candidates run).
2. **Loss curves.** For each source group ``g`` and a few cut sizes ``n`` (kept counts at
   multiples of ``multiple``, within ``cap`` and ``min_channels``) the ``n`` lowest-ranked
   units of ``g`` alone are masked and the outputs compared with the teacher's on a few
   calibration samples::

       L_g(n) = mean over outputs o of  Σ_samples ‖ŷ_o − y_o‖² / Σ_samples ‖y_o‖²

   where an output made by Softmax/Sigmoid is measured at its input (the logits), and an output
   that is a Concat of branches behind layout ops (a YOLO head) branch by branch, each branch an
   ``o`` of its own (boxes in hundreds beside sigmoid scores would otherwise leave the scores
   unmeasured; the split of the fidelity views, :mod:`onnxslim_kit.fidelity.views`). How many
   cut sizes and samples (:func:`budget`) scales with the model's compute: a budget of
   ``RUN_MACS`` multiply-accumulates. The resolution matters: with 3–4 sizes per group the
   greedy step below must take big chunks, and on ppocr_cls_v2 at ``ratio=0.4`` the worst
   output cosine was 0.06 (3–4 sizes) vs 0.98 (up to 25).

3. **Greedy allocation** under a budget ``S*`` (the cost :func:`._prune_ratio.prune_by_ratio`
   asks to remove): with ``S(config)`` the cost the chosen cuts save, counted node by node
   (:class:`._prune_cost.CostModel`: a conv whose input and output channels are both cut counts
   once), repeatedly take the step ``n_g → n'`` with the smallest
   ``(L_g(n') − L_g(n_g)) / (S(…, n', …) − S(…, n_g, …))`` until ``S ≥ S*``. Losses of different
   groups are taken as additive (first order).
4. **Check.** The loss of the whole allocation and of ``fallback`` (the ranked selection saving
   as much) are measured together; the smaller one is kept. (Additivity fails for large cuts: on
   ppocrv4_det at ``ratio=0.3`` the allocation's joint loss was 0.014, the ranked one's 0.129, in an
   exploratory run.)

So ``alloc=sensitivity`` removes as much compute as its budget asks, distributed differently; the
re-fit (:mod:`onnxslim_kit.passes.prune.refit`) runs after it as before.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from onnxslim_kit.runtime import give_back, make_session, run

from onnxslim_kit.passes.prune.apply import expand
from onnxslim_kit.passes.prune.importance import unit_costs

SQUASHING = ("Softmax", "LogSoftmax", "Sigmoid")
LAYOUT_OPS = ("Identity", "Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat")
RUN_MACS = 4e11  # budget of the loss curves: runs × multiply-accumulates touched by prunable units
MAX_RUNS = 4096
WANTED_LEVELS = 16  # levels per group before samples per configuration go above 1
MIN_LEVELS, MAX_LEVELS = 3, 32
SAMPLES = 8  # at most this many calibration samples per configuration


def masked_model(teacher: onnx.ModelProto, cg) -> tuple:
    """(proto, {tensor: (mask input, bias input, broadcast shape)}) — see the module docstring."""
    proto = onnx.ModelProto()
    proto.CopyFrom(teacher)
    graph = proto.graph
    by_output = {node.output[0]: node for node in graph.node if node.output}
    inputs: dict = {}
    new_nodes: dict = {}
    for c in cg.consumers:
        name = c.tensor.name
        if name not in inputs:
            layout = cg.layouts[name]
            size = layout.size * (layout.flat[0] * layout.flat[1] if layout.flat else 1)
            shape = [1] * layout.rank
            shape[layout.axis] = size
            dtype = _float_dtype(cg.tensors.get(name))
            m, b, mid, out = (f"prune_sens/{k}/{name}" for k in ("m", "b", "mul", "out"))
            elem = helper.np_dtype_to_tensor_dtype(dtype)
            graph.input.extend([helper.make_tensor_value_info(m, elem, shape),
                                helper.make_tensor_value_info(b, elem, shape)])
            new_nodes[name] = [helper.make_node("Mul", [name, m], [mid], name=mid),
                               helper.make_node("Add", [mid, b], [out], name=out)]
            inputs[name] = (m, b, shape, out, dtype)
        node = by_output[c.node.outputs[0].name]
        for k, x in enumerate(node.input):
            if x == name:
                node.input[k] = inputs[name][3]
    # insert each Mul/Add right after the producer of its tensor (keeps the graph sorted)
    order = []
    pending = dict(new_nodes)
    for name in [i.name for i in graph.input] + [t.name for t in graph.initializer]:
        order.extend(pending.pop(name, []))
    for node in graph.node:
        order.append(node)
        for out in node.output:
            order.extend(pending.pop(out, []))
    del graph.node[:]
    graph.node.extend(order)
    return proto, {name: (m, b, shape, dtype) for name, (m, b, shape, _, dtype) in inputs.items()}


def _float_dtype(tensor) -> np.dtype:
    """The tensor's float type (float32 when unknown)."""
    dtype = getattr(tensor, "dtype", None)
    try:
        dtype = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        dtype = None
    return dtype if dtype is not None and dtype.kind == "f" else np.dtype(np.float32)


class LossProbe:
    """Output loss of the teacher with some units masked (one session, see the module docstring)."""

    def __init__(self, teacher, cg, stats: dict, samples: list):
        self.cg = cg
        self.proto, self.inputs = masked_model(teacher, cg)
        self.measured = measured_tensors(self.proto)
        self._session = None
        self.samples = samples
        self.means = {name: expand(stats[name][0], cg.layouts[name]).astype(np.float32) for name in self.inputs}
        self.units = {name: expand(cg.units_of(name), cg.layouts[name]) for name in self.inputs}
        self.reference = [self._run(s, {}) for s in samples]

    @property
    def session(self):
        """The session, opened on first use after :meth:`close`: no packed weight copies, so it
        holds no more than the pages of the weights it reads — and none once closed."""
        if self._session is None:
            self._session = make_session(self.proto, opt_level="all", threads=1, extra_outputs=self.measured,
                                         prepack=False)
        return self._session

    def close(self) -> None:
        """Drop the session (a later :meth:`loss` opens it again)."""
        self._session = None
        give_back()

    def _feed(self, removed: np.ndarray) -> dict:
        feed = {}
        for name, (m, b, shape, dtype) in self.inputs.items():
            cut = np.isin(self.units[name], removed) if len(removed) else np.zeros(len(self.units[name]), bool)
            feed[m] = np.where(cut, 0.0, 1.0).astype(dtype).reshape(shape)
            feed[b] = np.where(cut, self.means[name], 0.0).astype(dtype).reshape(shape)
        return feed

    def _run(self, sample: dict, feed: dict) -> dict:
        out = run(self.session, {**sample, **(feed or self._feed(np.zeros(0, np.int64)))})
        return {k: out[k] for k in self.measured if np.asarray(out[k]).dtype.kind == "f"}

    def loss(self, removed) -> float:
        feed = self._feed(np.array(sorted(removed), dtype=np.int64))
        err: dict = {}
        for sample, ref in zip(self.samples, self.reference):
            got = self._run(sample, feed)
            for k, y in ref.items():
                e, n = err.get(k, (0.0, 0.0))
                d = got[k].astype(np.float64) - y
                err[k] = (e + float(np.sum(d * d)), n + float(np.sum(y.astype(np.float64) ** 2)))
        return float(np.mean([e / max(n, 1e-30) for e, n in err.values()])) if err else 0.0


def measured_tensors(proto) -> list:
    """Where the loss is measured: each graph output, or the logits of an output made by
    Softmax/LogSoftmax/Sigmoid (a saturated probability hides changes that flip a nearby sample);
    an output that concatenates branches behind layout ops (a YOLO head: boxes beside sigmoid
    scores) is measured branch by branch, each on its own scale (the fidelity views' split)."""
    producer = {out: node for node in proto.graph.node for out in node.output}
    constants = {t.name for t in proto.graph.initializer}
    names = []
    for output in proto.graph.output:
        leaves = _branches(output.name, producer, constants)
        for leaf in leaves if len(leaves) > 1 else [output.name]:
            node = producer.get(leaf)
            names.append(node.input[0] if node is not None and node.op_type in SQUASHING else leaf)
    return list(dict.fromkeys(names))


def _branches(name: str, producer: dict, constants: set, depth: int = 0) -> list:
    """The tensors a Concat behind ``name``'s layout tail joins (``[name]`` when none)."""
    node = producer.get(name)
    if node is None or node.op_type not in LAYOUT_OPS or depth > 32:
        return [name]
    if node.op_type != "Concat":
        return _branches(node.input[0], producer, constants, depth + 1) if node.input else [name]
    leaves = []
    for x in node.input:
        if x and x not in constants and x in producer:  # a constant or a graph input cannot change
            leaves.extend(_branches(x, producer, constants, depth + 1))
    return leaves or [name]


def budget(macs: float, groups: int, samples: int) -> tuple:
    """(samples per configuration, levels per group) for a model whose prunable units touch
    ``macs`` multiply-accumulates: about ``RUN_MACS / macs`` runs in all (at most ``MAX_RUNS``),
    spent first on levels (up to ``WANTED_LEVELS``), then on samples, then on more levels."""
    runs = min(MAX_RUNS, RUN_MACS / max(macs, 1.0))
    per_group = runs / max(groups, 1)
    n_samples = int(max(1, min(SAMPLES, samples, per_group // WANTED_LEVELS)))
    return n_samples, int(min(MAX_LEVELS, max(MIN_LEVELS, per_group // n_samples)))


def levels(group_size: int, prunable: int, cap: float, min_channels: int, multiple: int, count: int) -> list:
    """Candidate cut sizes of one group (ascending, at most ``count``, always the largest)."""
    n_max = min(prunable, int(cap * group_size))
    step = max(multiple, 1)
    keeps = [k for k in range(max(min_channels, 1), group_size) if k % step == 0 and group_size - k <= n_max]
    cuts = sorted({group_size - k for k in keeps})
    if len(cuts) > count:
        idx = np.unique(np.round(np.linspace(0, len(cuts) - 1, count)).astype(int))
        cuts = [cuts[i] for i in idx]
    return cuts


def allocate(curves: list, target: float, model=None, counts: list | None = None) -> list:
    """Greedy choice of one level per group: ``curves`` = [[(0, 0.0, 0.0), (n, saved, loss), …]]
    per group; returns the chosen index per group (see the module docstring).

    Without ``model`` a step saves the difference of its curve's ``saved`` column (costs taken as
    additive); with a :class:`._prune_cost.CostModel` and ``counts[g][j]`` (tensor → channel
    positions removed at level ``j`` of group ``g``) it saves what the model computes given the
    other groups' current levels — exact where a node's input and output channels are both cut."""
    chosen = [0] * len(curves)
    saved = 0.0
    cache: dict = {}
    touches = [_touched(model, c) for c in counts] if model is not None else None

    def gain(g: int, j: int) -> float:
        if model is None:
            return curves[g][j][1] - curves[g][chosen[g]][1]
        key = (g, chosen[g], j)
        if key not in cache:
            cache[key] = model.delta(_change(counts[g], chosen[g], j))
        return cache[key]

    while saved < target:
        best = None
        for g, curve in enumerate(curves):
            l0 = curve[chosen[g]][2]
            for j in range(chosen[g] + 1, len(curve)):
                step = gain(g, j)
                if step <= 0:
                    continue
                eff = max(curve[j][2] - l0, 0.0) / step
                key = (eff, step)  # on a tie the smaller step: less overshoot
                if best is None or key < best[0]:
                    best = (key, g, j, step)
        if best is None:
            break
        _, g, j, step = best
        if model is not None:
            model.commit(_change(counts[g], chosen[g], j))
            stale = {h for h, nodes in enumerate(touches) if nodes & touches[g]}  # groups sharing a node with g
            cache = {k: v for k, v in cache.items() if k[0] not in stale}
        saved += step
        chosen[g] = j
    return chosen


def _change(levels: list, j0: int, j1: int) -> dict:
    before, after = levels[j0], levels[j1]
    return {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}


def _touched(model, levels: list) -> set:
    return {i for level in levels for name in level for i in model.by_tensor.get(name, [])}


def sensitivity_select(cg, teacher, stats: dict, samples: list, scores: dict, cost_model, default: set,
                       cap: float, min_channels: int, multiple: int, result, progress=lambda it, **_: it,
                       probe=None, floor: float = 0.0, fallback=None) -> set:
    """Units to remove: the allocation above, under the budget ``max(cost_model.saved(default),
    floor · cost_model.saved(every prunable unit))`` (:class:`._prune_cost.CostModel`); ``probe``: a
    :class:`LossProbe` (made here when None). ``fallback(target, cost_model)``: another selection
    (the ranked one) kept instead when the probe measures a smaller loss for it."""
    curves = Curves(cg, teacher, stats, samples, scores, cost_model, cap, min_channels, multiple, result,
                    progress, probe)
    return curves.choose(default, cap, result, floor, fallback)


class Curves:
    """The loss curves of every source group (step 2), measured once with the levels of ``cap``;
    :meth:`choose` allocates a budget on them (steps 3–4) for that ``cap`` or a smaller one, so a
    search over the amount removed (:mod:`onnxslim_kit.passes.prune.search`) measures them once."""

    def __init__(self, cg, teacher, stats: dict, samples: list, scores: dict, cost_model, cap: float,
                 min_channels: int, multiple: int, result, progress=lambda it, **_: it, probe=None):
        self.cost_model, self.min_channels, self.multiple = cost_model, min_channels, multiple
        blocked = cg.blocked_units()
        groups = [(g, sorted((u for u in g if u not in blocked), key=lambda u: (scores.get(u, 0.0), u)))
                  for g in cg.source_groups()]
        groups = [(g, ranked) for g, ranked in groups if ranked]
        self.prunable = [u for _, ranked in groups for u in ranked]
        self.n_samples, self.count = budget(float(sum(unit_costs(cg).values())), len(groups), len(samples))
        todo = [(g, ranked, levels(len(g), len(ranked), cap, min_channels, multiple, self.count))
                for g, ranked in groups]
        self.todo = [t for t in todo if t[2]]
        self.configs = sum(len(t[2]) for t in self.todo)
        self.probe, self.curves, self.counts = None, [], []
        if not self.configs:
            return
        self.own_probe = probe is None  # closed between uses: a session held open keeps its weight pages
        try:
            self.probe = probe or LossProbe(teacher, cg, stats, samples[: self.n_samples])
        except Exception as exc:  # noqa: BLE001 - ORT rejects the masked model: keep the ranked selection
            result.skip(f"alloc=sensitivity: masked model did not run ({type(exc).__name__}), ranked selection kept")
            return
        for group, ranked, cuts in progress(self.todo, desc="prune sensitivity"):
            curve, level_counts = [(0, 0.0, 0.0)], [{}]
            for n in cuts:
                curve.append((n, cost_model.saved(ranked[:n]), self.probe.loss(ranked[:n])))
                level_counts.append(cost_model.counts(ranked[:n]))
            self.curves.append(curve)
            self.counts.append(level_counts)
        self._close()

    def _close(self) -> None:
        if self.own_probe and self.probe is not None:
            self.probe.close()

    def choose(self, default: set, cap: float, result, floor: float = 0.0, fallback=None) -> set:
        """The allocation under ``max(saved(default), floor · saved(every prunable unit))`` with
        no group cut by more than ``cap`` of its units (levels above it left out)."""
        cost_model = self.cost_model
        target = max(cost_model.saved(default), floor * cost_model.saved(self.prunable))
        if self.probe is None:
            return default if self.configs else budget_report(default, target, cost_model, result, cap,
                                                              self.multiple, self.min_channels)
        curves, counts = [], []
        for (group, _, _), curve, level_counts in zip(self.todo, self.curves, self.counts):
            keep = [j for j, level in enumerate(curve) if level[0] <= int(cap * len(group))]
            curves.append([curve[j] for j in keep])
            counts.append([level_counts[j] for j in keep])
        cost_model.reset()
        chosen = allocate(curves, target, cost_model, counts)
        removed = set()
        for (group, ranked, _), curve, j in zip(self.todo, curves, chosen):
            removed.update(ranked[: curve[j][0]])
        result.metrics["sensitivity_runs"] = self.configs * self.n_samples
        result.metrics["sensitivity_levels_samples"] = [self.count, self.n_samples]
        result.metrics["sensitivity_loss_sum"] = round(sum(c[j][2] for c, j in zip(curves, chosen)), 6)
        if fallback is not None:
            other = fallback(target, cost_model)
            joint, joint_other = self.probe.loss(removed), self.probe.loss(other)
            self._close()
            result.metrics["sensitivity_joint_loss"] = [round(joint, 6), round(joint_other, 6)]
            if joint_other < joint and cost_model.saved(other) >= min(target, cost_model.saved(removed)):
                result.skip("alloc=sensitivity: the ranked selection measured a smaller loss, kept")
                removed = other
        return budget_report(removed, target, cost_model, result, cap, self.multiple, self.min_channels)


def budget_report(removed: set, target: float, cost_model, result, cap: float, multiple: int,
                   min_channels: int) -> set:
    """``removed``, with the budget and what it saves in the metrics, and a note when it falls short."""
    saved = cost_model.saved(removed)
    result.metrics["budget_saved"] = [float(f"{target:.4g}"), float(f"{saved:.4g}")]
    if saved < target:
        result.notes.append(f"ratio not reached: {saved / target:.0%} of the compute asked for can go within "
                            f"max_ratio={cap:g}, multiple={multiple}, min_channels={min_channels} (the groups' "
                            f"cuts come in steps of {multiple} channels, at most {cap:g} of a group)")
    return removed
