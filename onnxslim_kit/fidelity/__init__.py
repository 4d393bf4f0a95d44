"""One fidelity contract for every lossy pass: a target, the output views it is judged on,
and the held-out samples that judge it.

- :mod:`.target`: ``cos:V`` / ``top1:V`` / ``rel:V`` / ``none``, the budget and its share per pass;
- :mod:`.views`: the views found from the graph (branches of a concatenated head, decisions of
  Softmax/Sigmoid heads, integer outputs exactly);
- :mod:`.judge`: a candidate's outputs scored per view, the verdict and its binding view;
- :mod:`.context`: ``ctx.fidelity`` (what a pass holds) and the deterministic held-out split.
"""

from .context import FeedPart, Fidelity, pass_fidelity, split_feed
from .judge import Verdict, ViewScore, judge
from .target import DEFAULT, SYNTAX, Target, check_target, share
from .views import SCORE_THRESHOLD, View, Views, find_views

__all__ = [
    "DEFAULT", "FeedPart", "Fidelity", "SCORE_THRESHOLD", "SYNTAX", "Target", "Verdict", "View", "ViewScore",
    "Views", "check_target", "find_views", "judge", "pass_fidelity", "share", "split_feed",
]
