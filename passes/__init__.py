"""Built-in passes, one module or package each; its name is the pass name and CLI word.

Discovery is by name, not by a list: :func:`onnxslim_kit.registry.available_passes` imports
every module and package here whose name does not start with ``_`` (each decorates its class
with ``@register_pass``), so adding a pass is adding one folder (see ``docs/adding-a-pass.md``).
Names starting with ``_`` are shared helpers (``_common``, ``_quant``), not passes.
Third-party passes register through the ``onnxslim_kit.passes`` entry-point group instead.
"""
