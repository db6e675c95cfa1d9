"""Process exit codes of the training entrypoints: the one place they are defined.

The Kubernetes Job's ``podFailurePolicy`` and the queue worker key on these numbers.
"""

#: Stage finished (or was already complete).
OK = 0
#: Training failed for a reason a retry will not fix (bug, divergence, missing model).
FAILED = 1
#: Bad input: invalid run config, bad data record, escaping path.
BAD_INPUT = 2
#: Preempted (SIGTERM / spot notice): a checkpoint was written at the last step
#: boundary; rerunning the same command resumes from it. 75 = EX_TEMPFAIL (sysexits.h).
RETRIABLE = 75
