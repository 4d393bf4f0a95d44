"""Files written under temporary names and put in place together, or not at all.

A :class:`StagedFiles` holds new files written in hidden ``.slim-*`` folders beside their
destinations (same file system, so every rename is atomic). :meth:`StagedFiles.put_in_place`
keeps each existing destination (a hard link, or the file itself moved, in the temporary
folder), then renames every new file into place in the order staged; :meth:`rollback` undoes
exactly that (the earlier files come back, byte for byte); :meth:`finish` drops what was kept;
:meth:`discard` removes the temporary folders and whatever is left in them.

A destination staged with ``vacate=True`` (a model whose ``.data`` file is replaced too) is
moved away before any new file goes in: the model and its data cannot be renamed together,
and for that moment there is no model rather than an old model paired with new weights.

Interrupts. :meth:`commit` runs with SIGINT held back (:func:`interrupts_held`): a Ctrl-C that arrives while the files are renamed stays
pending; if one did, the renames are rolled back, and ``KeyboardInterrupt`` is raised once the
signal is let through — an interrupted commit writes nothing. With ``then_ignore_interrupts``
(the command line, main thread only) the commit is the point of no return: once the files are
in place SIGINT is ignored (one held back is dropped), so the command ends as it
reports, exit 0 with the output written.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PAUSE_ENV = "ONNXSLIM_KIT_PAUSE"


def pause(point: str) -> None:
    """Test hook (``tests/cli/test_interrupt.py``): with ``ONNXSLIM_KIT_PAUSE=POINT:FILE`` in the
    environment, reaching ``POINT`` creates ``FILE`` and sleeps 60 s (``POINT/SECONDS:FILE``:
    that long), so a test can send SIGINT exactly there. Points: ``start`` (the command line parsed nothing yet), ``running`` /
    ``verifying`` (a pass, its verification starts), ``write`` (the model is in its temporary
    file), ``report`` (the report too), ``commit`` (files renamed into place, SIGINT held)."""
    spec = os.environ.get(PAUSE_ENV)
    where, _, path = (spec or "").partition(":")
    name, _, seconds = where.partition("/")
    if spec and name == point:
        Path(path).touch()
        deadline = time.monotonic() + float(seconds or 60)
        while time.monotonic() < deadline and not interrupt_pending():  # held back: pending
            time.sleep(0.01)


_HOLDS: list = []  # the active holds, innermost last


class _Hold:
    arrived = False  # a SIGINT came while held
    then_ignore = False  # when the block ends, ignore SIGINT from then on (the point of no return)

    def record(self, signum, frame) -> None:
        self.arrived = True


@contextmanager
def interrupts_held():
    """SIGINT is held back while the block runs: a Ctrl-C arriving then is recorded
    (:func:`interrupt_pending`) and handed, when the block ends, to the handler that was
    installed before (``KeyboardInterrupt`` by default; nothing when ignored). A Python-level
    handler, not a thread signal mask: the kernel gives a process's SIGINT to any thread that
    does not block it (ONNX Runtime's pool, say), and Python acts on it in the main thread only
    — so only there is there anything to hold back. Yields the hold (``then_ignore``)."""
    hold = _Hold()
    if threading.current_thread() is not threading.main_thread():
        yield hold
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, hold.record)
    _HOLDS.append(hold)
    try:
        yield hold
    finally:
        _HOLDS.remove(hold)
        if hold.then_ignore:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            return
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
        if hold.arrived and callable(previous):
            previous(signal.SIGINT, None)  # default_int_handler: KeyboardInterrupt
        elif hold.arrived and previous == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGINT)


def interrupt_pending() -> bool:
    """Whether a SIGINT arrived during the current :func:`interrupts_held` block."""
    return bool(_HOLDS) and _HOLDS[-1].arrived


@dataclass
class StagedFiles:
    folders: list = field(default_factory=list)    # temporary folders (removed by discard)
    moves: list = field(default_factory=list)      # (temporary file, destination, vacate)
    removals: list = field(default_factory=list)   # (destination to take away, temporary folder)
    _kept: list = field(default_factory=list)      # (destination, its earlier file kept here)
    _placed: list = field(default_factory=list)    # (temporary file, destination) renamed in
    created: list = field(default_factory=list)    # folders made for the destinations (removed by discard)

    def add(self, temporary: Path, destination: Path, vacate: bool = False) -> None:
        self.moves.append((Path(temporary), Path(destination), vacate))

    def remove(self, destination: Path, folder: Path) -> None:
        """Take ``destination`` away on commit (restored on rollback)."""
        self.removals.append((Path(destination), Path(folder)))

    def put_in_place(self) -> None:
        try:
            for temporary, destination, vacate in self.moves:
                if vacate:
                    self._keep(destination, temporary.parent, move=True)
            for destination, folder in self.removals:
                self._keep(destination, folder, move=True)
            for temporary, destination, vacate in self.moves:
                if not vacate:
                    self._keep(destination, temporary.parent, move=False)
            for temporary, destination, _ in self.moves:
                os.replace(temporary, destination)
                self._placed.append((temporary, destination))
        except OSError:
            self.rollback()
            raise

    def _keep(self, destination: Path, folder: Path, move: bool) -> None:
        if not (destination.exists() or destination.is_symlink()):
            return
        kept = folder / (".previous-" + destination.name)
        if not move and not destination.is_symlink():
            try:
                os.link(destination, kept)  # the destination keeps its file until the new one replaces it
                self._kept.append((destination, kept))
                return
            except OSError:
                pass  # no hard links here: moved instead
        os.replace(destination, kept)
        self._kept.append((destination, kept))

    def rollback(self) -> None:
        for temporary, destination in reversed(self._placed):
            os.replace(destination, temporary)
        for destination, kept in reversed(self._kept):
            os.replace(kept, destination)
        self._placed.clear()
        self._kept.clear()

    def finish(self) -> None:
        for _, kept in self._kept:
            if kept.exists() or kept.is_symlink():
                kept.unlink()
        self._kept.clear()
        self._placed.clear()
        self.created.clear()  # they hold the output now

    def discard(self) -> None:
        for folder in self.folders:
            for leftover in folder.iterdir() if folder.exists() else []:
                leftover.unlink()
            if folder.exists():
                folder.rmdir()
        self.folders.clear()
        for folder in reversed(self.created):
            try:
                folder.rmdir()
            except OSError:  # not empty (something else put a file there) or gone
                pass
        self.created.clear()

    def commit(self, then_ignore_interrupts: bool = False) -> None:
        """Put every file in place, or (error, interrupt) none; the temporary folders go."""
        try:
            with interrupts_held() as hold:
                self.put_in_place()
                pause("commit")
                if interrupt_pending():
                    self.rollback()  # KeyboardInterrupt when the signal is let through
                else:
                    hold.then_ignore = then_ignore_interrupts
                    self.finish()
        finally:
            with interrupts_held():
                self.discard()
