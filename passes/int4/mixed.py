"""Mixed precision for ``int4``: the layers whose 4-bit rounding hurts the outputs most become
8-bit, as long as all MatMul weights together stay within a size budget.

    budget:   Σ_layers bytes(layer) ≤ max_ratio · Σ_layers float bytes(layer)
    bytes:    int4 MatMulNBits  N·n_b·bs/2 codes + N·n_b scales (+ N·⌈n_b/2⌉ zero points, asym)
              int8 (bits=8)     N·n_b8·bs8 codes + N·n_b8 scales          (bs8 = 128)
    proxy:    e_i = ‖X(W−Ŵ_i)ᵀ‖²/‖XWᵀ‖², the layer's own output error on rows of its
              calibration inputs (:mod:`.proxy`; one forward pass for all layers)
    loss_i:   mean over calibration samples, summed over the output views
              (:mod:`onnxslim_kit.fidelity.views`: each output, each branch of a concatenated
              head on its own scale), of 1 − cos(y, ŷ_i) (+ 1 − agreement for the decision
              views of Softmax/Sigmoid heads) where ŷ_i = the float model with
              *only* layer i's weight replaced by its dequantized int4 weight (measured: one
              forward pass per sample and layer; whole outputs when the model lacks a tensor
              the views' labels need)
    greedy:   promote layers by loss_i / (extra bytes of 8 bits) while the budget holds

Which layers are measured (at most ``measured`` of them; all when there are no more
candidates, and the proxy decides nothing): layers are grouped in *classes* by their place in
the graph (the op types downstream of the layer up to the next candidates, :func:`.proxy.role`:
in a transformer the query/key, value, attention output, FFN input and FFN output layers),
since the proxy's relation to the loss differs between them (a query's error is damped by the
Softmax, a value's reaches the residual stream). First one representative per class
(:func:`representatives`) is measured, which gives each class its scale
``c_k = Σ loss / Σ e`` (:func:`predicted`: ``loss_i ≈ c_k · e_i`` for the others); then the
rest of the ``measured`` budget goes to the candidates nearest the cut of the greedy choice on
those predictions (:func:`shortlist`, half on each side), and the greedy runs on measured and
predicted losses together. Why not the proxy alone: it ranks layers badly on
all-MiniLM-L6-v2 (the attention value projections matter most for the sentence embedding,
yet their relative error is middling; the FFN output layers have tiny relative error under
GPTQ that does not carry over to held-out sentences); why not measure all: on a 2.78 GB
decoder, 145 candidates × 8 single-thread forward passes took 1,638 s of a 1,692 s pass.
All sensitivity runs share one ONNX Runtime session (:class:`Sensitivity`; the original's
outputs run once for the representatives and the shortlist): the candidate weights are graph
inputs (:func:`weights_as_inputs`), fed their float values — read-only maps of the weights' file
for a model left on disk, which ORT reads in place — and each run feeds one dequantized weight
instead of one of them. (As initializers that are also inputs, with their float values as
defaults, ORT copied every candidate weight into the session: 1 GB of heap for a 933 MB decoder.)
A measured candidate runs only the nodes its weight reaches (:mod:`.suffix`): one reference run
a sample per :meth:`Sensitivity.losses` call (the first one's also gives the outputs) returns the
tensors its candidates' suffixes read from the rest of the graph (≤ :data:`CUT_BYTES` over all
samples, dropped after the call), and a suffix session (graph only) is fed those; the losses are
the whole-model runs' bit for bit, and a candidate in layer ``i`` of ``L`` reads ``(L − i) / L``
of the weights instead of all of them (one reference run more than before: the shortlist's).
On (:data:`SUFFIX_RUNS`) since session 17. Session 10 had them off: on issue 16's 2.75 GB decoder
they lifted the peak RSS from 1.29× to 1.32× of the model. The one session returned the cut
tensors of *all* 145 candidates as graph outputs (each of its runs held them together); and, traced
with that fixed (RSS anonymous / file-backed every 0.1 s), the peak was still in this step: the
model's pages, all mapped by the reference run, plus the scratch pages of every measured candidate's
dequantized weight (each run maps its candidate's, none dropped before the step ended: ≈ 260 MB).
Now the whole-model session returns the outputs only, each call's reference run is a session of
its own with that call's cut tensors (:meth:`Sensitivity._reference`), a candidate's scratch pages
go after its runs, and the weights' pages after the reference run when suffixes follow (they map
only their own): the run's peak 1.29× → 1.23×, no longer in this step (``docs/large-models.md``).

Cost on large models. A whole-model run reads every weight (issue 16's 2.75 GB decoder, 32
tokens: 2.97 s at one thread, 2.37 s at two under load 3, ``benchmarks/check_run_threads.py``;
the weights' traffic, not the sequence, sets it): the measured losses take
``⌊SENSITIVITY_BYTES / the candidates' float bytes⌋`` samples (:func:`sample_count`, 1–16: 16 for MiniLM as
before, 4 at 933 MB, 1 at 2.75 GB), and the sessions of the step (these, the emulation's, the
proxy's rows) run :data:`RUN_THREADS` intra-op threads — their outputs are bit-identical to one
thread's (MLAS splits a GEMM over rows and columns, never along K; checked on that decoder by
the same script), so the decisions do not depend on the thread count or on timing.

Measured on a 279 MB decoder (12 pre-LN layers, 73 candidates, 10 classes; verification
cosine on 8 samples; CPU seconds of the whole ``fuse,int4(...)`` run, shared machine): RTN
every layer measured 51.2 s, cosine 0.9885; ``measured=12`` 18.4 s, 0.9877; the proxy alone
(``measured=0``) 11.0 s, 0.9712; no 8-bit layer 5.2 s, 0.9567. GPTQ: 76.2 s → 46.4 s,
0.99928 → 0.99947.

Measured (all-MiniLM-L6-v2, GPTQ act_order asym block 64, fake-quantized float32, 32 held-out
sentences, every layer measured): worst sentence cosine 0.980 → 0.989, token 0.981 → 0.986
with 5 value projections, one attention output and one FFN input layer at 8 bits (weights
0.143× → 0.159×).
"""

