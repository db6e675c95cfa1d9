"""Entry point the Pulumi CLI runs for ``pulumi preview --policy-pack policy``.

The CLI executes this file by path (``python -m pulumi.policy <engine> policy``), with the
pack directory rather than the repository root on ``sys.path``; the repository root is added
so the checks import as the ``policy`` package, the same module the offline evaluator and
the tests use. Constructing ``PolicyPack`` starts the analyzer's gRPC server and blocks.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policy.pack import serve  # noqa: E402

serve()
