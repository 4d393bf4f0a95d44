"""The command line as a set of subcommands (optimize, the default; bench; fetch), --version,
the new options (--exclude, --atol), one-line errors of a failing pass, and the log lines."""

import logging
import subprocess
import sys

import onnx
import pytest
from conftest import IDENTITY_ADD, parse

from onnxslim_kit.api import Pass, PassResult, register_pass
from onnxslim_kit.cli import main
from onnxslim_kit.recipe import tool_versions

@register_pass
class _Boom(Pass):
    name = "test_cli_boom"

    def run(self, model, ctx):
        raise ZeroDivisionError("division by zero")


def test_version_names_the_libraries(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    v = tool_versions()
    assert capsys.readouterr().out.strip() == (
        f"onnxslim_kit {v['onnxslim_kit']} (onnx {v['onnx']}, onnxruntime {v['onnxruntime']}, "
        f"onnx-graphsurgeon {v['onnx_graphsurgeon']}, numpy {v['numpy']})")


def test_help_lists_the_subcommands():
    proc = subprocess.run([sys.executable, "-m", "onnxslim_kit", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    for command in ("optimize", "bench", "fetch"):
        assert f"\n  {command} " in proc.stdout
    assert "--exclude SEL" in proc.stdout and "--atol OUT:TOL" in proc.stdout and "--recipe JSON" in proc.stdout


@pytest.mark.parametrize("prefix", [[], ["optimize"]])
def test_optimize_is_the_default_subcommand(model_path, tmp_path, prefix):
    out = tmp_path / "o.onnx"
    assert main([*prefix, str(model_path), "--passes", "fuse", "-o", str(out), "-q"]) == 0
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Add"]


def test_the_console_script_points_at_the_cli_main():
    from importlib.metadata import entry_points

    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "onnxslim-kit"]
    assert script.value == "onnxslim_kit.cli:main" and script.load() is main


def test_a_failing_pass_is_one_line_exit_1_and_debug_shows_the_traceback(model_path, tmp_path, capsys):
    argv = [str(model_path), "--passes", "fuse,test_cli_boom", "-o", str(tmp_path / "o.onnx"), "-q"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("internal error in pass 'test_cli_boom' (after fuse): ZeroDivisionError: division by zero "
                   "(rerun with --debug for the traceback)")
    assert not (tmp_path / "o.onnx").exists()
    assert main(argv + ["--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and 'raise ZeroDivisionError("division by zero")' in err


def test_exclude_matching_nothing_exits_2_with_the_closest_names(model_path, tmp_path, capsys):
    model = parse(IDENTITY_ADD)
    model.graph.node[1].name = "add_bias"
    onnx.save(model, model_path)
    argv = [str(model_path), "--passes", "fuse", "-o", str(tmp_path / "o.onnx"), "-q"]
    assert main(argv + ["--exclude", "add_bia"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --exclude: 'add_bia' matches no node; closest: add_bias"
    assert main(argv + ["--exclude", "add_bias", "--exclude", "op:Identity", "--report", str(tmp_path / "r.json")]) == 0
    assert '"exclude": "add_bias;op:Identity"' in (tmp_path / "r.json").read_text()


@pytest.mark.parametrize("value", ["y", "y:", ":1e-3", "y:abc", "y:-1"])
def test_a_bad_atol_is_one_line_exit_2(model_path, tmp_path, capsys, value):
    assert main([str(model_path), "--atol", value, "-o", str(tmp_path / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --atol {value!r}: expected OUTPUT:TOLERANCE with a tolerance >= 0, e.g. logits:1e-3"


def test_atol_names_an_output(model_path, tmp_path, capsys):
    assert main([str(model_path), "--atol", "logits:1e-3", "-o", str(tmp_path / "o.onnx")]) == 2
    assert "the model has no output 'logits'; its outputs: y" in capsys.readouterr().err


def test_log_lines_on_stderr_and_none_under_quiet(model_path, tmp_path, capsys):
    assert main([str(model_path), "--passes", "fuse", "-o", str(tmp_path / "o.onnx")]) == 0
    err = capsys.readouterr().err
    assert "[onnxslim_kit] fuse: running" in err
    assert main([str(model_path), "--passes", "fuse", "-o", str(tmp_path / "o.onnx"), "-q"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""
    assert logging.getLogger("onnxslim_kit").handlers == []  # the CLI's handler is gone after the command
