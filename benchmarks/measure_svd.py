"""Measure the ``svd`` pass on MiniLM-L6 with a large offline calibration text (issue 6).

    python benchmarks/measure_svd.py --calib 2000 --runs 30 --name svd-2026-11-29-s3
    python benchmarks/measure_svd.py --pipeline "svd(target=0.95)" --calib 2000 --runs 30 --name svd-2026-11-29-s3-target095

Calibration: the first ``--calib`` sentences of ``data/svd_calib_sentences.txt`` (WordNet usage
examples, :mod:`build_svd_calib`), each one sample of batch 1 *unpadded* (its own length), so
every token of the statistics is a real one. Evaluation: the 32 evaluation sentences of
``inputs.py`` (second half of ``data/sentences.txt``, padded to 32 as everywhere in the suite),
never part of calibration. Then :func:`onnxslim_kit.bench.benchmark` on the evaluation samples —
original and result interleaved run by run, 1 intra-op thread, ORT optimizations ``all`` — for
the worst output cosine per output (``sentence_embedding`` is the embedding), the paraphrase
retrieval metric and the paired latency ratio. The pass's notes (ranks per layer) go into the
results file ``benchmarks/results/<--name>.md``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import inputs  # noqa: E402

CALIB_TEXT = HERE / "data" / "svd_calib_sentences.txt"


def calibration_samples(count: int) -> list:
    """Unpadded batch-1 MiniLM samples of the first ``count`` calibration sentences."""
    import export_minilm
    from tokenizers import Tokenizer

    lines = [s.strip() for s in CALIB_TEXT.read_text(encoding="utf-8").splitlines()
             if s.strip() and not s.startswith("#")]
    tokenizer = Tokenizer.from_file(str(export_minilm.tokenizer_path()))
    tokenizer.no_padding()  # tokenizer.json pads to 128 by default
    tokenizer.enable_truncation(inputs.MINILM_LENGTH)
    return [{"input_ids": np.array([e.ids], np.int64), "attention_mask": np.array([e.attention_mask], np.int64),
             "token_type_ids": np.array([e.type_ids], np.int64)} for e in tokenizer.encode_batch(lines[:count])]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", default="svd")
    parser.add_argument("--calib", type=int, default=2000, help="calibration sentences (default 2000)")
    parser.add_argument("--runs", type=int, default=30, help="timed interleaved rounds (default 30)")
    parser.add_argument("--name", default="svd-2026-11-29-s3")
    args = parser.parse_args(argv)
    from onnxslim_kit.bench import benchmark
    from onnxslim_kit.calibration import CalibrationFeed, input_specs
    from onnxslim_kit.model import load_proto
    from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

    command = f"python benchmarks/{Path(__file__).name} {' '.join(sys.argv[1:] if argv is None else argv)}"
    load_before = os.getloadavg()
    path = inputs.model_path("minilm_l6")
    data = inputs.build("minilm_l6", n_calib=2, n_eval=32, path=path)
    calib = calibration_samples(args.calib)
    evaluation = {s["input_ids"].tobytes() for s in data.eval}
    assert not any(s["input_ids"].tobytes() in evaluation for s in calib)
    original = load_proto(path)
    start = time.perf_counter()
    out, report = run_pipeline(original, parse_pass_list(args.pipeline), CalibrationFeed(input_specs(original), calib))
    seconds = time.perf_counter() - start
    load_after_pass = os.getloadavg()
    bench = benchmark([original, out], data.eval, names=["original", args.pipeline], runs=args.runs, warmup=3,
                      metric=data.metric, memory=False)
    row = bench.rows[1]
    drift = {k: d["cosine"] for k, d in (row.get("drift") or {}).items() if d}
    metric = row.get("metric") or {}
    tokens = sum(int(s["attention_mask"].sum()) for s in calib)
    lines = [f"# svd on MiniLM-L6 with {args.calib} calibration sentences ({tokens} real tokens)", "",
             f"Command: `{command}`", "",
             f"Load average before / after the pass / at the end: {load_before} / {load_after_pass} / "
             f"{os.getloadavg()} (2 shared cores).", "",
             "| pipeline | weight-MatMul FLOPs removed | params after/before | eval worst cos (per output) | "
             "retrieval (orig) | latency ratio (P10–P90 of paired ratios) | MACs vs original | pass s |",
             "|---|---|---|---|---|---|---|---|"]
    for entry in report.passes:
        if entry.name != "svd":
            continue
        m = entry.metrics
        lines.append(
            f"| `{args.pipeline}` | {m.get('flops_removed', 0):.4f} | "
            f"{m['params_after'] / max(m['params_before'], 1):.4f} | "
            f"{', '.join(f'{k} {v:.4f}' for k, v in drift.items())} | {metric.get('score', float('nan')):.3f} "
            f"({metric.get('score_original', float('nan')):.3f}) | {row.get('latency_ratio_vs_first', float('nan')):.3f} "
            f"({', '.join(f'{v:.3f}' for v in row.get('latency_ratio_spread') or [])}) | "
            f"{row['macs'] / bench.rows[0]['macs']:.4f} | {seconds:.0f} |")
        lines += ["", f"Held-out check (calibration samples not in the statistics): "
                      f"{m.get('target_cosine_measured')}; metrics `{m}`", ""]
        lines += [f"- {n}" for n in entry.notes]
    target = HERE / "results" / f"{args.name}.md"
    target.write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
