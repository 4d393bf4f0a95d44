"""Measure ``fp16`` and ``int4`` on the real models, against ONNX Runtime's own quantizers.

    python benchmarks/measure_fp16_int4.py                          # every section (≈ 30 min here)
    python benchmarks/measure_fp16_int4.py --sections int4 --int4-models minilm_l6 --runs 10

Sections (results in ``benchmarks/results/fp16_int4-<UTC date>.md``, written after each one):

``fp16``   ``fp16``, ``fuse,fp16`` (and with ``compact``) on the conv models: file size vs the original, worst output
           cosine over the evaluation samples, NaN/Inf where float32 had none, paired latency.
``int4``   per model (MiniLM, PP-OCRv4 rec, MTCNN ONet): our int4 variants, ONNX Runtime's
           ``MatMulNBitsQuantizer`` (C++ RTN, Python RTN, GPTQ) and our ``dynamic`` int8 — MatMul
           weight bytes vs float32 (MatMulNBits B + scales + zero points, plus awq's Mul scales),
           worst-sample cosine per output, task metric, tool seconds (in-process, no
           verification) and the paired latency ratio vs float32 (ORT opt all, 1 thread).
           MiniLM calibrates on the calibration half of ``data/sentences.txt`` plus
           ``data/calib_sentences.txt``; evaluation is the other half of ``sentences.txt`` only.
``gptq``   seconds of one GPTQ layer (factor, sweep) at 1024² and 4096² on random data.
``stream`` peak RSS of ``python -m onnxslim_kit M --passes int4`` (and of a load-only child)
           on a model saved with external data, vs its file size.

The machine is 2 shared cores under other engineers' load: latency ratios are medians of
interleaved paired rounds and still noisy; tool times include waiting for the CPU.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import anchors
import inputs
import numpy as np

HERE = Path(__file__).resolve().parent
FP16_MODELS = ["ppocrv4_det", "ppocr_cls_v2", "orientation"]
FP16_PIPELINES = ["fp16", "fuse,fp16", "fp16,compact", "fuse,fp16,compact"]
INT4_MODELS = ["minilm_l6", "ppocrv4_rec", "mtcnn_onet"]
CALIB_SENTENCES = HERE / "data" / "calib_sentences.txt"
OURS_INT4 = [  # the default (GPTQ act_order asym block 64, H-weighted range search, 8-bit layers within 0.16×)
    "int4",
    "int4(max_ratio=0)",  # the same, int4 only
    "int4(method=rtn,max_ratio=0)",
    "int4(method=rtn,block_size=32,symmetric=true,search=false,act_order=false,max_ratio=0)",  # session 1 default
]


def parse_args(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", default="fp16,int4,gptq,stream", help="comma list")
    parser.add_argument("--fp16-models", default=",".join(FP16_MODELS))
    parser.add_argument("--int4-models", default=",".join(INT4_MODELS))
    parser.add_argument("--fp16-pipelines", nargs="*", default=FP16_PIPELINES, help="our fp16 pipelines")
    parser.add_argument("--ours", nargs="*", default=OURS_INT4, help="our int4 pipelines")
    parser.add_argument("--calib", type=int, default=16, help="calibration samples from inputs.py (default 16)")
    parser.add_argument("--eval", type=int, default=16, help="evaluation samples (default 16; MiniLM: 32)")
    parser.add_argument("--runs", type=int, default=15, help="timed interleaved rounds (default 15)")
    parser.add_argument("--stream-mb", type=int, default=256, help="weights of the streaming model (default 256)")
    parser.add_argument("--no-ort", action="store_true", help="int4: skip ONNX Runtime's quantizers")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="results folder")
    parser.add_argument("--name", help="results file stem (default fp16_int4-<UTC date>)")
    return parser.parse_args(argv)


# --- helpers ---------------------------------------------------------------------------------

def model_data(name: str, args):
    """(original proto, ModelData); MiniLM gets the extra calibration sentences and 32 eval sentences."""
    from onnxslim_kit.model import load_proto

    path = inputs.model_path(name)
    data = inputs.build(name, n_calib=args.calib, n_eval=32 if name == "minilm_l6" else args.eval, path=path)
    if name == "minilm_l6":
        data.calib += minilm_samples([s.strip() for s in CALIB_SENTENCES.read_text().splitlines() if s.strip()])
    return load_proto(path), data


def minilm_samples(sentences: list) -> list:
    """Tokenized like inputs.py's MiniLM samples (padded/truncated to 32 tokens)."""
    import export_minilm
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(export_minilm.tokenizer_path()))
    tokenizer.enable_padding(length=inputs.MINILM_LENGTH)
    tokenizer.enable_truncation(inputs.MINILM_LENGTH)
    return [{"input_ids": np.array([e.ids], np.int64), "attention_mask": np.array([e.attention_mask], np.int64),
             "token_type_ids": np.array([e.type_ids], np.int64)} for e in tokenizer.encode_batch(sentences)]


