"""``python -m onnxslim_kit bench A.onnx B.onnx …``: measure models side by side (see :mod:`onnxslim_kit.bench`).

The first model is the reference: every other model gets its latency ratio and output drift
against it. Inputs come from ``--calib`` or are generated from the first model's input spec
(``--input-shape`` fixes dynamic dimensions), exactly as for the optimiser.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
from pathlib import Path

from ..errors import EXIT_BAD_INPUT, EXIT_OK, UserError
from .parsing import OneLineParser, positive_int

EPILOG = """\
examples:
  python -m onnxslim_kit bench model.onnx model.slim.onnx --runs 100
  python -m onnxslim_kit bench a.onnx b.onnx --threads 1,2 --ort-opt disable --report r.json --markdown r.md
  python -m onnxslim_kit bench a.onnx b.onnx --metric mytask:accuracy   # def accuracy(ref_outputs, outputs) -> dict
  python -m onnxslim_kit bench --providers list

The first model is the reference for the ×first latency ratio and the drift column.
Exit codes: 0 ok, 2 bad input (or a model ONNX Runtime cannot run: its row says why).
"""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="onnxslim-kit bench", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Latency (median/p90/p99, interleaved A B A B …), throughput, session time, peak memory, "
                    "size (raw and compressed), parameters, MACs and output drift of ONNX models, side by side.",
    )
    parser.add_argument("models", nargs="*", help=".onnx files; the first is the reference")
    parser.add_argument("--names", help="comma-separated display names, one per model (default: file names)")
    parser.add_argument("--providers", default="cpu",
                        help="comma list of execution providers, short (cpu, cuda, tensorrt, openvino, dml, "
                             "coreml) or full ORT names; 'list' prints those available (default cpu)")
    parser.add_argument("--threads", default="1", help="comma list of intra-op thread counts, 0 = ORT default (default 1)")
    parser.add_argument("--runs", type=positive_int, default=100, help="timed runs per model (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs per model first (default 10)")
    parser.add_argument("--ort-opt", default="all", choices=["disable", "basic", "extended", "all"],
                        help="ONNX Runtime graph optimisation level (default all, as deployed)")
    parser.add_argument("--batch", type=positive_int, help="stack samples to this batch size on dynamic first axes")
    parser.add_argument("--calib", metavar="PATH", help=".npz/.npy file or folder of them (default: random data)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:D1,D2,...",
                        help="fix an input's dynamic dimensions, e.g. x:1,3,224,224 (repeatable)")
    parser.add_argument("--num-samples", type=positive_int, default=8, help="random samples when --calib is not given (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="seed for generated inputs")
    parser.add_argument("--compression", default="zlib", choices=["zlib", "lzma"],
                        help="codec for the compressed size (default zlib)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory child processes")
    parser.add_argument("--metric", metavar="MODULE:FUNCTION",
                        help="task metric hook: FUNCTION(first_model_outputs, outputs) -> dict, lists of "
                             "{output: array} over the samples")
    parser.add_argument("--report", metavar="JSON", help="write all numbers as JSON to this file")
    parser.add_argument("--markdown", metavar="MD", help="write the table as Markdown to this file")
    parser.add_argument("-q", "--quiet", action="store_true", help="no table, no progress bar")
    return parser


def _int_list(text: str, option: str) -> list:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{option} {text!r}: expected comma-separated integers") from None
    if not values:
        raise UserError(f"{option}: no values")
    return values


def load_metric(spec: str):
    """``module:function`` → the function, wrapped so its failures become one-line user errors."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise UserError(f"--metric {spec!r}: expected module:function")
    sys.path.insert(0, str(Path.cwd()))  # a hook file beside the user's models, as with `python -m`
    try:
        func = getattr(importlib.import_module(module_name), func_name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"--metric {spec}: cannot load ({exc})") from None
    finally:
        sys.path.pop(0)

    def metric(reference, outputs):
        try:
            result = func(reference, outputs)
        except Exception as exc:  # noqa: BLE001 - the user's code
            raise UserError(f"--metric {spec} raised {type(exc).__name__}: {exc}") from None
        if not isinstance(result, dict):
            raise UserError(f"--metric {spec} returned {type(result).__name__}, expected a dict")
        return result

    return metric


def main(argv: list) -> int:
    from .. import bench
    from ..calibration import CalibrationFeed, input_specs, parse_input_shapes
    from ..progress import progress_bar
    from ..model import check_writable, load_proto

    args = build_parser().parse_args(argv)
    if args.providers.strip().lower() == "list":
        for name in bench.list_providers():
            print(f"{name:10s} {bench.PROVIDERS.get(name, name)}")
        return EXIT_OK
    if not args.models:
        raise UserError("bench: no models given (see bench --help)")
    providers = [p for p in args.providers.split(",") if p.strip()]
    for p in providers:
        bench.resolve_provider(p)  # a missing provider fails before any work
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    for target in (args.report, args.markdown):
        if target:
            check_writable(target)  # before any work
    feed = CalibrationFeed(input_specs(load_proto(args.models[0])), args.calib,
                           parse_input_shapes(args.input_shape), num_samples=args.num_samples, seed=args.seed)
    report = bench.benchmark(
        args.models, list(feed), names=names, providers=providers, threads=_int_list(args.threads, "--threads"),
        runs=args.runs, warmup=args.warmup, opt_level=args.ort_opt, batch=args.batch,
        metric=load_metric(args.metric) if args.metric else None, progress=progress_bar(args.quiet),
        memory=not args.no_memory, compression=args.compression,
    )
    report.settings["command"] = "python -m onnxslim_kit bench " + shlex.join(argv)
    report.settings["inputs"] = "generated (seeded)" if feed.generated else str(args.calib)
    _write_files({args.report: report.to_json(), args.markdown: report.markdown() + "\n"})
    if not args.quiet:
        print(report.table())
    failed = [row for row in report.rows if row.get("error")]
    return EXIT_BAD_INPUT if failed else EXIT_OK


def _write_files(texts: dict) -> None:
    """``{path: text}`` (paths None skipped) written together, atomically: a Ctrl-C or an error
    writes none of them."""
    from ..model import write_staged

    write_staged({path: (lambda tmp, text=text: tmp.write_text(text)) for path, text in texts.items()})