from __future__ import annotations

import numpy as np
import onnx

from onnxslim_kit.api import Target
from onnxslim_kit.fidelity import judge
from onnxslim_kit.runtime import make_session, prepare_feed
from onnxslim_kit.streaming import copy_fields, release_pages, tensor_array

import onnxslim_kit.passes.int4.suffix as _int4_suffix

INT8_BLOCK = 128
SENSITIVITY_BYTES = 4 << 30  # weight bytes one measured candidate's runs may read: 1 sample at 2.75 GB
RUN_THREADS = 2  # intra-op threads of the step's sessions (module docstring: the same outputs as 1)
SUFFIX_RUNS = True  # measured candidates run the nodes their weight reaches (:mod:`.suffix`; module docstring)
CUT_BYTES = 64 << 20  # cut tensors (one losses() call, all samples) the suffix runs may hold (:mod:`.suffix`)


def int4_bytes(shape: tuple, block_size: int, symmetric: bool, scale_bytes: int) -> int:
    n, k = shape
    n_blocks = -(-k // block_size)
    zeros = 0 if symmetric else n * ((n_blocks + 1) // 2)
    return n * n_blocks * block_size // 2 + n * n_blocks * scale_bytes + zeros


def int8_block(k: int) -> int:
    """Block of the 8-bit layers: 128, or the smallest power of two ≥ K (≥ 16) for short K."""
    return min(INT8_BLOCK, max(16, 1 << (k - 1).bit_length()))


def int8_bytes(shape: tuple, scale_bytes: int) -> int:
    n, k = shape
    bs = int8_block(k)
    n_blocks = -(-k // bs)
    return n * n_blocks * bs + n * n_blocks * scale_bytes


def sample_count(wanted: int, model_bytes: int) -> int:
    """Samples of the sensitivity runs: ``wanted``, but each measured candidate's runs read at
    most :data:`SENSITIVITY_BYTES` of weights (≥ 1 sample)."""
    return int(max(1, min(wanted, SENSITIVITY_BYTES // max(model_bytes, 1))))


class Sensitivity:
    """One ONNX Runtime session for every measured candidate (module docstring): the weights
    ``names`` are graph inputs fed their float values, the original's outputs on ``samples``
    are run once; :meth:`losses` feeds one dequantized weight at a time. ``views``
    (:class:`onnxslim_kit.fidelity.Views`): the loss sums ``1 − cos`` over the output views
    (each branch of a concatenated head on its own scale) instead of over whole outputs — when
    every tensor the views' labels need is in ``proto`` (else whole outputs). ``suffixes``: a
    candidate runs only the nodes its weight reaches, fed the reference's values of the tensors
    cut there (:mod:`.suffix`: the same losses, bit for bit), taken for the candidates of one
    :meth:`losses` call (≤ :data:`CUT_BYTES` of them) and dropped after it; ``suffixed``: the
    candidates that ran so."""

    def __init__(self, proto: onnx.ModelProto, names: list, samples: list, views=None, suffixes: bool = None):
        suffixes = SUFFIX_RUNS if suffixes is None else suffixes
        proto, self.floats = weights_as_inputs(proto, list(names))
        self.views = views if views is not None and _labelled(proto, views) else None
        self.extra = list(self.views.runtime_tensors) if self.views is not None else []
        self.parts = _suffix_parts(proto.graph, names) if suffixes else {}
        self.all_cuts = {n: _int4_suffix.cut(proto.graph, part) for n, part in self.parts.items()}
        kept = set(self.extra) | {o.name for o in proto.graph.output}
        self.session = make_session(proto, "basic", threads=RUN_THREADS, arena=False,
                                    extra_outputs=self.extra or None, prepack=False)
        self.feeds = [prepare_feed(self.session, s) for s in samples]
        self.outputs = [o.name for o in self.session.get_outputs() if o.name in kept]
        held = sorted({t for ts in self.all_cuts.values() for t in ts})
        self.static = _int4_suffix.static_types(proto, held) if held else {}
        self.proto = proto if self.all_cuts else None  # the suffixes' source
        del proto
        self.refs = self.runtime = None  # the reference outputs: with the first call's cut tensors
        self.cuts, self.held, self.types, self.suffixed = {}, [], {}, set()

    def prepare(self, names: list) -> None:
        """Take the reference outputs (first call) and the cut tensors of ``names``' suffixes on
        every sample — one reference run a sample; the candidates admitted within
        :data:`CUT_BYTES` (:func:`.suffix.admit`) run as suffixes, the others whole."""
        cuts = {n: self.all_cuts[n] for n in names if n in self.all_cuts}
        wanted = sorted({t for ts in cuts.values() for t in ts} - set(self.outputs))
        runs = self._reference(wanted)
        if self.refs is None:
            self.refs = [{o: r[o] for o in self.outputs} for r in runs]
            self.runtime = [{n: r[n] for n in self.extra} for r in self.refs]
        sizes = {t: sum(r[t].nbytes for r in runs) for t in wanted}
        sizes.update((o, 0) for o in self.outputs)  # held anyway
        self.cuts = {n: cuts[n] for n in _int4_suffix.admit(self.parts, cuts, sizes, CUT_BYTES)}
        held = {t for ts in self.cuts.values() for t in ts} - set(self.outputs)
        self.held = [{t: r[t] for t in held} for r in runs]
        del runs
        if self.cuts:  # the suffixes read their own weights only: the rest need not stay mapped
            for value in self.floats.values():
                release_pages(value)
        self.types = _int4_suffix.input_types(
            {t: [{**ref, **h}[t] for ref, h in zip(self.refs, self.held)] for ts in self.cuts.values() for t in ts},
            self.static)

    def _reference(self, wanted: list) -> list:
        """Per sample, the original's outputs (first call) and the tensors ``wanted`` — from a
        session of its own that returns this call's cut tensors only (the whole-model session
        returns the outputs alone: a session returning every candidate's cut tensors held all of
        them in each of its runs)."""
        asked = (self.outputs if self.refs is None else []) + wanted
        session = self.session if not wanted else make_session(
            self.proto, "basic", threads=RUN_THREADS, arena=False, extra_outputs=self.extra + wanted, prepack=False)
        return [dict(zip(asked, session.run(asked, {**f, **self.floats}))) if asked else {} for f in self.feeds]

    def _run(self, feed: dict, changed: dict = None) -> dict:
        return dict(zip(self.outputs, self.session.run(self.outputs, {**feed, **self.floats, **(changed or {})})))

    def _runner(self, name: str, whole: bool = False):
        """``run(k, changed)``: the outputs on sample ``k`` with ``changed`` fed — a run of
        ``name``'s suffix (:mod:`.suffix`), the reference's values where the suffix makes none;
        the whole model's run when ``name`` was not admitted (or ``whole``)."""
        if whole or name not in self.cuts:
            return lambda k, changed: self._run(self.feeds[k], changed)
        self.suffixed.add(name)
        proto, made = _int4_suffix.suffix_proto(self.proto, self.parts[name],
                                                {t: self.types[t] for t in self.cuts[name]}, self.outputs)
        session = make_session(proto, "basic", threads=RUN_THREADS, arena=False, prepack=False)
        del proto
        inputs = [i.name for i in session.get_inputs()]

        def run(k: int, changed: dict) -> dict:
            given = {**self.feeds[k], **self.floats, **self.refs[k], **self.held[k], **changed}
            got = dict(zip(made, session.run(made, {n: given[n] for n in inputs})))
            return {o: got[o] if o in got else self.refs[k][o] for o in self.outputs}
        return run

    def loss(self, name: str, value: np.ndarray, whole: bool = False) -> float:
        """The loss of the candidate ``name`` fed ``value`` (after :meth:`prepare` named it)."""
        run, loss = self._runner(name, whole), 0.0
        for k, (ref, rt) in enumerate(zip(self.refs, self.runtime)):
            got = run(k, {name: value})
            loss += _view_loss(self.views, ref, got, rt) if self.views is not None else sum(
                _one_minus_cos(ref[o], got[o]) for o in self.outputs if o not in self.extra)
        return loss / max(len(self.feeds), 1)

    def losses(self, values: dict) -> dict:
        """{name: loss} for ``values`` = {weight name: callable giving its dequantized weight in
        the stored layout} (made one at a time: one copy alive); the cut tensors dropped after."""
        self.prepare(list(values))
        out = {}
        for name, make in values.items():
            value = make()
            out[name] = self.loss(name, value)
            release_pages(value)  # a map of the scratch file: its pages go once the candidate is done
        self.cuts, self.held, self.types = {}, [], {}
        return out

    def close(self) -> None:
        self.session = self.feeds = self.refs = self.runtime = self.floats = self.proto = self.held = None


def _suffix_parts(graph: onnx.GraphProto, names: list) -> dict:
    """{name: the nodes its weight reaches} for the candidates whose suffix leaves out a node
    (none when a node has a subgraph, :mod:`.suffix`)."""
    if _int4_suffix.has_subgraphs(graph):
        return {}
    parts = {n: _int4_suffix.downstream(graph, n) for n in names}
    return {n: part for n, part in parts.items() if len(part) < len(graph.node)}


def _labelled(proto: onnx.ModelProto, views) -> bool:
    """Whether ``proto`` has every output the views judge and every tensor their labels need."""
    known = {o for n in proto.graph.node for o in n.output} | {i.name for i in proto.graph.input} | {
        t.name for t in proto.graph.initializer}
    outputs = {o.name for o in proto.graph.output}
    return all(v.output in outputs for v in views) and all(n in known for n in views.runtime_tensors)


def _view_loss(views, ref: dict, got: dict, runtime: dict) -> float:
    """The loss terms a ``cos:V`` target binds, summed over the views of one sample: ``1 − cos``
    of each float view (NaN/Inf: 1) and ``1 − agreement`` of each decision view."""
    verdict = judge(views, [ref], [got], Target("cos", 0.99), [runtime] if runtime else None)
    return sum(1.0 - s.cosine for s in verdict.scores if s.cosine is not None) + sum(
        1.0 - s.agreement for s in verdict.scores if s.agreement is not None)


def select(costs: dict, losses: dict, budget: int) -> set:
    """Names to promote: greedy by loss per extra byte; ``costs``: {name: (int4 bytes, int8 bytes)};
    ``budget``: bytes allowed above the all-int4 total."""
    chosen, spent = set(), 0
    order = sorted(costs, key=lambda n: -losses.get(n, 0.0) / max(costs[n][1] - costs[n][0], 1))
    for name in order:
        extra = costs[name][1] - costs[name][0]
        if losses.get(name, 0.0) > 0 and spent + extra <= budget:
            chosen.add(name)
            spent += extra
    return chosen


def representatives(costs: dict, proxies: dict, classes: dict, n: int) -> list:
    """One candidate per class (the one with the largest proxy per extra byte), the classes
    with the most int4 bytes first, at most ``n``; ``classes``: {name: class key}."""
    groups: dict = {}
    for name in costs:
        groups.setdefault(classes.get(name), []).append(name)
    ranked = sorted(groups.values(), key=lambda names: (-sum(costs[m][0] for m in names), min(names)))
    return [max(names, key=lambda m: (proxies.get(m, 0.0) / max(costs[m][1] - costs[m][0], 1), m))
            for names in ranked][:max(n, 0)]


def shortlist(costs: dict, losses: dict, budget: int, n: int, done=()) -> list:
    """The ``n`` candidates not in ``done`` nearest the cut of the greedy choice on ``losses``."""
    order = [m for m in sorted(costs, key=lambda m: (-losses.get(m, 0.0) / max(costs[m][1] - costs[m][0], 1), m))
             if m not in done]
    if n <= 0 or not order:
        return []
    chosen = select(costs, losses, budget)
    cut = next((i for i, name in enumerate(order) if name not in chosen), len(order))
    start = min(max(cut - n // 2, 0), max(len(order) - n, 0))
    return order[start:start + n]


def predicted(measured: dict, proxies: dict, classes: dict) -> dict:
    """Losses for every candidate of ``proxies``: measured where known, else ``c_k · proxy`` with
    ``c_k = Σ measured / Σ their proxies`` over the measured members of its class ``k`` (over all
    measured candidates for a class with none; 1 when nothing was measured)."""
    def scale(names):
        known = sum(proxies.get(m, 0.0) for m in names)
        return sum(measured[m] for m in names) / known if names and known > 0 else None

    overall = scale(list(measured))
    overall = 1.0 if overall is None else overall
    by_class: dict = {}
    for m in measured:
        by_class.setdefault(classes.get(m), []).append(m)
    scales = {k: scale(names) for k, names in by_class.items()}
    return {m: measured[m] if m in measured else (scales.get(classes.get(m)) or overall) * p
            for m, p in proxies.items()}


def weights_as_inputs(proto: onnx.ModelProto, names: list) -> tuple:
    """``(a copy of proto whose initializers ``names`` are graph inputs instead, {name: values})``:
    each run feeds them (ONNX Runtime reads a fed array where it lies; an initializer that is
    also an input it copies into its own memory — the weights once more). The values: a
    read-only map of the file for a weight left on disk, else the proto's bytes (one copy)."""
    out = onnx.ModelProto()
    copy_fields(proto, out, skip=("graph",))
    copy_fields(proto.graph, out.graph, skip=("initializer",))
    wanted, values, inputs = set(names), {}, {i.name for i in proto.graph.input}
    for t in proto.graph.initializer:
        if t.name in wanted:
            values[t.name] = tensor_array(t)
            if t.name not in inputs:
                out.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            out.graph.initializer.append(t)
    return out, values


def _one_minus_cos(a: np.ndarray, b: np.ndarray) -> float:
    if a.dtype.kind != "f" or a.shape != b.shape:
        return 0.0
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    if not (np.all(np.isfinite(a64)) and np.all(np.isfinite(b64))):
        return 1.0
    # elementwise sums, not BLAS dot: a BLAS thread pool on a loaded machine took 13 ms a call
    na, nb = np.sqrt(np.square(a64).sum()), np.sqrt(np.square(b64).sum())
    if na == 0 or nb == 0:
        return 0.0 if na == nb else 1.0
    return float(1.0 - (a64 * b64).sum() / (na * nb))

