"""``fuse`` — lossless graph simplification, repeated until nothing changes.

Rewrites (each in its own module, each counted in the report under its label):

* :mod:`onnxslim_kit.passes.fuse.fold_bn` — BatchNormalization folded into a preceding Conv / ConvTranspose / Gemm /
  MatMul (also across a bias Add), or replaced by one Mul + Add when nothing precedes it;
  in float16 both it and the affine folds skip a fold whose rounding the lossless bound cannot
  absorb (:mod:`onnxslim_kit.passes.fuse.fp16_guard`);
* :mod:`onnxslim_kit.passes.fuse.fold_affine` — constant Mul / Add / Sub / Div folded into Conv and Gemm weights and
  bias; MatMul + Add → Gemm where valid;
* :mod:`onnxslim_kit.passes.fuse.affine_chain` — chains of constant Mul / Add (a BN made Mul + Add before a
  scale layer) as one Mul and one Add;
* :mod:`onnxslim_kit.passes.fuse.cleanup` — Identity, inference Dropout and no-op Reshape / Transpose / Cast / Pad /
  Slice / Expand / Squeeze / Flatten / neutral arithmetic removed; :mod:`onnxslim_kit.passes.fuse.merges` —
  inverse Squeeze/Unsqueeze pairs removed, Transpose∘Transpose, Reshape∘Reshape and Unsqueeze∘Unsqueeze merged
  (helpers of both in :mod:`onnxslim_kit.passes.fuse.rule_helpers`);
* :mod:`onnxslim_kit.passes.fuse.const_fold` — constant folding (size-capped), duplicate constants and common
  subexpressions merged;
* with ``activations`` (on by default), activations rewritten as the ops ONNX Runtime's CPU
  provider runs fastest: :mod:`onnxslim_kit.passes.fuse.prelu` — ``PRelu`` with a constant slope as ``LeakyRelu``,
  ``Mul`` + ``Max`` or ``Relu`` + ``Min``·``Mul`` + ``Add``, the same numbers (ORT's ``PRelu``
  kernel is 5–14× slower than those); :mod:`onnxslim_kit.passes.fuse.hardswish` — ``x·relu6(x + 3)/6`` chains as
  ``HardSwish`` (or ``x · HardSigmoid``), ``relu6(x + 3)/6`` as ``HardSigmoid``.

Order within a round: the constant-making rules of ``const_fold`` (folding, shapes), then the
layer folds, cleanups and activation rewrites, then duplicate-constant merging and CSE — so two
layers whose weights are equal by value only are still two tensors when a BN folds into each.
Every rule is applied to the main graph and to every If / Loop / Scan body. Dead code goes
with the pipeline's ``commit()``. The rewrite modules expose ``RULES``: a list of
``(label, function)`` where ``function(graph, run) -> int`` applies the rule once over
``graph`` and returns how many rewrites it made. ``run`` is one
:class:`~onnxslim_kit.passes._common.match.RuleRun` per pass run: the model, the result, the
inferred shapes and the skip set, so a reason for not applying is counted once per node
however many rounds the loop makes (match / check steps return a
:class:`~onnxslim_kit.passes._common.match.MatchResult`).
"""

from __future__ import annotations

from onnxslim_kit.api import Option, Pass, PassResult, register_pass

from onnxslim_kit.passes._common.match import RuleRun

from onnxslim_kit.passes.fuse import affine_chain as _affine_chain
from onnxslim_kit.passes.fuse import cleanup as _cleanup
from onnxslim_kit.passes.fuse import const_fold as _const_fold
from onnxslim_kit.passes.fuse import fold_affine as _fold_affine
from onnxslim_kit.passes.fuse import fold_bn as _fold_bn
from onnxslim_kit.passes.fuse import hardswish as _hardswish
from onnxslim_kit.passes.fuse import prelu as _prelu

MAX_ROUNDS = 20


@register_pass
class FusePass(Pass):
    name = "fuse"
    summary = "fold BN/affine ops into Conv/Gemm, MatMul+Add→Gemm, drop no-ops, fold constants, CSE"
    lossless = True
    options = {
        "fold_size_limit": Option(int, 1 << 24, "largest constant (bytes) constant folding may create"),
        "cse": Option(bool, True, "merge duplicate constants and common subexpressions"),
        "activations": Option(bool, True, "rewrite PRelu (constant slope) as LeakyRelu / Mul+Max / Relu+Min·Mul+Add "
                              "and x·relu6(x+3)/6 chains as HardSwish / HardSigmoid: ops ONNX Runtime runs faster"),
    }

    def run(self, model, ctx) -> PassResult:
        result = PassResult()
        run = RuleRun(model, result)
        rules = _fold_bn.RULES + _fold_affine.RULES + _cleanup.RULES + _affine_chain.RULES + (
            _prelu.RULES + _hardswish.RULES if ctx.options["activations"] else [])
        rules = (_const_fold.folding_rules(ctx.options["fold_size_limit"]) + rules
                 + _const_fold.merging_rules(ctx.options["cse"]))
        for _ in range(MAX_ROUNDS):
            changed = 0
            for graph in list(model.all_graphs()):
                for label, rule in rules:
                    count = rule(graph, run)
                    if count:
                        result.rewrite(label, count)
                        changed += count
                        graph.cleanup(remove_unused_graph_inputs=False)
            if not changed:
                break
        return result
