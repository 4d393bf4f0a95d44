"""argparse with one-line errors, and the option-value types of the command line.

argparse reports a bad command line with a usage block and ``SystemExit(2)``; here every such
error is a :class:`~onnxslim_kit.errors.UserError` instead (one line, exit 2, as every other
bad input): ``error: --num-samples: invalid int value: 'many' (see --help)``.
"""

from __future__ import annotations

import argparse
import math

from ..errors import UserError


class OneLineParser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are :class:`UserError` (one line)."""

    def error(self, message: str):
        raise UserError(f"{message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    """An integer >= 1 (argparse ``type=``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, not {text!r}")
    return value


def tolerance(text: str) -> float:
    """A finite float >= 0 (argparse ``type=``)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, not {text!r}")
    return value
