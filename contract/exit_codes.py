"""Process exit codes of ragpool's commands: the one place they are defined.

The stage commands, the worker and the ``ragpool`` run commands all return these; the
Kubernetes Job's ``podFailurePolicy`` and the queue worker key on them.
"""

#: Done (a stage finished or was already complete; a command did what was asked).
OK = 0
#: Training failed for a reason a retry will not fix (bug, divergence, missing model).
FAILED = 1
#: ``ragpool`` commands: refused (a run id reused with another spec, cancel of a finished
#: run, retry of a run not in the dead-letter list). Same number as FAILED.
REFUSED = 1
#: Bad input: invalid run config or spec, bad data record, escaping path, bad settings.
BAD_INPUT = 2
#: ``ragpool`` commands: unknown run id. ``python -m policy.offline``: the plan or config file
#: named on the command line does not exist.
NOT_FOUND = 3
#: ``ragpool`` commands: Redis unreachable or unusable right now (retry later).
#: ``python -m training.ray.job``: the Ray cluster unreachable, or refusing the token (the
#: message names its Secret); the worker hands the run back without spending an attempt.
UNAVAILABLE = 4
#: The worker of a multi-node run (a pod of an Indexed Job): its gang did not form within the gang deadline
#: (index 0 handed the run back unspent, or a follower saw no run or the gang aborted). The worker Job's
#: ``podFailurePolicy`` fails the whole Job on it, so no pod of it still Pending holds a slot KEDA counts.
GANG_TIMEOUT = 5
#: Worker pre-flight node health check failed (``python -m training.components.health``:
#: GPUs missing or not as requested, a wrong or slow matmul, a failed all-reduce). Nothing
#: was claimed, so no run attempt is spent; the worker Job's ``podFailurePolicy``
#: (infra/worker_jobs.py) fails the Job instead of retrying on the same node.
#: 69 = EX_UNAVAILABLE (sysexits.h).
HEALTH_CHECK_FAILED = 69
#: Preempted (SIGTERM / spot notice): a checkpoint was written at the last step
#: boundary; rerunning the same command resumes from it. 75 = EX_TEMPFAIL (sysexits.h).
RETRIABLE = 75
#: ``ragpool``: the reader of its output went away (``ragpool logs RUN | head``); it stopped quietly.
#: 141 = 128 + SIGPIPE, what a shell reports for a tool killed by a closed pipe.
BROKEN_PIPE = 141
