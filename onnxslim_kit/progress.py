"""Progress bars of the command line (tqdm on stderr), as the ``progress=`` callable passes get."""

from __future__ import annotations

import sys


def progress_bar(quiet: bool):
    """A ``progress(iterable, desc=, total=)`` callable drawing tqdm bars on stderr (none when quiet)."""
    from tqdm import tqdm

    def progress(iterable, desc: str = "", total: int | None = None, **_):
        return tqdm(iterable, desc=desc, total=total, disable=quiet or None, leave=False,
                    file=sys.stderr, mininterval=0.5)

    return progress
