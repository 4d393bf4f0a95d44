"""The one selector (onnxslim_kit.selection): syntax, each term kind, must_match, union, positions."""

from __future__ import annotations

import onnx_graphsurgeon as gs
import pytest

from onnxslim_kit.errors import UserError
from onnxslim_kit.selection import GLOBAL_REASON, OWN_REASON, Selector, Term, exclusions
from conftest import parse

TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[1, 4] x) => (float[1, 4] y) {
    a = Relu(x)
    b = Sigmoid(a)
    c = Relu(b)
    d = Tanh(c)
    y = Relu(d)
}
"""


@pytest.fixture
def proto():
    model = parse(TEXT)  # node names set here (the text format leaves them empty)
    for node, name in zip(model.graph.node, ["conv_1", "conv_2", "head/mm", "head/out", "tail"]):
        node.name = name
    return model


@pytest.fixture(params=["proto", "gs"])
def graph(request, proto):
    return proto.graph if request.param == "proto" else gs.import_onnx(proto)


# --- parsing --------------------------------------------------------------------------------

def test_empty_selector():
    assert Selector.parse("") == Selector.EMPTY
    assert Selector.parse(" ; ;") == Selector.EMPTY
    assert Selector.parse(None) is Selector.EMPTY
    assert not Selector.EMPTY
    assert bool(Selector.parse("op:Relu"))
    assert str(Selector.EMPTY) == ""


def test_parse_each_kind_and_canonical_text():
    sel = Selector.parse(" conv_1 ; re:^head/ ;name:out$; op:Relu; first:Relu:2; last:*:1; all ")
    assert sel.terms == (
        Term("name", "conv_1"), Term("re", "^head/"), Term("re", "out$"), Term("op", "Relu"),
        Term("first", "Relu", 2), Term("last", "*", 1), Term("all"),
    )
    assert str(sel) == "conv_1;re:^head/;re:out$;op:Relu;first:Relu:2;last:*:1;all"
    assert Selector.parse(str(sel)) == sel  # the canonical text reads back the same


def test_duplicate_terms_dropped():
    assert Selector.parse("op:Relu;op:Relu;name:x;re:x").terms == (Term("op", "Relu"), Term("re", "x"))


@pytest.mark.parametrize("text, needle", [
    ("op:", "cannot read 'op:'"),
    ("first:Conv", "cannot read 'first:Conv'"),
    ("last:Conv:x", "cannot read 'last:Conv:x'"),
    ("first:Conv:-1", "cannot read"),
    ("bogus:thing", "cannot read 'bogus:thing'"),
    ("re:(", "bad regular expression '('"),
    ("name:[a", "bad regular expression '[a'"),
])
def test_parse_errors_name_where(text, needle):
    with pytest.raises(UserError) as info:
        Selector.parse(text, where="int8(exclude=...)")
    message = str(info.value)
    assert message.startswith("int8(exclude=...): ")
    assert needle in message
    assert "\n" not in message


def test_coerce():
    sel = Selector.parse("op:Relu")
    assert Selector.coerce(sel) is sel
    assert Selector.coerce("op:Relu") == sel
    assert Selector.coerce(None) == Selector.EMPTY
    assert Selector.coerce(["op:Relu", "conv_1"]) == Selector.parse("op:Relu;conv_1")
    with pytest.raises(UserError, match="where: expected a selector text, got int"):
        Selector.coerce(3, "where")


def test_parse_option_one_argument_form():
    assert Selector.parse_option("op:Conv") == Selector.parse("op:Conv")


# --- selecting ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("conv_2", {"conv_2"}),
    ("re:^head/", {"head/mm", "head/out"}),
    ("name:conv", {"conv_1", "conv_2"}),
    ("op:Relu", {"conv_1", "head/mm", "tail"}),
    ("first:Relu:2", {"conv_1", "head/mm"}),
    ("last:Relu:1", {"tail"}),
    ("last:Relu:2", {"head/mm", "tail"}),
    ("first:Relu:10", {"conv_1", "head/mm", "tail"}),
    ("first:Relu:0", set()),
    ("first:*:2", {"conv_1", "conv_2"}),
    ("last:*:1", {"tail"}),
    ("all", {"conv_1", "conv_2", "head/mm", "head/out", "tail"}),
    ("op:Tanh; conv_1; last:Relu:1", {"head/out", "conv_1", "tail"}),
    ("", set()),
])
def test_select_each_kind(graph, text, expected):
    assert Selector.parse(text).select(graph) == expected


def test_op_type_is_exact(graph):
    with pytest.raises(UserError):
        Selector.parse("op:relu").select(graph)
    assert Selector.parse("op:relu").select(graph, must_match=False) == set()


def test_select_on_model_proto(proto):
    assert Selector.parse("op:Sigmoid").select(proto) == {"conv_2"}


def test_must_match_names_closest_nodes(graph):
    with pytest.raises(UserError) as info:
        Selector.parse("op:Relu;conv_12").select(graph, where="int8(exclude=...)")
    message = str(info.value)
    assert message.startswith("int8(exclude=...): 'conv_12' matches no node; closest: ")
    closest = message.split("closest: ")[1].split(", ")
    assert closest[:2] == ["conv_1", "conv_2"] or set(closest[:2]) == {"conv_1", "conv_2"}


def test_must_match_regex_and_op_types(graph):
    with pytest.raises(UserError, match=r"'re:\^haed/' matches no node; closest: head/"):
        Selector.parse("re:^haed/").select(graph)
    with pytest.raises(UserError, match="'op:Sigmod' matches no node; closest op types: Sigmoid"):
        Selector.parse("op:Sigmod").select(graph)
    with pytest.raises(UserError, match="'last:Tanhh:1' matches no node; closest op types: Tanh"):
        Selector.parse("last:Tanhh:1").select(graph)
    with pytest.raises(UserError, match="'first:Conv:0' matches no node"):
        Selector.parse("first:Conv:0").select(graph)  # no Conv at all: an error even for N = 0


def test_must_match_false_ignores_missing_terms(graph):
    sel = Selector.parse("gone_node; re:^nothing; op:Conv; conv_1")
    assert sel.select(graph, must_match=False) == {"conv_1"}


def test_among_restricts_candidates_and_positions(proto):
    graph = gs.import_onnx(proto)
    relus = [n for n in graph.nodes if n.op == "Relu"]
    among = relus[1:]  # head/mm, tail
    assert Selector.parse("first:Relu:1").select(graph, among=among) == {"head/mm"}
    assert Selector.parse("all").select(graph, among=among) == {"head/mm", "tail"}
    # a node of the graph that is not a candidate matches nothing, but is no error
    assert Selector.parse("conv_2").select(graph, among=among) == set()
    assert Selector.parse("op:Sigmoid").select(graph, among=among) == set()
    with pytest.raises(UserError, match="'conv_9' matches no node"):
        Selector.parse("conv_9").select(graph, among=among)


def test_union_and_or(graph):
    a, b = Selector.parse("op:Tanh;conv_1"), Selector.parse("conv_1;last:Relu:1")
    u = Selector.union(a, b)
    assert u == a | b
    assert str(u) == "op:Tanh;conv_1;last:Relu:1"
    assert u.select(graph) == a.select(graph) | b.select(graph)
    assert Selector.union() == Selector.EMPTY
    assert (Selector.EMPTY | a) == a == (a | Selector.EMPTY)
    assert Selector.union("op:Tanh", b) == Selector.parse("op:Tanh;conv_1;last:Relu:1")


def test_matches(graph):
    names = Selector.parse("re:^head").select(graph)
    nodes = graph.nodes if hasattr(graph, "nodes") else graph.node
    assert [Selector.matches(n, names) for n in nodes] == [False, False, True, True, False]


def test_selectors_are_hashable_values():
    assert {Selector.parse("op:A;b"), Selector.parse("op:A; b")} == {Selector.parse("op:A;b")}


def test_nodes_keeps_graph_order_and_unnamed_nodes():
    graph = gs.import_onnx(parse(TEXT))  # the text format leaves node names empty
    picked = Selector.parse("last:Relu:1; op:Sigmoid; first:Relu:1").nodes(graph)
    assert [n.op for n in picked] == ["Relu", "Sigmoid", "Relu"]
    assert picked == [graph.nodes[0], graph.nodes[1], graph.nodes[4]]
    assert Selector.EMPTY.nodes(graph) == []


BODY = """
<ir_version: 8, opset_import: ["" : 17]>
g (bool c, float[2] x) => (float[2] y) {
    t = Relu(x)
    y = If (c) <
        then_branch = then_g () => (float[2] a) { a = Sigmoid(t) },
        else_branch = else_g () => (float[2] b) { b = Relu(t) }
    >
}
"""


def test_nodes_in_every_graph_first_last_in_main_only():
    model = parse(BODY)
    graph = gs.import_onnx(model)
    graph.nodes[0].name, graph.nodes[1].name = "relu_main", "if"
    then_g, else_g = graph.nodes[1].attrs["then_branch"], graph.nodes[1].attrs["else_branch"]
    then_g.nodes[0].name, else_g.nodes[0].name = "body_sigmoid", "body_relu"
    graphs = [graph, then_g, else_g]

    def names(text, **kw):
        return [n.name for n in Selector.parse(text).nodes_in(graphs, **kw)]

    assert names("op:Relu") == ["relu_main", "body_relu"]
    assert names("re:^body_") == ["body_sigmoid", "body_relu"]
    assert names("body_sigmoid") == ["body_sigmoid"]
    assert names("last:Relu:1") == ["relu_main"]  # positions: the main graph's
    assert names("all") == ["relu_main", "if", "body_sigmoid", "body_relu"]
    with pytest.raises(UserError, match="dynamic\\(exclude=...\\): 'body_relux' matches no node; closest: body_relu"):
        Selector.parse("body_relux").nodes_in(graphs, where="dynamic(exclude=...)")
    with pytest.raises(UserError, match="'last:Sigmoid:1' matches no node"):
        names("last:Sigmoid:1")  # a body's Sigmoid does not count for a position
    assert names("nothing; op:Sigmoid", must_match=False) == ["body_sigmoid"]


def test_exclusions_reasons_precedence_and_unnamed_nodes():
    graph = gs.import_onnx(parse(TEXT))  # unnamed nodes: selected by id, not renamed
    out = exclusions(graph, "op:Sigmoid; last:Relu:1", Selector.parse("first:Relu:1; op:Sigmoid"), "p(exclude=...)")
    nodes = graph.nodes
    assert out == {id(nodes[0]): GLOBAL_REASON, id(nodes[1]): GLOBAL_REASON, id(nodes[4]): OWN_REASON}
    assert all(not n.name for n in nodes)
    swapped = exclusions(graph, "op:Sigmoid", "op:Sigmoid", "p(exclude=...)", ("own", "glob"), own_wins=True)
    assert swapped == {id(nodes[1]): "own"}
    assert exclusions(graph, "", None, "p(exclude=...)") == {}
    assert exclusions(graph, None, "missing; op:Tanh", "p(exclude=...)") == {id(nodes[3]): GLOBAL_REASON}
    with pytest.raises(UserError, match="p\\(exclude=...\\): 'op:Relux' matches no node; closest op types: Relu"):
        exclusions(graph, "op:Relux", None, "p(exclude=...)")


def test_exclusions_in_every_graph():
    graph = gs.import_onnx(parse(BODY))
    body = graph.nodes[1].attrs["else_branch"]
    out = exclusions([graph, graph.nodes[1].attrs["then_branch"], body], "op:Relu", "all", "p(exclude=...)",
                     ("own", "glob"), own_wins=True)
    assert out == {id(graph.nodes[0]): "own", id(graph.nodes[1]): "glob", id(body.nodes[0]): "own",
                   id(graph.nodes[1].attrs["then_branch"].nodes[0]): "glob"}
