"""The pass infrastructure: frozen options and their parse hooks (run before any pass), the
registry (duplicates refused, plugins named when broken), a pass's failures named, the global
exclusion, per-output tolerances, and logging through ``logging.getLogger("onnxslim_kit")``."""

import logging
import types

import numpy as np
import onnx_graphsurgeon as gs
import pytest
from conftest import parse

import onnxslim_kit
from onnxslim_kit import registry
from onnxslim_kit.api import Option, Pass, PassResult, Selector, register_pass
from onnxslim_kit.errors import EXIT_INTERNAL, PassError, UserError

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[2,4] x) => (float[2,4] y, float[2,4] z) <float[4] b = {1.0, 2.0, 3.0, 4.0}> {
  a = Add (x, b)
  y = Relu (a)
  z = Neg (a)
}
"""

RAN = []


def _target(text):
    kind, sep, value = text.partition(":")
    if kind != "cos" or not sep:
        raise UserError(f"expected cos:VALUE, got {text!r}")
    number = float(value)
    if not 0 < number <= 1:
        raise UserError(f"cos:{value} is out of (0, 1]")
    return ("cos", number)


@register_pass
class _Record(Pass):
    """Records that it ran, with what it was given; changes nothing."""

    name = "test_infra_record"
    options = {"target": Option(str, "cos:0.5", "a fidelity target", parse=_target),
               "where": Option(str, "", "a selector", parse=Selector.parse_option)}
    renamed = {"block_ops": "where=op:TYPE"}

    def run(self, model, ctx):
        RAN.append((self.name, dict(ctx.options), ctx.exclude, ctx.seed))
        return PassResult()


@register_pass
class _Shift(Pass):
    """Adds ``delta`` to the bias, claiming to be lossless (a known absolute error on y and z)."""

    name = "test_infra_shift"
    options = {"delta": Option(float, 1e-3, "added to the bias")}

    def run(self, model, ctx):
        result = PassResult()
        for tensor in model.graph.tensors().values():
            if isinstance(tensor, gs.Constant):
                tensor.values = np.asarray(tensor.values) + np.float32(ctx.options["delta"])
                result.rewrite("shifted")
        return result


@register_pass
class _Raise(Pass):
    name = "test_infra_raise"
    options = {"kind": Option(str, "value", "what to raise", choices=("value", "user", "result"))}

    def run(self, model, ctx):
        kind = ctx.options["kind"]
        if kind == "user":
            raise UserError("a clear user error")
        if kind == "result":
            return {"modified": True}
        raise ValueError("boom")


@pytest.fixture(autouse=True)
def _clear_ran():
    RAN.clear()


# --- options ----------------------------------------------------------------------------

def test_options_are_frozen_per_class_and_not_shared():
    assert isinstance(_Record.options, types.MappingProxyType)
    with pytest.raises(TypeError):
        _Record.options["new"] = Option(int, 0, "")
    assert "target" not in Pass.options and "delta" not in _Record.options
    assert isinstance(_Record.renamed, types.MappingProxyType)


def test_a_pass_without_run_cannot_be_made():
    class _NoRun(Pass):
        name = "test_infra_norun"

    with pytest.raises(TypeError, match="abstract"):
        _NoRun()


def test_the_parse_hook_runs_on_the_text_and_on_the_default():
    onnxslim_kit.optimize(parse(MODEL), "test_infra_record(target=cos:0.9,where=op:Add;re:^n)")
    (_, options, _, _), = RAN
    assert options["target"] == ("cos", 0.9)
    assert isinstance(options["where"], Selector) and str(options["where"]) == "op:Add;re:^n"
    RAN.clear()
    onnxslim_kit.optimize(parse(MODEL), "test_infra_record")
    assert RAN[0][1]["target"] == ("cos", 0.5) and RAN[0][1]["where"] == Selector.EMPTY


def test_a_bad_option_of_a_later_pass_fails_before_any_pass_runs():
    with pytest.raises(UserError, match=r"^test_infra_record\(target=\.\.\.\): cos:2 is out of") as info:
        onnxslim_kit.optimize(parse(MODEL), "test_infra_record,test_infra_record(target=cos:2)")
    assert RAN == [] and "\n" not in str(info.value)


def test_a_renamed_option_says_what_to_write_instead():
    with pytest.raises(UserError, match="has no option 'block_ops'; its options: target, where; "
                                        "renamed: use where=op:TYPE"):
        onnxslim_kit.optimize(parse(MODEL), "test_infra_record(block_ops=Conv)")


def test_option_values_from_python_bypass_the_text_conversion():
    onnxslim_kit.optimize(parse(MODEL), [("test_infra_record", {"target": ("cos", 0.7)})])
    assert RAN[0][1]["target"] == ("cos", 0.7)


# --- registry ---------------------------------------------------------------------------

def test_a_second_pass_with_a_taken_name_is_refused():
    class Fake(Pass):
        name = "fuse"

        def run(self, model, ctx):
            return PassResult()

    registry.available_passes()
    with pytest.raises(UserError, match="pass name 'fuse' is already taken by onnxslim_kit.passes.fuse"):
        register_pass(Fake)
    assert registry.available_passes()["fuse"] is not Fake


def test_registering_the_same_class_again_is_harmless():
    assert register_pass(_Record) is _Record
    assert registry.available_passes()["test_infra_record"] is _Record


def test_builtins_are_found_by_scanning_the_passes_package():
    modules = registry.builtin_modules()
    assert {"fuse", "prune", "int8", "dynamic", "int4", "svd", "cluster", "fp16", "compact"} <= set(modules)
    assert not [m for m in modules if m.startswith("_")]
    assert set(modules) <= set(registry.available_passes())


class _EntryPoint:
    def __init__(self, name, value, loader):
        self.name, self.value, self._loader = name, value, loader

    def load(self):
        return self._loader()


def _with_plugins(monkeypatch, *eps):
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: list(eps) if group else [])
    registry.clear_cache()


def _broken():
    raise ImportError("No module named 'acme_extra'")


class _Duplicate(Pass):
    name = "fuse"

    def run(self, model, ctx):
        return PassResult()


class _PluginPass(Pass):
    name = "test_infra_plugin"

    def run(self, model, ctx):
        return PassResult()


@pytest.mark.parametrize("loader, match", [
    (_broken, r"plugin 'acme' \(acme.passes:Acme\) .* failed to load: ImportError: No module named 'acme_extra'"),
    (lambda: 42, r"plugin 'acme' .* is 42, not a subclass of onnxslim_kit.api.Pass"),
    (lambda: _Duplicate, r"plugin 'acme' .*: pass name 'fuse' is already taken"),
])
def test_a_broken_plugin_is_named_in_one_line(monkeypatch, loader, match):
    _with_plugins(monkeypatch, _EntryPoint("acme", "acme.passes:Acme", loader))
    try:
        with pytest.raises(UserError, match=match) as info:
            registry.available_passes()
        assert "\n" not in str(info.value)
    finally:
        monkeypatch.undo()
        registry.clear_cache()


def test_a_plugin_is_registered_after_the_builtins(monkeypatch):
    _with_plugins(monkeypatch, _EntryPoint("mine", "mine:P", lambda: _PluginPass))
    try:
        found = registry.available_passes()
        assert found["test_infra_plugin"] is _PluginPass and "fuse" in found
    finally:
        monkeypatch.undo()
        registry.clear_cache()


# --- a pass's failures ------------------------------------------------------------------

def test_an_exception_in_a_pass_names_it_and_the_passes_before():
    with pytest.raises(PassError, match=r"^internal error in pass 'test_infra_raise' "
                                        r"\(after test_infra_record, fuse\): ValueError: boom$") as info:
        onnxslim_kit.optimize(parse(MODEL), "test_infra_record,fuse,test_infra_raise")
    assert isinstance(info.value.__cause__, ValueError) and info.value.exit_code == EXIT_INTERNAL


def test_a_result_that_is_not_a_pass_result_is_an_internal_error_of_that_pass():
    with pytest.raises(PassError, match="in pass 'test_infra_raise': run.. returned dict, not a PassResult"):
        onnxslim_kit.optimize(parse(MODEL), "test_infra_raise(kind=result)")


def test_user_errors_of_a_pass_pass_through_unchanged():
    with pytest.raises(UserError, match="^a clear user error$"):
        onnxslim_kit.optimize(parse(MODEL), "test_infra_raise(kind=user)")


# --- global exclusion -------------------------------------------------------------------

def test_exclude_reaches_the_passes_as_one_selector():
    proto = parse(MODEL)
    proto.graph.node[2].name = "neg_node"
    onnxslim_kit.optimize(proto, "test_infra_record", exclude=["op:Relu", "neg_node; op:Relu"], seed=5)
    (_, _, exclude, seed), = RAN
    assert isinstance(exclude, Selector) and str(exclude) == "op:Relu;neg_node" and seed == 5


def test_no_exclude_is_the_empty_selector():
    onnxslim_kit.optimize(parse(MODEL), "test_infra_record")
    assert RAN[0][2] == Selector.EMPTY and not RAN[0][2]


def test_an_exclude_matching_nothing_fails_before_any_pass_runs():
    with pytest.raises(UserError, match=r"^--exclude: 'op:Reluu' matches no node; closest op types: Relu"):
        onnxslim_kit.optimize(parse(MODEL), "test_infra_record", exclude="op:Reluu")
    assert RAN == []


def test_the_report_records_the_exclusion():
    _, report = onnxslim_kit.optimize(parse(MODEL), "fuse", exclude="op:Neg")
    assert report.to_dict()["exclude"] == "op:Neg"


# --- per-output tolerances --------------------------------------------------------------

def _statuses(report):
    return [(p.rolled_back, p.verification["status"]) for p in report.passes]


def test_an_output_given_an_atol_is_judged_by_its_absolute_error():
    # |x + b| ≈ 3: a shift of 1e-3 is ≈ 3e-4 relative (beyond rtol 1e-4), 1e-3 absolute
    model = parse(MODEL)
    _, report = onnxslim_kit.optimize(model, "test_infra_shift")
    assert _statuses(report) == [(True, "failed")]
    _, report = onnxslim_kit.optimize(model, "test_infra_shift", atol={"y": 2e-3})
    assert _statuses(report) == [(True, "failed")]  # z still judged by rtol
    _, report = onnxslim_kit.optimize(model, "test_infra_shift", atol={"y": 2e-3, "z": 2e-3})
    assert _statuses(report) == [(False, "ok")]
    assert report.to_dict()["atol"] == {"y": 2e-3, "z": 2e-3}
    _, report = onnxslim_kit.optimize(model, "test_infra_shift", atol={"y": 5e-4, "z": 2e-3})
    assert _statuses(report) == [(True, "failed")]


def test_an_atol_for_an_output_the_model_lacks_is_a_user_error():
    with pytest.raises(UserError, match="--atol: the model has no output 'w'; its outputs: y, z"):
        onnxslim_kit.optimize(parse(MODEL), "fuse", atol={"w": 1e-3})


# --- logging ----------------------------------------------------------------------------

def test_progress_lines_go_to_the_package_logger(caplog):
    with caplog.at_level(logging.INFO, logger="onnxslim_kit"):
        onnxslim_kit.optimize(parse(MODEL), "test_infra_shift")
    messages = [r.getMessage() for r in caplog.records if r.name == "onnxslim_kit"]
    assert "test_infra_shift: running" in messages
    assert any(m.startswith("test_infra_shift: verifying against") for m in messages)


def test_the_library_installs_no_handler():
    onnxslim_kit.optimize(parse(MODEL), "fuse")
    assert logging.getLogger("onnxslim_kit").handlers == []


def test_a_log_callable_replaces_the_logger(caplog):
    lines = []
    with caplog.at_level(logging.INFO, logger="onnxslim_kit"):
        onnxslim_kit.optimize(parse(MODEL), "test_infra_shift", log=lines.append)
    assert "test_infra_shift: running" in lines
    assert not [r for r in caplog.records if r.getMessage() == "test_infra_shift: running"]


def test_an_unbalanced_bracket_in_an_option_value_does_not_swallow_the_next_option():
    from onnxslim_kit.pipeline import parse_pass_list

    (spec,) = parse_pass_list("int8(include=re:[ab,speed_check=false)")
    assert spec.options == {"include": "re:[ab", "speed_check": "false"}
