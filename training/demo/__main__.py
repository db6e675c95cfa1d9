"""``python -m training.demo``: the pipeline demo without the queue (see :mod:`training.demo.direct`)."""

from training.demo.direct import main

raise SystemExit(main())
