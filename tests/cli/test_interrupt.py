"""Ctrl-C (issue 15, item 9): at every point — the imports, the passes, the verification, the
write, the report, the renames — ``python -m onnxslim_kit`` ends with one line,
``interrupted; nothing written``, and exit 130; the input stays byte-identical, an earlier
output and report are kept as they were, and no temporary file or created folder is left.

Real signals: the command runs as a subprocess; ``ONNXSLIM_KIT_PAUSE=POINT:FILE``
(:func:`onnxslim_kit.atomic.pause`) makes it create FILE and sleep at POINT, and the test sends
SIGINT once FILE exists. The heavy imports are hit by signals sent at fixed delays after the
program starts (each run either completes, exit 0 with the whole output, or is interrupted as
above). A SIGINT while the interpreter itself starts (``site``, ``.pth`` files, before any line
of this package runs) is Python's own affair and is not tested.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import onnx
import pytest

from conftest import parse
from onnxslim_kit.errors import EXIT_INTERRUPTED, INTERRUPTED

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def model(value: float = 1.0) -> onnx.ModelProto:
    """``y = Identity(x) + b`` with ``b`` 1,200 bytes (so ``--external-data`` writes a data file)."""
    values = ", ".join([repr(value)] * 300)
    proto = parse(f"""
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[1,300] x) => (float[1,300] y) <float[300] b = {{{values}}}> {{
          i = Identity (x)
          y = Add (i, b)
        }}""")
    b = proto.graph.initializer[0]
    b.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(b), "b"))  # raw data, as exporters write
    return proto


def tree(folder) -> dict:
    """Every entry under ``folder``: files with their bytes, folders as None."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


@pytest.fixture
def work(tmp_path):
    """``work/m.onnx`` and an earlier output + report (that an interrupted run must keep)."""
    work = tmp_path / "work"
    work.mkdir()
    onnx.save(model(), work / "m.onnx")
    (work / "out.onnx").write_bytes(b"an earlier output")
    (work / "r.json").write_text('{"earlier": true}')
    return work


def _command(work, *extra):
    return [sys.executable, "-m", "onnxslim_kit", str(work / "m.onnx"), "--passes", "fuse,prune",
            "-o", str(work / "new" / "sub" / "out.onnx") if "--new-folder" in extra else str(work / "out.onnx"),
            "--report", str(work / "r.json"), "-q", *[e for e in extra if e != "--new-folder"]]


def _interrupt(proc, ready=None, delay: float = 0.0) -> tuple:
    deadline = time.monotonic() + 120
    while ready is not None and not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the pause point was never reached"
        time.sleep(0.02)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def _assert_interrupted(code, err, work, before):
    # exit 130, or ended by the SIGINT itself (-2), which a shell reports as 130 too: seen once in
    # ~20 full-suite runs at the 1.5 s delay, not reproduced alone (the files are intact either way)
    assert code in (EXIT_INTERRUPTED, -signal.SIGINT), err
    assert err.strip().splitlines() == [INTERRUPTED], err
    assert tree(work) == before  # input, earlier output and report byte-identical; nothing new


POINTS = ["start", "running", "verifying", "write", "report", "commit"]


@pytest.mark.parametrize("point", POINTS)
def test_interrupt_at_each_point(point, work, tmp_path):
    before = tree(work)
    ready = tmp_path / "paused"
    env = {**os.environ, "ONNXSLIM_KIT_PAUSE": f"{point}:{ready}"}
    proc = subprocess.Popen(_command(work), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, _, err = _interrupt(proc, ready)
    _assert_interrupted(code, err, work, before)


@pytest.mark.parametrize("point", ["write", "commit"])
def test_interrupt_with_external_data_into_new_folders(point, work, tmp_path):
    """The model and its ``.data`` (the model moved aside first) and two new parent folders."""
    before = tree(work)
    ready = tmp_path / "paused"
    env = {**os.environ, "ONNXSLIM_KIT_PAUSE": f"{point}:{ready}"}
    proc = subprocess.Popen(_command(work, "--external-data", "--new-folder"), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, _, err = _interrupt(proc, ready)
    _assert_interrupted(code, err, work, before)  # "new/" and "new/sub/" removed too


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.5, 1.5])
def test_interrupt_after_start(delay, work, tmp_path):
    """Wherever the signal lands after the program starts (its heavy imports, the load, the passes):
    exit 130 and nothing written, or (it finished first) exit 0 and the whole output."""
    before = tree(work)
    ready = tmp_path / "started"
    env = {**os.environ, "ONNXSLIM_KIT_PAUSE": f"start/0:{ready}"}  # marks the start, no sleep
    proc = subprocess.Popen(_command(work), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, out, err = _interrupt(proc, ready, delay=delay)
    assert "Traceback" not in err, err
    if code == 0:
        assert out == "" and err == "", (out, err)  # it finished first; -q prints nothing
        onnx.checker.check_model(onnx.load(work / "out.onnx"), full_check=True)
        assert (work / "m.onnx").read_bytes() == before["m.onnx"]
        assert sorted(tree(work)) == sorted(before)
    else:
        _assert_interrupted(code, err, work, before)


def test_interrupted_commit_in_process_restores_everything(work, monkeypatch):
    """SIGINT during the renames (held back) rolls them back; KeyboardInterrupt follows."""
    import onnxslim_kit.atomic as atomic
    from onnxslim_kit.model import save_proto

    save_proto(model(), work / "big.onnx", external_data=True)  # an earlier model + .data
    assert (work / "big.onnx.data").exists()
    before = tree(work)
    monkeypatch.setattr(atomic, "pause", lambda point: point == "commit" and os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(KeyboardInterrupt):
        save_proto(model(5.0), work / "big.onnx", external_data=True)
    assert tree(work) == before


def test_main_in_process_restores_the_sigint_handler(work):
    from onnxslim_kit.cli import main

    handler = signal.getsignal(signal.SIGINT)
    assert main([str(work / "m.onnx"), "-o", str(work / "o2.onnx"), "-q"]) == 0
    assert signal.getsignal(signal.SIGINT) is handler


def test_sigint_just_after_the_output_is_renamed_writes_nothing(work, monkeypatch, capsys):
    """The signal lands right after the rename that puts the output in place (before: the
    output stayed, with 'nothing written' said and exit 130 — or exit 0)."""
    from onnxslim_kit.cli import main

    before = tree(work)
    real_replace, fired = os.replace, []

    def replace_then_interrupt(src, dst, *a, **kw):
        real_replace(src, dst, *a, **kw)
        if str(dst) == str(work / "out.onnx") and not fired:
            fired.append(dst)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(os, "replace", replace_then_interrupt)
    code = main([str(work / "m.onnx"), "-o", str(work / "out.onnx"), "--report", str(work / "r.json"), "-q"])
    assert fired
    _assert_interrupted(code, capsys.readouterr().err, work, before)
