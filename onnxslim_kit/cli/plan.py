"""``python -m onnxslim_kit plan MODEL --calib C -o OUT``: plan the pipeline (:mod:`onnxslim_kit.plan`).

Writes, together and atomically (an error or a Ctrl-C writes none of them): the chosen
candidate's model (``-o``), its optimize report as a recipe (``--recipe``: ``python -m
onnxslim_kit MODEL --recipe recipe.json -o OUT`` replays it to the same bytes, no timing), the
plan's JSON (``--report``), the timing cache (``--timing-cache``, read first when it exists) and
the self-contained HTML page (``--html``, :mod:`onnxslim_kit.plan.html`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ..errors import EXIT_OK, UserError
from .parsing import OneLineParser, positive_int

EPILOG = """\
examples:
  python -m onnxslim_kit plan model.onnx --calib samples/ -o model.plan.onnx --recipe recipe.json
  python -m onnxslim_kit plan model.onnx --calib c.npz --eval e.npz --target top1:0.99 --timing-cache t.json -o out.onnx
  python -m onnxslim_kit plan model.onnx --calib c.npz --goal memory --html plan.html -o out.onnx
  python -m onnxslim_kit plan model.onnx --calib c.npz --executor ray --ray-address head:6379 -o out.onnx
  python -m onnxslim_kit model.onnx --recipe recipe.json -o again.onnx     # replay the choice, no timing