def run_ours(original, spec: str, calib: list) -> tuple:
    """(model, seconds, pass metrics) of our pipeline, in-process, without verification."""
    from onnxslim_kit.calibration import CalibrationFeed, input_specs
    from onnxslim_kit.pipeline import parse_pass_list, run_pipeline

    start = time.perf_counter()
    out, report = run_pipeline(original, parse_pass_list(spec), CalibrationFeed(input_specs(original), calib),
                               verify=False)
    return out, time.perf_counter() - start, report.passes[-1].metrics


def run_ort_quantizer(original, kind: str, calib: list, block_size: int = 32) -> tuple:
    """(model, seconds) of ONNX Runtime's MatMulNBitsQuantizer (symmetric, like our default)."""
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        GPTQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
        RTNWeightOnlyQuantConfig,
    )

    from onnxslim_kit.model import Model

    class Reader(CalibrationDataReader):
        def __init__(self, samples):
            self.samples, self.i = samples, 0

        def get_next(self):
            self.i += 1
            return self.samples[self.i - 1] if self.i <= len(self.samples) else None

        def rewind(self):
            self.i = 0

    config = {"rtn_cpp": lambda: DefaultWeightOnlyQuantConfig(block_size=block_size, is_symmetric=True),
              "rtn": RTNWeightOnlyQuantConfig,
              "gptq": lambda: GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader(calib), block_size=block_size)}
    normalized = Model.from_proto(original).to_proto()  # Constant-node weights → initializers, as ours sees them
    start = time.perf_counter()
    quantizer = MatMulNBitsQuantizer(copy.deepcopy(normalized), block_size=block_size, is_symmetric=True,
                                     algo_config=config[kind]())
    quantizer.process()
    model = quantizer.model.model if hasattr(quantizer.model, "model") else quantizer.model
    return model, time.perf_counter() - start


def matmul_weight_ratio(original, proto) -> float | None:
    """Bytes of the int4 weights (MatMulNBits B, scales, zero points; awq Mul scales) over the
    float bytes of the weights they replace (K·N·4)."""
    from onnx import helper, numpy_helper

    inits = {t.name: t for t in proto.graph.initializer}
    before = after = 0
    for node in proto.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            before += attrs["K"] * attrs["N"] * 4
            after += sum(numpy_helper.to_array(inits[i]).nbytes for i in node.input[1:4] if i in inits)
    after += sum(numpy_helper.to_array(t).nbytes for t in proto.graph.initializer if "awq_inv_scale" in t.name)
    return after / before if before else None


def fidelity(original, variants: dict, data) -> dict:
    """Per variant: worst-sample cosine per output, NaN/Inf counts, task metric (vs float32)."""
    from onnxslim_kit.metrics import compare, merge
    from onnxslim_kit.runtime import make_session, run

    ref_session = make_session(original, "all", threads=1)
    ref = [run(ref_session, s) for s in data.eval]
    out = {}
    for name, proto in variants.items():
        session = make_session(proto, "all", threads=1)
        outs = [run(session, s) for s in data.eval]
        drift = {k: merge([compare(r[k], o[k]) for r, o in zip(ref, outs)]) for k in ref[0]}
        nonfinite = sum(int((~np.isfinite(o[k])).sum()) for o in outs for k in o)
        ref_nonfinite = sum(int((~np.isfinite(r[k])).sum()) for r in ref for k in r)
        task = data.metric(ref, outs) if data.metric else {}
        out[name] = {"cosine": {k: d.cosine for k, d in drift.items()}, "nonfinite": nonfinite,
                     "ref_nonfinite": ref_nonfinite, "task": task}
    return out


