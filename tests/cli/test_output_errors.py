"""An output that cannot be written (issue 15, item 10): one line naming the path the user gave
and what is wrong with it (a parent that is a file, a folder that is not writable, an output
that is a folder), exit 2, nothing written, the input untouched — never the temp file's name."""

import os
import tempfile

import pytest

from onnxslim_kit.cli import main
from onnxslim_kit.errors import UserError
from onnxslim_kit.model import load_proto, save_proto


def files_in(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(args, tmp_path, capsys) -> str:
    before = files_in(tmp_path)
    code = main([str(a) for a in args] + ["-q"])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("[onnxslim_kit]")]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in err, err
    assert ".slim-" not in lines[0]
    assert files_in(tmp_path) == before  # nothing written, the input byte-identical
    assert not list(tmp_path.rglob(".slim-*"))
    return lines[0]


@pytest.mark.parametrize("below", ["out.onnx", "sub/out.onnx"])
def test_output_below_a_regular_file(model_path, tmp_path, capsys, below):
    (tmp_path / "afile").write_text("not a folder")
    out = tmp_path / "afile" / below
    line = _refused([model_path, "-o", out], tmp_path, capsys)
    assert f"cannot write {out}:" in line and f"{tmp_path / 'afile'} is not a folder" in line
    assert "File exists" not in line


def test_output_is_a_folder(model_path, tmp_path, capsys):
    (tmp_path / "d").mkdir()
    line = _refused([model_path, "-o", tmp_path / "d"], tmp_path, capsys)
    assert f"cannot write {tmp_path / 'd'}: it is a folder" in line


def test_report_below_a_regular_file_writes_no_model(model_path, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    report = tmp_path / "afile" / "r.json"
    line = _refused([model_path, "-o", tmp_path / "o.onnx", "--report", report], tmp_path, capsys)
    assert f"cannot write {report}:" in line and "is not a folder" in line


def _unwritable_folder():
    """A folder this process cannot create files in (root ignores permissions: /proc is used)."""
    for folder in ("/proc", "/sys"):
        if os.path.isdir(folder):
            try:
                os.rmdir(tempfile.mkdtemp(dir=folder))
            except OSError:
                return folder
    return None


@pytest.mark.skipif(_unwritable_folder() is None, reason="no folder this process cannot write to")
def test_unwritable_folder_names_the_output(model_path, tmp_path, capsys):
    out = os.path.join(_unwritable_folder(), "out.onnx")
    line = _refused([model_path, "-o", out], tmp_path, capsys)
    assert f"cannot write {out}: the folder {os.path.dirname(out)} is not writable" in line


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores folder permissions")
def test_read_only_folder_names_the_output(model_path, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        line = _refused([model_path, "-o", ro / "sub" / "o.onnx"], tmp_path, capsys)
        assert f"cannot write {ro / 'sub' / 'o.onnx'}: the folder {ro} is not writable" in line
    finally:
        ro.chmod(0o700)


def test_save_proto_names_the_path(model_path, tmp_path):
    proto = load_proto(model_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match=r"afile/out.onnx: .*afile is not a folder"):
        save_proto(proto, tmp_path / "afile" / "out.onnx")
    folder = _unwritable_folder()
    if folder is not None:
        with pytest.raises(UserError, match=f"cannot write {folder}/m.onnx: the folder {folder} is not writable"):
            save_proto(proto, os.path.join(folder, "m.onnx"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "m.onnx"]
