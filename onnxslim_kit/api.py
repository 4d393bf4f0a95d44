"""The pass-author surface: everything a pass (built-in or plugin) imports from the core.

::

    from onnxslim_kit.api import Option, Pass, PassContext, PassResult, register_pass

Pass machinery (:mod:`.pass_base`, :mod:`.registry`): ``Pass``, ``Option``, ``PassResult``,
``PassContext``, ``register_pass``, ``available_passes``. The model (:mod:`.model`):
``Model``, ``model_size_bytes``, ``proto_graphs``. Errors (:mod:`.errors`): ``UserError``
(a bad option or input: one line, exit 2). Selection (:mod:`.selection`): ``Selector``,
``exclusions`` (a pass's ``exclude=`` and the global ``--exclude``: node id → skip reason).
Data and measurement: ``CalibrationFeed``, ``iter_activations``, ``compare``, ``merge``,
``cosine``, ``make_session``, ``run``. Fidelity (:mod:`.fidelity`): ``Target``, ``Fidelity``,
``pass_fidelity`` (``ctx.fidelity`` or one built for a pass run on its own), ``check_target``
(the parse hook of a pass's ``target=`` option). See ``docs/adding-a-pass.md``.
"""

from __future__ import annotations

from .activations import iter_activations
from .calibration import CalibrationFeed
from .errors import UserError
from .fidelity import Fidelity, Target, check_target, pass_fidelity
from .metrics import compare, cosine, merge
from .model import Model, model_size_bytes, proto_graphs
from .pass_base import Option, Pass, PassContext, PassResult
from .registry import available_passes, register_pass
from .runtime import make_session, run
from .selection import Selector, exclusions

__all__ = [
    "CalibrationFeed", "Fidelity", "Model", "Option", "Pass", "PassContext", "PassResult", "Selector", "Target",
    "UserError", "available_passes", "check_target", "compare", "cosine", "exclusions", "iter_activations", "make_session", "merge", "model_size_bytes",
    "pass_fidelity", "proto_graphs", "register_pass", "run",
]
