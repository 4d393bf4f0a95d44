"""Errors the command line turns into one-line messages and exit codes.

Exit codes (stable, for deployment builds to gate on):

====  ==========================================================
0     success
1     internal error (a bug: please report it with the traceback from ``--debug``)
2     bad input: missing/unreadable/invalid model, bad option, bad calibration data
3     verification failed under ``--strict``
130   interrupted (Ctrl-C, as a shell reports SIGINT): nothing written
====  ==========================================================
"""

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_VERIFY_FAILED = 3
EXIT_INTERRUPTED = 130
INTERRUPTED = "interrupted; nothing written"


class SlimError(Exception):
    """Base class of the errors with a user-facing message."""

    exit_code = EXIT_INTERNAL


class UserError(SlimError):
    """The input (model file, option, calibration data) is not usable; the message says why."""

    exit_code = EXIT_BAD_INPUT


class VerificationError(SlimError):
    """A pass changed the outputs beyond tolerance and ``--strict`` was given."""

    exit_code = EXIT_VERIFY_FAILED


class PassError(SlimError):
    """A pass raised an unexpected exception (a bug in that pass); the message names the pass
    and the passes that ran before it. The original exception is its ``__cause__``."""

    exit_code = EXIT_INTERNAL
