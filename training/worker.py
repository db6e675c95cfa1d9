"""The worker Job's command: claim runs from the Redis queue and run them.

    python -m training.worker [--idle-exit-seconds 300] [--lease-seconds 60] [--metrics-port 9300]

Same as ``ragpool worker``. Queue metrics and ``/ready`` are served on ``--metrics-port`` (9300 in
the worker Jobs: ``QUEUE_METRICS_PORT`` in contract/ports.py, the one home of ragpool's ports; the
ranks' training metrics are on ``RANK_METRICS_PORT`` + local rank, 9400 up). The run loop lives in
:mod:`training.scheduler.worker`, the child it starts in :mod:`training.scheduler.worker.child`, what it
records when the child ends in :mod:`training.scheduler.worker.outcome`; this module stays torch-free
(training runs in torchrun child processes).
"""

from __future__ import annotations

from training.scheduler.worker.loop import main

if __name__ == "__main__":
    raise SystemExit(main())
