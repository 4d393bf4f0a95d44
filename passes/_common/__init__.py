"""Helpers shared by several passes: graph matching and rewriting (:mod:`.graph`), the result of
a match / check step and the state a pass run's rules share (:mod:`.match`: ``MatchResult``,
``SkipOnce``, ``RuleRun``), element types and shapes completed by shape inference in a side
table (:mod:`.shapes`), per-layer activation statistics of Conv / Gemm / MatMul layers
(:mod:`.layer_stats`, used by prune's re-fit, svd and cluster), and the BLAS thread cap
(:mod:`.blas`). Never imports a pass."""