def latency(original, variants: dict, data, runs: int) -> dict:
    """Paired latency ratio vs float32 (median, spread) of every variant, interleaved."""
    from onnxslim_kit.bench import benchmark

    names = list(variants)
    report = benchmark([original] + [variants[n] for n in names], data.eval[:8], names=["fp32"] + names,
                       threads=(1,), runs=runs, warmup=3, opt_level="all", memory=False)
    return {n: (row.get("latency_ratio_vs_first"), row.get("latency_ratio_spread"), row.get("error"))
            for n, row in zip(names, report.rows[1:])}


def measured(original, variants: dict, data, args):
    """(name, model, fidelity entry, task metric, latency cell) per variant."""
    fid, lat = fidelity(original, variants, data), latency(original, variants, data, args.runs)
    for name, proto in variants.items():
        ratio, spread, error = lat[name]
        yield name, proto, fid[name], fid[name]["task"], f"{fmt(ratio)} ({fmt(spread)}){' ' + error if error else ''}"


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 10 else f"{value:.1f}"
    return "" if value is None else str(value)


def worst_cosine(entry: dict) -> str:
    return ", ".join(f"{k} {v:.5f}" for k, v in entry["cosine"].items())


# --- sections -------------------------------------------------------------------------------

def section_fp16(args) -> list:
    lines = ["## fp16", "", ("| model | pipeline | file vs original | worst cosine per output | NaN/Inf (fp32) "
             "| task | latency vs fp32 (spread) | tool s |"), "|---|---|---|---|---|---|---|---|"]
    for name in args.fp16_models.split(","):
        original, data = model_data(name, args)
        variants, seconds, notes = {}, {}, {}
        for spec in args.fp16_pipelines:
            variants[spec], seconds[spec], notes[spec] = run_ours(original, spec, data.calib)
        for spec, proto, f, task, lat in measured(original, variants, data, args):
            lines.append(f"| {name} | `{spec}` | {proto.ByteSize() / original.ByteSize():.4f} | {worst_cosine(f)} | "
                         f"{f['nonfinite']} ({f['ref_nonfinite']}) | {task.get('task', '')} "
                         f"{fmt(task.get('score'))} (fp32 {fmt(task.get('score_original'))}) | {lat} | "
                         f"{seconds[spec]:.1f} |")
            log(lines[-1])
    return lines


def section_int4(args) -> list:
    lines = ["## int4 (block 32 unless the variant says otherwise)", "",
             ("| model | variant | MatMul weights vs fp32 | worst-sample cosine per output | task (agreement) "
             "| tool s | latency vs fp32 (spread) |"), "|---|---|---|---|---|---|---|"]
    for name in args.int4_models.split(","):
        original, data = model_data(name, args)
        variants, seconds, notes = {}, {}, {}
        for spec in args.ours + ["dynamic"]:
            key = f"ours: {spec}"
            try:
                variants[key], seconds[key], notes[key] = run_ours(original, spec, data.calib)
            except Exception as exc:  # noqa: BLE001 - a failing variant is a row
                lines.append(f"| {name} | {key} | failed: {type(exc).__name__}: {exc} |")
        for kind in () if args.no_ort else ("rtn_cpp", "rtn", "gptq"):
            key = f"ORT MatMulNBitsQuantizer {kind}"
            try:
                variants[key], seconds[key] = run_ort_quantizer(original, kind, data.calib)
            except Exception as exc:  # noqa: BLE001
                lines.append(f"| {name} | {key} | failed: {type(exc).__name__}: {str(exc)[:200]} |")
        log(f"{name}: {len(variants)} variants made")
        for key, proto, f, task, lat in measured(original, variants, data, args):
            lines.append(f"| {name} | {key} | {fmt(matmul_weight_ratio(original, proto))} | {worst_cosine(f)} | "
                         f"{task.get('task', '')} {fmt(task.get('score'))} ({fmt(task.get('agreement'))}) | "
                         f"{seconds[key]:.1f} | {lat} |")
            log(lines[-1])
        lines += [""] + [f"- {name} {k}: awq α per input {v.get('awq_alpha')}" for k, v in notes.items()
                         if v.get("awq_alpha")] + [""]
    return lines


