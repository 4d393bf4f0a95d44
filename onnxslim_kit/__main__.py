"""``python -m onnxslim_kit``: a Ctrl-C even while the command line is imported is one line, exit 130.

(A Ctrl-C before this file runs — the interpreter's own start-up: ``site``, ``.pth`` files —
is Python's: it prints its traceback. ``import onnxslim_kit`` is kept light to leave it small.)
"""

import sys

try:
    from .cli import main
except KeyboardInterrupt:
    print("interrupted; nothing written", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
