"""Study of post-training low-rank methods on MiniLM-L6 (issue 6): which method, which ranks.

    python benchmarks/svd_study.py [--out benchmarks/results/svd-2026-11-29-s2-study.md]
    python benchmarks/svd_study.py --big 3900 --out benchmarks/results/svd-2026-11-29-s3-study.md

``--big N`` (session 3): statistics from the real tokens of ``N`` sentences of
``data/svd_calib_sentences.txt`` (WordNet usage examples, :mod:`build_svd_calib`; Ledoit–Wolf
shrunk Gram matrices, :mod:`onnxslim_kit.passes.svd.maths.factor`), 64 further sentences of that file
held out as the check set, and the trade-off curve (weight-MatMul FLOPs removed vs worst
sentence-embedding cosine on the 32 evaluation sentences) of two allocations over a fine price
sweep: ``measured`` (1 − cos per layer and grid rank, measured on the check sentences) and
``spectrum`` (the pass's default: layer error from the whitened spectrum × one measured
transfer factor per layer, :mod:`onnxslim_kit.passes.svd.alloc`). Plus the session-2
"oracle" scored the other way round (fitted on the evaluation sentences, scored on 64 WordNet
sentences), which shows that it was an in-sample fit, not a bound.

One ORT session whose weight-MatMul weights are graph *inputs*: any candidate (factorised
weights multiplied back, ``W_eff = A B``) is evaluated without rebuilding the model. Rows of the
statistics are the real (attention-mask 1) tokens only. Sentences: inputs.py — 32 calibration
sentences (first half of sentences.txt) fit everything unless a row says otherwise; the 32
evaluation sentences (second half) are only used to report. FLOPs: weight MatMuls only (36 of
the 48 MatMuls; the 12 attention MatMuls Q·Kᵀ and P·V are neither counted nor touched).

Rows:
* ``uniform``: every layer the smallest rank keeping energy ``e`` of the whitened SVD (the
  session-1 rule family), calibration Gram matrices;
* ``alloc``: per-layer, per-rank sensitivity (mean ``1 − cos`` of the sentence embedding with
  that layer alone factorised) then a Lagrangian allocation (see passes/svd/alloc.py) —
  ``oracle``: Gram and sensitivity on the *evaluation* sentences (an upper bound, not a
  method); ``in-sample``: both on the calibration sentences; ``cross-fitted``: factors fitted
  on one half of the calibration sentences, loss measured on the other (what the pass does);
  ``broad text``: Gram from 640 sentences of other English prose (Python's pydoc topics) plus
  the calibration sentences, sensitivity on the calibration sentences.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper
from scipy.linalg import cholesky, solve_triangular

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import inputs  # noqa: E402

GRID = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


class Harness:
    def __init__(self, n_calib=32, n_eval=32, threads=1):
        path = inputs.model_path("minilm_l6")
        self.data = inputs.build("minilm_l6", n_calib=n_calib, n_eval=n_eval, path=path)
        proto = onnx.load(str(path))
        inits = {i.name: i for i in proto.graph.initializer}
        self.layers = [(n.name, n.input[0], n.input[1]) for n in proto.graph.node
                       if n.op_type == "MatMul" and n.input[1] in inits]
        self.weights = {w: onnx.numpy_helper.to_array(inits[w]).astype(np.float64) for _, _, w in self.layers}
        keep = [i for i in proto.graph.initializer if i.name not in self.weights]
        del proto.graph.initializer[:]
        proto.graph.initializer.extend(keep)
        for w, v in self.weights.items():
            proto.graph.input.append(helper.make_tensor_value_info(w, onnx.TensorProto.FLOAT, list(v.shape)))
        for name in dict.fromkeys(x for _, x, _ in self.layers):
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 4
        self.session = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
        self.splits = {"calib": self._batch(self.data.calib), "eval": self._batch(self.data.eval)}
        self.ref = {s: self.run({}, s) for s in self.splits}

    @staticmethod
    def _batch(samples):
        return {k: np.concatenate([s[k] for s in samples]) for k in samples[0]}

    def run(self, replace: dict, split="calib"):
        feed = dict(self.splits[split])
        for w, v in self.weights.items():
            feed[w] = np.asarray(replace.get(w, v), np.float32)
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(None, feed)))

    def grams(self, split="calib", outputs=None) -> dict:
        """``{weight: (Σ xᵀx, rows)}`` over the real tokens of ``split``."""
        out = outputs or self.ref[split]
        mask = self.splits[split]["attention_mask"].reshape(-1).astype(bool)
        result = {}
        for _, x, w in self.layers:
            rows = out[x].reshape(-1, out[x].shape[-1]).astype(np.float64)[mask]
            result[w] = (rows.T @ rows, len(rows))
        return result

    def score(self, replace: dict, split="eval") -> dict:
        out = self.run(replace, split)
        ref = self.ref[split]["sentence_embedding"].astype(np.float64)
        emb = out["sentence_embedding"].astype(np.float64)
        cos = np.sum(ref * emb, 1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(emb, axis=1)
        e = emb / np.linalg.norm(emb, axis=1, keepdims=True)
        sim = e @ e.T
        np.fill_diagonal(sim, -np.inf)
        retrieval = float(np.mean(np.argmax(sim, 1) == (np.arange(len(e)) ^ 1)))
        return {"worst": float(cos.min()), "mean": float(cos.mean()), "retrieval": retrieval}

    def removed(self, ranks: dict) -> float:
        before = sum(v.size for v in self.weights.values())
        after = sum(v.size if w not in ranks else ranks[w] * sum(v.shape) for w, v in self.weights.items())
        return 1 - after / before


def whitened(w, gram, damp=0.01):
    """Full-rank ``(A, B)`` of SVD-LLM: SVD of ``Lᵀ W`` with ``G = L Lᵀ`` (damped), ``A = L⁻ᵀ U Σ``."""
    k = len(gram)
    low = cholesky(gram + damp * np.trace(gram) / k * np.eye(k), lower=True)
    u, s, vt = np.linalg.svd(low.T @ w, full_matrices=False)
    return solve_triangular(low, u * s, trans="T", lower=True), vt, s


def factors_of(h, grams, damp=0.01):
    return {w: whitened(h.weights[w], g / n, damp) for w, (g, n) in grams.items()}


def uniform(h, grams, energies, emit):
    facts = factors_of(h, grams)
    for e in energies:
        rep, ranks = {}, {}
        for w, (a, b, s) in facts.items():
            r = int(np.searchsorted(np.cumsum(s**2) / np.sum(s**2), e) + 1)
            k, n = h.weights[w].shape
            if r * (k + n) < k * n:
                rep[w], ranks[w] = a[:, :r] @ b[:r], r
        emit(f"uniform energy {e}", h.removed(ranks), h.score(rep, "calib"), h.score(rep), ranks)


def grid(k, n):
    return sorted({max(int(k * n * (1 - f) / (k + n)), 1) for f in GRID})


def sensitivity(h, fits: list, split="calib"):
    """``{w: [(r, saved, loss)]}``; ``fits``: list of ``(factors, sample indices to measure on)``."""
    sens = {}
    full = h.splits[split], h.ref[split]
    for _, _, w in h.layers:
        k, n = h.weights[w].shape
        sens[w] = []
        for r in grid(k, n):
            loss = 0.0
            for facts, idx in fits:
                h.splits[split] = {key: v[idx] for key, v in full[0].items()}
                h.ref[split] = {key: v[idx] for key, v in full[1].items()}
                a, b, _ = facts[w]
                loss += (1 - h.score({w: a[:, :r] @ b[:r]}, split)["mean"]) / len(fits)
            sens[w].append((r, k * n - r * (k + n), loss))
        h.splits[split], h.ref[split] = full
    return sens


def pick(sens: dict, lam: float, effective) -> tuple:
    """``(replacements, ranks)`` of the price ``lam``: each layer's rank minimising
    ``loss − lam · saved`` (or none); ``effective(w, r)`` gives the rank-``r`` weight."""
    rep, ranks = {}, {}
    for w, options in sens.items():
        best = min([(0.0, None)] + [(loss - lam * saved, r) for r, saved, loss in options], key=lambda t: t[0])
        if best[1]:
            ranks[w], rep[w] = best[1], effective(w, best[1])
    return rep, ranks


def truncated(facts):
    return lambda w, r: facts[w][0][:, :r] @ facts[w][1][:r]


def allocate(h, sens, facts, emit, label):
    for lam in np.geomspace(1e-9, 1e-7, 9):
        rep, ranks = pick(sens, lam, truncated(facts))
        emit(f"{label} λ={lam:.1e}", h.removed(ranks), h.score(rep, "calib"), h.score(rep), ranks)


def broad_grams(h, n=640):
    import export_minilm
    import pydoc_data.topics as topics
    from tokenizers import Tokenizer

    text = " ".join(topics.topics.values())
    sents = [re.sub(r"\s+", " ", s) for s in re.split(r"(?<=[.!?])\s+", text)]
    sents = [s for s in sents if 8 <= len(s.split()) <= 25 and sum(c.isalpha() or c == " " for c in s) > 0.9 * len(s)]
    np.random.default_rng(0).shuffle(sents)
    tok = Tokenizer.from_file(str(export_minilm.tokenizer_path()))
    tok.enable_padding(length=inputs.MINILM_LENGTH)
    tok.enable_truncation(inputs.MINILM_LENGTH)
    encs = tok.encode_batch(sents[:n])
    extra = {"input_ids": np.array([e.ids for e in encs], np.int64),
             "attention_mask": np.array([e.attention_mask for e in encs], np.int64),
             "token_type_ids": np.array([e.type_ids for e in encs], np.int64)}
    total = h.grams("calib")
    saved = h.splits["calib"]
    for i in range(0, len(encs), 32):
        h.splits["calib"] = {k: v[i:i + 32] for k, v in extra.items()}
        for w, (g, rows) in h.grams("calib", h.run({}, "calib")).items():
            total[w] = (total[w][0] + g, total[w][1] + rows)
    h.splits["calib"] = saved
    return total, len(encs)


def encode(sentences: list) -> dict:
    import export_minilm
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(export_minilm.tokenizer_path()))
    tok.enable_padding(length=inputs.MINILM_LENGTH)
    tok.enable_truncation(inputs.MINILM_LENGTH)
    encs = tok.encode_batch(sentences)
    return {"input_ids": np.array([e.ids for e in encs], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encs], np.int64),
            "token_type_ids": np.array([e.type_ids for e in encs], np.int64)}


def big_study(h, n: int, emit, lines) -> None:
    """The session-3 rows (see the module docstring)."""
    from onnxslim_kit.passes.svd.alloc import SCALE_AT
    from onnxslim_kit.passes.svd.maths.factor import Factorization

    text = [s.strip() for s in (HERE / "data" / "svd_calib_sentences.txt").read_text().splitlines()
            if s.strip() and not s.startswith("#")]
    fit, check = text[:n], text[-64:]
    assert n <= len(text) - 64
    h.splits["check"] = encode(check)
    h.ref["check"] = h.run({}, "check")
    sums = {}
    saved = h.splits["calib"], h.ref["calib"]
    for i in range(0, len(fit), 128):
        h.splits["calib"] = encode(fit[i:i + 128])
        out = h.run({}, "calib")
        mask = h.splits["calib"]["attention_mask"].reshape(-1).astype(bool)
        for _, x, w in h.layers:
            rows = out[x].reshape(-1, out[x].shape[-1]).astype(np.float64)[mask]
            g, r, f = sums.get(w, (0.0, 0, 0.0))
            sums[w] = (g + rows.T @ rows, r + len(rows), f + float(np.sum(np.sum(rows**2, 1) ** 2)))
    h.splits["calib"], h.ref["calib"] = saved
    tokens = sums[h.layers[0][2]][1]
    facts = {w: Factorization(h.weights[w], g / r, r, f) for w, (g, r, f) in sums.items()}
    lines += ["", f"Big calibration: {n} WordNet sentences, {tokens} real tokens; Ledoit–Wolf weights "
                  f"{min(f.shrinkage for f in facts.values()):.3f}–{max(f.shrinkage for f in facts.values()):.3f}; "
                  "check = 64 other WordNet sentences.", ""]

    def eff(w, r):
        return np.matmul(*facts[w].factors(r))

    measured, spectrum = {}, {}
    for _, _, w in h.layers:
        k, m = h.weights[w].shape
        ranks = grid(k, m)
        measured[w] = [(r, k * m - r * (k + m), 1 - h.score({w: eff(w, r)}, "check")["mean"]) for r in ranks]
        at = min(ranks, key=lambda r: abs(1 - r * (k + m) / (k * m) - SCALE_AT))
        loss_at = next(loss for r, _s, loss in measured[w] if r == at)
        scale = loss_at / max(1 - facts[w].kept_energy(at), 1e-12)
        fine = sorted({max(int(k * m * (1 - f) / (k + m)), 1) for f in np.arange(0.025, 0.81, 0.025)})
        spectrum[w] = [(r, k * m - r * (k + m), scale * (1 - facts[w].kept_energy(r))) for r in fine]
    for label, table in (("measured", measured), ("spectrum", spectrum)):
        for lam in np.geomspace(2e-9, 6e-8, 16):
            rep, ranks = pick(table, lam, eff)
            emit(f"big {label} λ={lam:.1e} (check {h.score(rep, 'check')['worst']:.4f})", h.removed(ranks),
                 h.score(rep, "calib"), h.score(rep), ranks)
    batches = [encode(fit[i:i + 128]) for i in range(0, min(len(fit), SEQUENTIAL_SENTENCES), 128)]
    for lam in (6.8e-9, 2.2e-8):
        plain, ranks = pick(spectrum, lam, eff)
        emit(f"big spectrum λ={lam:.1e} (check {h.score(plain, 'check')['worst']:.4f})", h.removed(ranks),
             h.score(plain, "calib"), h.score(plain), ranks)
        rep = sequential_refit(h, batches, ranks)
        emit(f"big spectrum λ={lam:.1e} + sequential refit ({SEQUENTIAL_SENTENCES} sentences; check "
             f"{h.score(rep, 'check')['worst']:.4f})", h.removed(ranks), h.score(rep, "calib"), h.score(rep), ranks)


SEQUENTIAL_SENTENCES = 512


def sequential_refit(h, batches: list, ranks: dict) -> dict:
    """Error-correcting refit, layer group by layer group in graph order: a layer's factors
    minimise ``‖X̃ A B − X W‖`` where ``X̃`` are its inputs in the model compressed so far and
    ``X`` the original's (reduced-rank regression: ``M = G̃⁻¹ C W`` with ``G̃ = X̃ᵀX̃``,
    ``C = X̃ᵀX``, then the rank-``r`` truncation of ``L̃ᵀ M``, ``G̃ = L̃ L̃ᵀ``)."""
    from onnxslim_kit.passes.svd.maths.factor import shrinkage

    saved = h.splits["calib"], h.ref["calib"]
    rep = {}
    inputs_of = list(dict.fromkeys(x for _, x, w in h.layers if w in ranks))
    originals = []  # the original model's layer inputs, real tokens only (float32)
    for batch in batches:
        h.splits["calib"] = batch
        mask = batch["attention_mask"].reshape(-1).astype(bool)
        out = h.run({}, "calib")
        originals.append({x: out[x].reshape(-1, out[x].shape[-1])[mask] for x in inputs_of})
    for x in inputs_of:
        g_t, cross, rows, fourth = 0.0, 0.0, 0, 0.0
        for batch, original in zip(batches, originals):
            h.splits["calib"] = batch
            mask = batch["attention_mask"].reshape(-1).astype(bool)
            new = h.run(rep, "calib")[x]
            new, old = new.reshape(-1, new.shape[-1]).astype(np.float64)[mask], original[x].astype(np.float64)
            g_t, cross = g_t + new.T @ new, cross + new.T @ old
            rows, fourth = rows + len(new), fourth + float(np.sum(np.sum(new**2, 1) ** 2))
        g_t, cross = g_t / rows, cross / rows
        alpha = shrinkage(g_t, rows, fourth)
        k = len(g_t)
        g_s = (1 - alpha) * g_t + alpha * np.trace(g_t) / k * np.eye(k)
        low = cholesky(g_s, lower=True)
        for _, xx, w in h.layers:
            if xx != x or w not in ranks:
                continue
            m = np.linalg.solve(g_s, cross @ h.weights[w])
            u, sv, vt = np.linalg.svd(low.T @ m, full_matrices=False)
            r = ranks[w]
            rep[w] = solve_triangular(low, u[:, :r] * sv[:r], trans="T", lower=True) @ vt[:r]
    h.splits["calib"], h.ref["calib"] = saved
    return rep


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "svd-2026-11-29-s2-study.md")
    parser.add_argument("--big", type=int, default=0, help="session 3: statistics from N WordNet sentences")
    args = parser.parse_args(argv)
    if args.big:
        return main_big(args, argv)
    load_before, start = os.getloadavg(), time.time()
    h = Harness()
    lines = ["# svd on MiniLM-L6: method study (session 2)", "",
             f"Command: `python benchmarks/svd_study.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
             f"Load average at start: {load_before}.", "",
             f"Real tokens: calibration {int(h.splits['calib']['attention_mask'].sum())}, evaluation "
             f"{int(h.splits['eval']['attention_mask'].sum())} (32 sentences each, padded to 32). "
             f"Original model retrieval on the evaluation pairs: {h.score({})['retrieval']:.3f}. "
             "FLOPs = weight MatMuls only (36 layers; attention Q·Kᵀ, P·V not counted).", "",
             "| method | weight-MatMul FLOPs removed | calib worst cos | eval worst cos | eval mean cos | "
             "eval retrieval |", "|---|---|---|---|---|---|"]
    ranks_of = {}

    def emit(label, removed, calib, evaluation, ranks):
        line = (f"| {label} | {removed:.3f} | {calib['worst']:.4f} | {evaluation['worst']:.4f} | "
                f"{evaluation['mean']:.4f} | {evaluation['retrieval']:.3f} |")
        print(line, flush=True)
        lines.append(line)
        ranks_of[label] = ranks
        args.out.write_text("\n".join(lines) + "\n")

    calib_grams = h.grams("calib")
    uniform(h, calib_grams, (0.99, 0.995, 0.999), emit)
    eval_grams = h.grams("eval")
    facts = factors_of(h, eval_grams)
    allocate(h, sensitivity(h, [(facts, np.arange(32))], "eval"), facts, emit, "alloc oracle (eval data)")
    facts = factors_of(h, calib_grams)
    allocate(h, sensitivity(h, [(facts, np.arange(32))]), facts, emit, "alloc in-sample")
    halves = [np.arange(0, 16), np.arange(16, 32)]  # paraphrase pairs stay together

    def grams_on(idx):
        saved = h.splits["calib"], h.ref["calib"]
        h.splits["calib"] = {k: v[idx] for k, v in saved[0].items()}
        h.ref["calib"] = {k: v[idx] for k, v in saved[1].items()}
        g = h.grams("calib")
        h.splits["calib"], h.ref["calib"] = saved
        return g

    fits = [(factors_of(h, grams_on(halves[0])), halves[1]), (factors_of(h, grams_on(halves[1])), halves[0])]
    allocate(h, sensitivity(h, fits), facts, emit, "alloc cross-fitted")
    broad, n_broad = broad_grams(h)
    facts = factors_of(h, broad)
    allocate(h, sensitivity(h, [(facts, np.arange(32))]), facts, emit, f"alloc broad text (+{n_broad} sentences)")
    lines += ["", f"Seconds: {time.time() - start:.0f}; load average at the end: {os.getloadavg()}.", "",
              "Per-layer ranks of the allocations (weight name: rank; absent = kept whole):", ""]
    names = {w: name for name, _, w in h.layers}
    for label, ranks in ranks_of.items():
        if ranks and label.startswith("alloc"):
            lines.append(f"- {label}: " + ", ".join(f"{names[w].split('/')[3]}.{names[w].split('/')[-2]}"
                                                     f"{'' if 'dense' not in names[w] else '(' + names[w].split('/')[4] + ')'}"
                                                     f"={r}" for w, r in ranks.items()))
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out)
    return 0


def main_big(args, argv) -> int:
    load_before, start = os.getloadavg(), time.time()
    h = Harness()
    lines = ["# svd on MiniLM-L6: method study with a large calibration text (session 3)", "",
             f"Command: `python benchmarks/svd_study.py {' '.join(sys.argv[1:] if argv is None else argv)}`",
             f"Load average at start: {load_before}.", "",
             "Columns as in svd-2026-11-29-s2-study.md; \"calib\" = the 32 calibration sentences of inputs.py "
             "(not used by these rows), \"eval\" = the 32 evaluation sentences.", "",
             "| method | weight-MatMul FLOPs removed | calib worst cos | eval worst cos | eval mean cos | "
             "eval retrieval |", "|---|---|---|---|---|---|"]

    def emit(label, removed, calib, evaluation, _ranks):
        line = (f"| {label} | {removed:.3f} | {calib['worst']:.4f} | {evaluation['worst']:.4f} | "
                f"{evaluation['mean']:.4f} | {evaluation['retrieval']:.3f} |")
        print(line, flush=True)
        lines.append(line)
        args.out.write_text("\n".join(lines) + "\n")

    big = []
    big_study(h, args.big, emit, big)
    eval_facts = factors_of(h, h.grams("eval"))
    oracle = sensitivity(h, [(eval_facts, np.arange(32))], "eval")
    for lam in (3.2e-9, 5.6e-9):  # the session-2 oracle rows, now also scored on held-out WordNet sentences
        rep, ranks = pick(oracle, lam, truncated(eval_facts))
        emit(f"s2 oracle (fitted on eval) λ={lam:.1e}, scored on 64 WordNet sentences: worst "
             f"{h.score(rep, 'check')['worst']:.4f}", h.removed(ranks), h.score(rep, "calib"), h.score(rep), ranks)
    lines[6:6] = big
    lines += ["", f"Seconds: {time.time() - start:.0f}; load average at the end: {os.getloadavg()}."]
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
