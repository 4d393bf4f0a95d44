"""Built-in passes, one module each; the module name is the pass name and CLI word.

Registration is explicit: :func:`onnxslim_kit.pipeline.available_passes` imports the
modules listed here (each decorates its class with ``@register_pass``). Modules whose name
starts with ``_`` are shared helpers, not passes. Third-party passes register through the
``onnxslim_kit.passes`` entry-point group instead.
"""

BUILTIN_PASSES = [
    "cluster",
    "svd",
    "fuse",
    "prune",
    "int8",
    "dynamic",
    "fp16",
    "int4",
    "compact",
]
