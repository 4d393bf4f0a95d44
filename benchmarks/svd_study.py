"""Study of post-training low-rank methods on MiniLM-L6 (issue 6): which method, which ranks.

    python benchmarks/svd_study.py [--out benchmarks/results/svd-2026-11-29-s2-study.md]

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
  that layer alone factorised) then a Lagrangian allocation (see passes/_svd_alloc.py) —
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


def allocate(h, sens, facts, emit, label):
    for lam in np.geomspace(1e-9, 1e-7, 9):
        rep, ranks = {}, {}
        for w, options in sens.items():
            best = min([(0.0, None)] + [(loss - lam * saved, r) for r, saved, loss in options], key=lambda t: t[0])
            if best[1]:
                a, b, _ = facts[w]
                ranks[w], rep[w] = best[1], a[:, :best[1]] @ b[:best[1]]
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "results" / "svd-2026-11-29-s2-study.md")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    raise SystemExit(main())