def section_gptq(args) -> list:
    from onnxslim_kit.passes.int4 import gptq as gq
    from onnxslim_kit.passes._common.blas import blas_threads

    rng = np.random.default_rng(0)
    lines = ["## GPTQ time per layer (random W, X with 2·K rows, block 128, 1 BLAS thread)", "",
             "| layer | XᵀX s | factor s | sweep s |", "|---|---|---|---|"]
    for k in (1024, 4096):
        wt = rng.standard_normal((k, k)).astype(np.float32)
        x = rng.standard_normal((2 * k, k)).astype(np.float32)
        t0 = time.perf_counter()
        with blas_threads(1):
            xtx = gq.hessian_update(None, x)
        t1 = time.perf_counter()
        factor = gq.gptq_factor(xtx, 0.01, threads=1)
        t2 = time.perf_counter()
        gq.quantize_gptq(wt, xtx, 128, True, factor=factor, threads=1)
        t3 = time.perf_counter()
        lines.append(f"| {k}×{k} | {t1 - t0:.2f} | {t2 - t1:.2f} | {t3 - t2:.2f} |")
        log(lines[-1])
    return lines


def section_stream(args) -> list:
    """Peak RSS of the CLI's int4 on an external-data model vs its file size (and vs a load-only child)."""
    from onnx import TensorProto, helper, numpy_helper

    from onnxslim_kit.model import save_proto

    k = 1024
    layers = max(1, args.stream_mb * (1 << 20) // (k * k * 4))
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(layers):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, k)) / 32).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
        prev = f"h{i}"
    graph = helper.make_graph(nodes, "stream", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, k])], inits)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    lines = ["## streaming: peak memory on an external-data model", ""]
    with tempfile.TemporaryDirectory(prefix="stream-") as tmp:
        src = save_proto(proto, Path(tmp) / "big.onnx", external_data=True)
        del proto, inits, graph
        size_mb = sum(p.stat().st_size for p in Path(tmp).iterdir()) / 2**20
        load_only = [sys.executable, "-c", ("import sys; from onnxslim_kit.model import Model; "
                     "m = Model.load(sys.argv[1]); m.to_proto()"), str(src)]
        cli = [sys.executable, "-m", "onnxslim_kit", str(src), "--passes", "int4", "-o", str(Path(tmp) / "q.onnx"),
               "-q"]
        base = anchors.measure([sys.executable, "-c", "import onnxslim_kit.pipeline, onnxruntime"])
        for label, cmd in (("python + imports", base), ("load + to_proto", load_only), ("CLI int4", cli)):
            result = cmd if isinstance(cmd, dict) else anchors.measure(cmd)
            lines.append(f"- {label}: peak RSS {result['peak_rss_mb']} MB, {result['wall_seconds']} s"
                         f"{'' if result['returncode'] == 0 else ' FAILED: ' + anchors.last_error_line(result['stderr'])}"
                         f" (file {size_mb:.0f} MB, {layers} MatMul weights of {k}×{k})")
            log(lines[-1])
    return lines


def log(text: str) -> None:
    print(text, flush=True)


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    date = datetime.now(timezone.utc)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / f"{args.name or 'fp16_int4-' + date.date().isoformat()}.md"
    import onnxruntime

    head = [f"# fp16 / int4 measurements, {date.isoformat(timespec='minutes')}", "",
            f"Command: `python benchmarks/{Path(__file__).name} {' '.join(argv)}`",
            (f"onnxruntime {onnxruntime.__version__}, CPU provider, 1 intra-op thread, ORT opt all, "
            f"{args.runs} interleaved rounds on 8 evaluation samples for latency (2 shared cores: noisy). "
            f"Load average at start {tuple(round(x, 1) for x in os.getloadavg())}."), ""]
    body = []
    sections = {"fp16": section_fp16, "int4": section_int4, "gptq": section_gptq, "stream": section_stream}
    for name in args.sections.split(","):
        body += sections[name](args) + [""]
        target.write_text("\n".join(head + body + [f"Load average at the end: {os.getloadavg()}", ""]))
    print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