exit codes: 0 ok, 1 internal error, 2 bad input or option, 130 interrupted (nothing written)
"""


def _budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected seconds > 0, not {text!r}")
    return value


def _threads(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected one integer >= 0 (0: ONNX Runtime's default), not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from ..plan import GOALS
    from ..plan.executor import EXECUTORS

    parser = OneLineParser(
        prog="onnxslim-kit plan", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Try whole pipelines (fuse, fuse,int8, fuse,dynamic, fuse,fp16, fuse,prune, "
                    "fuse,prune,int8; goal size adds fuse,cluster), keep those that hold --target on "
                    "held-out samples, time them against the original on this machine and write the "
                    "fastest (or smallest), with a replayable recipe.")
    parser.add_argument("model", nargs="?", help="input .onnx file (never modified)")
    parser.add_argument("-o", "--output", help="the chosen model (default: <model>.slim.onnx beside the input)")
    parser.add_argument("--calib", metavar="PATH", help=".npz/.npy file or folder of them (default: random data)")
    parser.add_argument("--eval", metavar="PATH",
                        help="held-out samples judging the target (default: one calibration sample in four)")
    parser.add_argument("--target", metavar="T", default=None,
                        help="fidelity the pipeline holds: cos:V, top1:V, rel:V or none (default cos:0.99)")
    parser.add_argument("--goal", default="latency", choices=GOALS, help="what to minimise: latency, file size or the session's peak memory (default latency)")
    parser.add_argument("--providers", default="cpu", help="the execution provider to time on (one; default cpu)")
    parser.add_argument("--threads", type=_threads, default=1, help="intra-op threads when timing (default 1)")
    parser.add_argument("--recipe", metavar="JSON", help="write the chosen pipeline's report (replay: --recipe)")
    parser.add_argument("--timing-cache", metavar="JSON",
                        help="timings keyed by model sha256, provider, threads, ORT version and CPU; read "
                             "when it exists, extended and written back")
    parser.add_argument("--budget-s", type=_budget, metavar="S",
                        help="stop trying new pipelines after S seconds (those left are reported as skipped)")
    parser.add_argument("--report", metavar="JSON", help="write every candidate, the Pareto front and the choice")
    parser.add_argument("--html", metavar="HTML",
                        help="write one self-contained page: the table, the Pareto front, fidelity per view, "
                             "size and latency by op (ORT's profiler) of the original and the chosen model")
    parser.add_argument("--runs", type=positive_int, default=50, help="timed rounds (default 50)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed rounds first (default 5)")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:D1,D2,...",
                        help="fix an input's dynamic dimensions, e.g. x:1,3,224,224 (repeatable)")
    parser.add_argument("--num-samples", type=positive_int, default=8,
                        help="random samples to generate when --calib is not given (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="seed for generated data and random choices")
    parser.add_argument("--pipelines", metavar="P;P…",
                        help="the candidates to try, ';' between pipelines, e.g. 'fuse;fuse,int8;fuse,fp16' "
                             "(fuse is always tried first; default: the goal's pipelines above)")
    parser.add_argument("--executor", default="local", choices=EXECUTORS,
                        help="where the optimize runs go: this process one after the other (local, the "
                             "default) or Ray tasks in parallel (ray; pip install onnxslim_kit[ray]); "
                             "timings are one benchmark on this machine either way")
    parser.add_argument("--ray-address", metavar="HOST:PORT",
                        help="with --executor ray: an existing cluster (ray start --head; HOST:6379); "
                             "default: start a local one on this machine's CPUs")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    return parser


def _checked(args) -> tuple:
    """``(model, output, provider)`` after checking everything that needs no work."""
    from ..calibration import parse_input_shapes
    from ..fidelity import Target
    from ..model import check_writable
    from .optimize import _refuse_overwriting_input, default_output

    if not args.model:
        raise UserError("plan: no model given (see plan --help)")
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    if len(providers) != 1:
        raise UserError(f"--providers {args.providers!r}: plan times on one provider (e.g. cpu)")
    if args.warmup < 0:
        raise UserError(f"--warmup {args.warmup}: expected an integer >= 0")
    if args.target is not None:
        Target.parse(args.target)
    model = Path(args.model)
    if not model.is_file():
        raise UserError(f"plan: {model}: no such file")
    output = Path(args.output) if args.output else default_output(model)
    _refuse_overwriting_input(model, output, Path(args.report) if args.report else None)
    files = [output, args.recipe, args.report, args.timing_cache, args.html]
    named = [str(Path(f).resolve()) for f in files if f]
    if len(set(named)) != len(named):
        raise UserError("plan: -o, --recipe, --report, --timing-cache and --html must be different files")
    if str(model.resolve()) in named[1:]:
        raise UserError(f"plan: {model} is the input model; --recipe, --report, --timing-cache and --html "
                        "must be other files")
    for target in files:
        if target:
            check_writable(target)
    parse_input_shapes(args.input_shape)
    return model, output, providers[0]


def _executor(args) -> tuple:
    """``(pipelines, executor)``, checked before any work (without Ray: one line, exit 2)."""
    from ..plan.candidates import checked_pipelines
    from ..plan.executor import make_executor

    pipelines = checked_pipelines(args.pipelines, args.goal) if args.pipelines is not None else None
    return pipelines, make_executor(args.executor, args.ray_address)


def _recipe_json(result, output: Path, argv: list) -> str:
    report = result.chosen.report
    report.output_path = str(output)
    report.argv = ["python", "-m", "onnxslim_kit", "plan"] + list(argv)
    data = json.loads(report.to_json())
    data["planned"] = {"pipeline": result.chosen.pipeline, "goal": result.settings["goal"],
                       "timing": result.chosen.timing}
    return json.dumps(data, indent=2)


def _html(result, model: Path) -> str:
    from ..model import load_proto
    from ..plan.html import page

    return page(result, load_proto(model))


def main(argv: list, program: bool = False) -> int:
    from ..calibration import parse_input_shapes
    from ..model import stage_file, stage_proto
    from ..atomic import interrupts_held
    from ..plan import plan
    from ..plan.report import table, to_json
    from ..plan.timing_cache import TimingCache
    from ..progress import progress_bar

    args = build_parser().parse_args(argv)
    model, output, provider = _checked(args)
    pipelines, executor = _executor(args)
    cache = TimingCache(args.timing_cache)
    result = plan(model, calib=args.calib, eval_data=args.eval, target=args.target, goal=args.goal,
                  provider=provider, threads=args.threads, timing_cache=cache, budget_s=args.budget_s,
                  runs=args.runs, warmup=args.warmup, input_shapes=parse_input_shapes(args.input_shape),
                  num_samples=args.num_samples, seed=args.seed, progress=progress_bar(args.quiet),
                  profile=bool(args.html), pipelines=pipelines, executor=executor)
    texts = {args.recipe: lambda: _recipe_json(result, output, argv), args.report: lambda: to_json(result),
             args.timing_cache: cache.to_json, args.html: lambda: _html(result, model)}
    staged = stage_proto(result.chosen.proto, output)
    try:
        for path, text in texts.items():
            if path:
                stage_file(path, staged, lambda tmp, text=text: tmp.write_text(text()))
        if not args.quiet:
            print(table(result))
        staged.commit(then_ignore_interrupts=program)
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror or exc}") from None
    finally:
        with interrupts_held():
            staged.discard()
    if not args.quiet:
        print(f"wrote {output} ({result.chosen.pipeline})")
    return EXIT_OK
