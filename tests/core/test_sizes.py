"""Small pieces: no module of ``onnxslim_kit/`` or ``passes/`` over 600 lines, no function
over cyclomatic complexity 25.

The complexity is McCabe's, counted as radon counts it: 1 for the function, +1 for each
``if``/``elif``, ``for``, ``while`` (and their ``else``), ``except``, conditional expression, comprehension loop and
its ``if`` clauses, ``assert``, ``match`` case, and each extra operand of ``and``/``or``.
Nested functions and classes are counted on their own; a lambda counts in the function around it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
MAX_COMPLEXITY = 25
SOURCES = sorted(p for folder in ("onnxslim_kit", "passes") for p in (ROOT / folder).rglob("*.py"))
BRANCHES = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.IfExp, ast.Assert)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # a lambda counts in its function


def complexity(function: ast.AST) -> int:
    """McCabe complexity of one function body, not descending into nested scopes."""
    count = 1
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, SCOPES):
            continue
        if isinstance(node, BRANCHES):
            count += 1 + bool(isinstance(node, (ast.For, ast.AsyncFor, ast.While)) and node.orelse)
        elif isinstance(node, ast.comprehension):
            count += 1 + len(node.ifs)
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.match_case):
            count += 1
        stack.extend(ast.iter_child_nodes(node))
    return count


def functions(tree: ast.AST):
    """(qualified name, node) of every function and method, nested ones included."""
    stack = [("", tree)]
    while stack:
        prefix, node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    yield name, child
                stack.append((name + ".", child))
            else:
                stack.append((prefix, child))


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long


def test_no_function_is_over_complexity_25():
    complex_ = {}
    for path in SOURCES:
        for name, node in functions(ast.parse(path.read_text())):
            if (value := complexity(node)) > MAX_COMPLEXITY:
                complex_[f"{path.relative_to(ROOT)}:{node.lineno} {name}"] = value
    assert not complex_, complex_


@pytest.mark.parametrize("source, expected", [
    ("def f(x):\n    return x\n", 1),
    ("def f(x):\n    if x and x > 1 or x < -1:\n        return 1\n    elif x:\n        return 2\n"
     "    return [y for y in x if y]\n", 1 + 1 + 2 + 1 + 2),
    ("def f(x):\n    try:\n        pass\n    except ValueError:\n        pass\n    except KeyError:\n"
     "        pass\n    def g():\n        if x:\n            pass\n    return 1 if x else 2\n", 1 + 2 + 1),
    ("def f(x):\n    while x:\n        for y in x:\n            assert y\n", 4),
])
def test_the_counter_counts_as_mccabe(source, expected):
    (_, node), = [item for item in functions(ast.parse(source)) if item[0] == "f"]
    assert complexity(node) == expected
