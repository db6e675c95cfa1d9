"""The worker Job's command: claim runs from the Redis queue and run them.

    python -m training.worker [--idle-exit-seconds 300] [--lease-seconds 60] [--metrics-port 9300]

Same as ``ragpool worker``. The run loop lives in :mod:`training.scheduler.supervisor`;
this module stays torch-free (training runs in torchrun child processes).
"""

from __future__ import annotations

from training.scheduler.supervisor import main

if __name__ == "__main__":
    raise SystemExit(main())
