"""Adding a pass is one folder under passes/ and nothing else (docs/adding-a-pass.md): a pass
package written into a temporary folder, made part of ``onnxslim_kit.passes`` by extending the
package's ``__path__``, is found by the registry, listed by ``--list-passes`` and runs through
``optimize`` and the command line — no other file touched."""

import sys
import textwrap

import onnx
import pytest
from conftest import parse

import onnxslim_kit
import onnxslim_kit.passes
from onnxslim_kit import registry
from onnxslim_kit.cli import main

NAME = "test_drop_identity"

PASS_SOURCE = '''
"""Drop Identity nodes (lossless): every reader of an Identity's output reads its input.

Applies when (1) the node is an ONNX ``Identity`` and (2) its output is not a graph output.
"""

from onnxslim_kit.api import Option, Pass, PassResult, register_pass


@register_pass
class DropIdentity(Pass):
    name = "test_drop_identity"
    summary = "drop Identity nodes"
    lossless = True
    options = {"keep_outputs": Option(bool, True, "keep an Identity that writes a graph output")}

    def run(self, model, ctx):
        result = PassResult()
        graph = model.graph
        outputs = set(id(t) for t in graph.outputs)
        for node in [n for n in graph.nodes if n.op == "Identity"]:
            source, target = node.inputs[0], node.outputs[0]
            if id(target) in outputs:
                result.skip("writes a graph output")
                continue
            for reader in list(target.outputs):
                for index, tensor in enumerate(reader.inputs):
                    if tensor is target:
                        reader.inputs[index] = source
            node.outputs.clear()
            result.rewrite("identity dropped")
        return result
'''

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1,4] x) => (float[1,4] y, float[1,4] z) <float[4] b = {1.0, 2.0, 3.0, 4.0}> {
  i = Identity (x)
  y = Add (i, b)
  z = Identity (y)
}
"""


@pytest.fixture
def new_pass(tmp_path):
    folder = tmp_path / "more_passes"
    (folder / NAME).mkdir(parents=True)
    (folder / NAME / "__init__.py").write_text(textwrap.dedent(PASS_SOURCE))
    onnxslim_kit.passes.__path__.append(str(folder))
    registry.clear_cache()
    try:
        yield NAME
    finally:
        onnxslim_kit.passes.__path__.remove(str(folder))
        sys.modules.pop(f"onnxslim_kit.passes.{NAME}", None)
        registry._REGISTRY.pop(NAME, None)
        registry.clear_cache()


def test_a_new_pass_folder_is_found_listed_and_run(new_pass, tmp_path, capsys):
    assert new_pass in registry.builtin_modules()
    assert main(["--list-passes"]) == 0
    listing = capsys.readouterr().out
    assert f"{new_pass}  (lossless)  drop Identity nodes" in listing
    assert "    keep_outputs=True  keep an Identity that writes a graph output" in listing

    proto, report = onnxslim_kit.optimize(parse(MODEL), new_pass)
    assert [n.op_type for n in proto.graph.node] == ["Add", "Identity"]
    (entry,) = report.passes
    assert entry.rewrites == {"identity dropped": 1} and entry.skipped == {"writes a graph output": 1}
    assert entry.verification["status"] == "ok"

    path = tmp_path / "m.onnx"
    onnx.save(parse(MODEL), path)
    assert main([str(path), "--passes", f"fuse,{new_pass}", "-o", str(tmp_path / "o.onnx"), "-q"]) == 0


def test_the_pass_is_gone_with_its_folder():
    assert NAME not in registry.available_passes()
