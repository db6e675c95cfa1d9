"""Queue worker: the command of a GPU worker Job pod.

    python -m training.worker [--idle-exit-seconds 300] [--lease-seconds 60] [--metrics-port 9300]

(9300: ``QUEUE_METRICS_PORT``, contract/ports.py, the one home of ragpool's ports; off unless
``--metrics-port`` or ``RAGPOOL_QUEUE_METRICS_PORT`` sets it.) This package is the worker: its
settings and flags (settings.py), the claim loop (loop.py), the gang of a multi-node run (gang.py) and
its Redis keys (group.py), the child's supervision, heartbeat and output (supervision.py), the retry
through a Redis outage (outage.py), the child it starts and its builder (child.py), what it records when
the child ends (outcome.py) and the pre-flight health gate (preflight.py).

For each task it claims it validates the stored spec once, against this worker's shared root and
environment, writes the run's training config to ``<shared>/runs/<run_id>/run.yaml`` (every rank
only loads it) and runs the stages with torchrun over the pod::

    python -m torch.distributed.run --nnodes 1 --nproc-per-node G --max-restarts 0 --standalone \\
        -m training.pipeline --config <shared>/runs/<run_id>/run.yaml

(``G`` = the spec's ``gpus_per_node``, else the pod's CUDA device count, 1 on CPU.)
While the run goes it heartbeats the lease from a thread; on success it acks, on failure
it records the error (retry with backoff, dead-letter after ``max_attempts``; exit code 2
= bad config fails fast). A pending ``ragpool cancel`` stops the run at the next heartbeat.

SIGTERM (spot notice, Kueue eviction, scale-down): stop claiming, forward SIGTERM to torchrun
(which forwards it to the ranks so they checkpoint and exit with the retriable code),
wait up to ``--stop-grace-seconds``, then release the lease as preempted: no attempt spent however
often it happens (``Release.PREEMPTED``), so another worker resumes from the checkpoint. torchrun itself exits 1 after a signal
whatever the ranks return, so any non-zero exit after *our* SIGTERM counts as
interrupted, not failed. A child that exits with the retriable code on its own is also
released. The worker exits 0 after ``--idle-exit-seconds`` with an empty queue (or
after ``--max-tasks``), and with the retriable code when SIGTERM interrupted a run.

Multi-node (an Indexed Job with ``completions = parallelism = N`` and a headless Service):
set ``RAGPOOL_NNODES=N``, ``RAGPOOL_WORKER_GROUP=<job name>`` and
``RAGPOOL_RDZV_HOST=<job>-0.<service>`` (the index-0 pod's DNS name); Kubernetes sets
``JOB_COMPLETION_INDEX``. Index 0 claims a run with ``nodes: N`` (optionally only
``RAGPOOL_RUN_ID``), publishes it under ``<ns>:group:<group>`` in Redis and owns the
lease; the other indices read that key and join with the same torchrun c10d rendezvous
(``--rdzv-endpoint <RAGPOOL_RDZV_HOST>:<RAGPOOL_RDZV_PORT> --rdzv-id <run>-a<attempt>
--rdzv-conf is_host=<index == 0>``).
Single-pod workers never claim multi-node runs.

Gang deadline: index 0 publishes the run as *gathering*; each other index joins
(``<ns>:group:<group>:joined``) and waits; only when all N-1 have joined does index 0 say *go*
and every pod start torchrun. If they have not all joined within ``--gang-deadline-seconds``
(env ``RAGPOOL_GANG_DEADLINE_SECONDS``, default 900: longer than a GPU node takes to come up)
index 0 marks the gang aborted, hands the run back WITHOUT spending an attempt, however often
it happens (``TaskQueue.release(kind=Release.GANG_TIMEOUT)``, counted in ``ragpool_gang_timeouts_total``
for an alert), and exits ``GANG_TIMEOUT`` (5); a follower that sees the abort, or no run within the
deadline before its first run (it waits the deadline whatever ``--idle-exit-seconds`` says: index 0's
node may come last), exits ``GANG_TIMEOUT`` too. The worker Job fails on that code (its
``podFailurePolicy``), which removes its other pods, Pending ones included. So a gang that cannot get N
nodes holds no GPU longer than the deadline, and the run waits in its lane for the next Job.

Readiness (Kubernetes): with a metrics port the worker also serves ``GET /ready``
(``exporter.READY_PATH``): 200 while it holds a claim (index 0 from its claim on; another
index once it has joined a gang) or when it has found its lanes empty and is exiting, 503
before (starting, health check, looking for a run) and between runs. A readiness probe on it
lets KEDA's ScaledJob ``pendingPodConditions: ["Ready"]`` count a started worker that has
not taken a run as pending, not as a Job that took one. Each worker also registers its lanes
and state (``TaskQueue.register_worker``; ``ragpool status`` reads them).

Environment: ``REDIS_URL``/``REDIS_PASSWORD``/``REDIS_PASSWORD_FILE`` (see
``training.scheduler.redis_conn``), ``RAGPOOL_SHARED_ROOT`` (default /mnt/shared),
``RAGPOOL_QUEUE_NAMESPACE`` (default ``ragpool``), ``RAGPOOL_WORKER_ID`` (default
``<hostname>-<pid>``), ``RAGPOOL_RUN_ID``, ``RAGPOOL_LANES`` (the lanes it claims, exactly:
lane names, comma-separated, see ``contract/lanes.py``; ``lanes.worker_env`` builds
it), else ``RAGPOOL_EXECUTORS`` (which runs it claims: ``torchrun``, the default, and/or
``ray``, from the unpinned lanes; a ray run is followed as a Ray job,
``python -m training.ray.job``, on the Ray cluster at ``RAY_ADDRESS``), ``RAGPOOL_PRIORITIES`` (the
priorities whose runs it claims, comma-separated, default every one: a per-priority ScaledJob's
worker claims only the priority its Job was admitted by Kueue for; ``lanes.worker_env`` sets it).

The child builder, the worker's one injection point (never set in a Job): the function that turns a
claimed run into the child's argv and environment (``child.ChildBuilder``) is the ``module:function``
that ``RAGPOOL_WORKER_CHILD_BUILDER`` names, default ``child.run_command`` (the torchrun above, or a
ray run's job); a value that is not ``module:function`` of an importable callable stops the worker at
start with exit 2 (BAD_INPUT). The tests and the autoscaling simulation name
``tests.support.worker_child:build``, which runs a shell command instead of torchrun or a script under
torchrun, from variables of its own (that module says which).
"""

import logging

log = logging.getLogger("ragpool.worker")
"""The worker's logger, every module of the package's."""
