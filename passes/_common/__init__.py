"""Helpers shared by several passes: graph matching and rewriting (:mod:`.graph`), per-layer
activation statistics of Conv / Gemm / MatMul layers (:mod:`.layer_stats`, used by prune's
re-fit, svd and cluster), and the BLAS thread cap (:mod:`.blas`). Never imports a pass."""
