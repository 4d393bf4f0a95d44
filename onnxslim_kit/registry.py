"""The pass registry: which pass a name means.

* :func:`register_pass` (a class decorator) files a :class:`.pass_base.Pass` subclass under its
  ``name``. A name already taken by another class is refused with a clear error: a plugin
  named ``fuse`` must not silently replace the built-in one. Registering the same class again
  (or the same module re-imported) is harmless.
* :func:`available_passes` finds the built-in passes **once** (cached): every module or
  package of :mod:`onnxslim_kit.passes` whose name does not start with ``_`` is imported
  (``pkgutil.iter_modules`` over the package's ``__path__``), and its ``@register_pass``
  does the rest — adding a pass is adding one folder, nothing else. Then the plugins of the
  entry-point group ``onnxslim_kit.passes`` (a plugin that fails to load, or that is not a
  pass, is a one-line error naming it).
* :func:`clear_cache` forgets the discovery (tests that add a pass folder at run time).
"""

from __future__ import annotations

import importlib
import pkgutil

from .errors import UserError
from .pass_base import Pass

ENTRY_POINT_GROUP = "onnxslim_kit.passes"

_REGISTRY: dict = {}
_discovered = False


def _same_class(a: type, b: type) -> bool:
    """The same class, or the same class of a re-imported module."""
    return a is b or (a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__)


def _describe(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_pass(cls):
    """Class decorator: make a pass available under ``cls.name``."""
    if not isinstance(cls, type) or not issubclass(cls, Pass):
        raise UserError(f"register_pass: {cls!r} is not a subclass of onnxslim_kit.api.Pass")
    if not cls.name:
        raise UserError(f"register_pass: {_describe(cls)} has no name")
    existing = _REGISTRY.get(cls.name)
    if existing is not None and not _same_class(existing, cls):
        raise UserError(
            f"pass name {cls.name!r} is already taken by {_describe(existing)}; "
            f"{_describe(cls)} cannot replace it (choose another name)"
        )
    _REGISTRY[cls.name] = cls
    return cls


def builtin_modules() -> list:
    """The names of the built-in pass modules (``onnxslim_kit.passes.<name>``), sorted."""
    passes = importlib.import_module("onnxslim_kit.passes")
    names = {info.name for info in pkgutil.iter_modules(passes.__path__) if not info.name.startswith("_")}
    return sorted(names)


def _load_plugins() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        where = f"plugin {ep.name!r} ({ep.value}) of the entry-point group {ENTRY_POINT_GROUP!r}"
        try:
            loaded = ep.load()
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a broken plugin is named, not a traceback
            raise UserError(f"{where} failed to load: {type(exc).__name__}: {exc}") from None
        if not isinstance(loaded, type) or not issubclass(loaded, Pass):
            raise UserError(f"{where} is {loaded!r}, not a subclass of onnxslim_kit.api.Pass")
        try:
            register_pass(loaded)
        except UserError as exc:
            raise UserError(f"{where}: {exc}") from None


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    for module in builtin_modules():
        importlib.import_module(f"onnxslim_kit.passes.{module}")
    _load_plugins()
    _discovered = True


def available_passes() -> dict:
    """All passes, by name: the built-in ones and those of the entry-point group."""
    _discover()
    return dict(sorted(_REGISTRY.items()))


def clear_cache() -> None:
    """Discover the passes again on the next :func:`available_passes` (registered ones stay)."""
    global _discovered
    _discovered = False
