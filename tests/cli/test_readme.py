"""Docs are executable: the README's quick-start commands run as written, and CI runs the
README's test command."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _block_after(heading: str) -> list:
    section = README.split(heading, 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.realmodel
def test_quick_start_commands_run(tmp_path):
    commands = [c for c in _block_after("## Quick start") if c.startswith("python -m onnxslim_kit")]
    assert len(commands) == 2
    for command in commands:
        argv = [sys.executable] + shlex.split(command)[1:]
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and (tmp_path / "ppocr_cls_v2.slim.onnx").exists()
    assert report["passes"][0]["verification"]["status"] == "ok"
    assert report["after"]["ops"].get("BatchNormalization", 0) == 0


def test_ci_runs_the_readme_test_command():
    command = _block_after("## Tests")[0]
    assert command in (ROOT / ".ci" / "run").read_text()
