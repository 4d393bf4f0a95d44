"""The BLAS/LAPACK thread pool, capped around heavy numpy/scipy work.

Measured on the shared 2-core machine under load: the SVD of a 1536×384 matrix took 0.3–5.9 s
with OpenBLAS's 2 threads and 0.08 s with one (MiniLM ``svd``: 108 factorisations were 130 s
of a 242 s pass). Uses threadpoolctl (a dependency); without it BLAS keeps its own setting.
"""

from __future__ import annotations

import contextlib


def blas_threads(n: int):
    """Context capping the BLAS thread pool at ``n`` threads (0: unchanged)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # e.g. an environment installed without the dependencies
        return contextlib.nullcontext()
    return threadpool_limits(n) if n > 0 else contextlib.nullcontext()
