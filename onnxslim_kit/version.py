"""The package version (one place; ``onnxslim_kit.__version__`` and ``--version`` read it)."""

__version__ = "0.1.0"
