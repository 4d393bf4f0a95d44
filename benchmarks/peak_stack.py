"""Where one CLI run's memory peaks: the main thread's stack at the highest resident memory.

    python benchmarks/peak_stack.py MODEL.onnx --passes fuse,svd --calib CALIB.npz -o OUT.onnx

Runs ``python -m onnxslim_kit`` with the given arguments in this process while a thread reads
``/proc/self/status`` every 20 ms (``RssAnon``: heap, ``RssFile``: mapped weight pages). At each
new maximum of RssAnon + RssFile, and of RssAnon alone, it keeps the main thread's stack
(``sys._current_frames``, the frames inside ``onnxslim_kit``). Printed at the end (stderr):
both peaks in MB, the other figure at that moment, and the stack, innermost frame last. Linux
only; a spike shorter than 20 ms may be missed; the sampler costs a few percent of one core.
"""

from __future__ import annotations

import sys
import threading
import traceback

PERIOD_S = 0.02


def _status_kb() -> dict:
    found = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile"):
                found[key] = int(value.split()[0])
    return found


class PeakStacks:
    """The sampler: ``peaks[kind] = (anon MB, file MB, stack lines)`` for ``total`` and ``anon``."""

    def __init__(self, main_ident: int):
        self._main = main_ident
        self._stop = threading.Event()
        self.peaks = {"total": (0.0, 0.0, []), "anon": (0.0, 0.0, [])}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _stack(self) -> list:
        frame = sys._current_frames().get(self._main)
        lines = traceback.format_stack(frame) if frame is not None else []
        return [line.rstrip() for line in lines if "onnxslim_kit" in line or "passes/" in line]

    def _run(self) -> None:
        while not self._stop.wait(PERIOD_S):
            kb = _status_kb()
            anon, file = kb.get("RssAnon", 0) / 1024, kb.get("RssFile", 0) / 1024
            if anon + file > sum(self.peaks["total"][:2]):
                self.peaks["total"] = (anon, file, self._stack())
            if anon > self.peaks["anon"][0]:
                self.peaks["anon"] = (anon, file, self._stack())

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and print both peaks (stderr)."""
        self._stop.set()
        self._thread.join()
        for kind, (anon, file, stack) in self.peaks.items():
            print(f"\n=== peak {kind}: anon {anon:.0f} MB + file {file:.0f} MB = {anon + file:.0f} MB",
                  file=sys.stderr)
            print("\n".join(stack[-14:]), file=sys.stderr)


def main(argv: list) -> int:
    from onnxslim_kit.cli import main as cli_main

    sampler = PeakStacks(threading.get_ident())
    sampler.start()
    try:
        code = cli_main(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        sampler.stop()
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
