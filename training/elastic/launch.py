"""torchrun for an elastic run: the rendezvous on the queue's Redis, a node range, a restart budget.

    python -m training.elastic.launch --nnodes MIN:MAX --nproc-per-node G --max-restarts K \\
        --rdzv-id <run_id>-a<attempt> -m training.pipeline --config <shared>/runs/<run_id>/run.yaml

Every pod of the run starts the same command (no pod is special: none hosts the rendezvous). The queue's
Redis comes from the environment (``REDIS_URL``, as for the worker). This registers the ``ragpool-redis``
rendezvous handler (:mod:`training.elastic.rendezvous`) with torch, adds ``--rdzv-backend ragpool-redis`` when
the command has no ``--rdzv-backend``, tells the ranks the node range (``RAGPOOL_ELASTIC_NODES``: the training
loop keeps the global batch at every size) and turns torch's shared agent TCPStore off
(``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: torch 2.13 keeps a node's first bootstrap address for every later
round unless that node becomes rank 0, so the loss of the first round's rank-0 pod would strand the others),
shortens the agents' exit barrier (:data:`EXIT_BARRIER_S`), then runs ``torch.distributed.run``'s own ``main``.
``--max-restarts`` is the budget of lost nodes (torch spends
one per failed worker group; a node that joins restarts the group without spending one).
"""

from __future__ import annotations

import os
import sys

from contract.env import ELASTIC_NODES_ENV
from contract.exit_codes import BAD_INPUT
from contract.names import ELASTIC_RDZV_BACKEND

EXIT_BARRIER_S = 30
"""How long an agent whose ranks have finished waits for the other agents' (torch's exit barrier, 300 s in torch
2.13's ``LocalElasticAgent``). The barrier keeps torch's own agent store alive until every agent is done; an elastic
run's store is the queue's Redis (:mod:`training.elastic.rendezvous`), which no agent hosts, so here it only bounds
the wait for an agent that died after its ranks finished: the others then end 30 s later, not 5 minutes (a GPU pod
held for nothing, and the run's ack with it)."""

_NO_SHARED_STORE = ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
"""torch 2.13 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py ``next_rendezvous``: the opt-out of the
TCPStore hosted by the first round's rank-0 agent (torch's variable, not ragpool's)."""


def elastic_argv(argv: list[str]) -> list[str]:
    """``argv`` with ``--rdzv-backend ragpool-redis --rdzv-endpoint redis`` in front unless it names a backend
    (torch's parser wants an endpoint; this backend reads the queue's from the environment)."""
    if any(a == "--rdzv-backend" or a.startswith(("--rdzv-backend=", "--rdzv_backend")) for a in argv):
        return list(argv)
    return ["--rdzv-backend", ELASTIC_RDZV_BACKEND, "--rdzv-endpoint", "redis", *argv]


def short_exit_barrier() -> type:
    """torchrun's agent with :data:`EXIT_BARRIER_S` as its exit barrier. ``torch.distributed.run`` has no flag for
    it: its ``launch_agent`` (torch/distributed/launcher/api.py) builds the module's ``LocalElasticAgent`` without
    the argument, so this replaces that name with a subclass that passes it (the class it returns)."""
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.launcher import api

    class ShortExitBarrierAgent(LocalElasticAgent):
        def __init__(self, *args, **kwargs) -> None:
            kwargs.setdefault("exit_barrier_timeout", EXIT_BARRIER_S)
            super().__init__(*args, **kwargs)

    api.LocalElasticAgent = ShortExitBarrierAgent
    return ShortExitBarrierAgent


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import run as torchrun

    from training.elastic.rendezvous import register

    argv = elastic_argv(list(sys.argv[1:] if argv is None else argv))
    args = torchrun.get_args_parser().parse_args(argv)
    if args.rdzv_backend != ELASTIC_RDZV_BACKEND:
        print(f"training.elastic.launch: --rdzv-backend={args.rdzv_backend!r}: an elastic run's rendezvous is "
              f"{ELASTIC_RDZV_BACKEND!r} (leave the flag out)", file=sys.stderr)
        return BAD_INPUT
    try:
        lo, hi = torchrun.parse_min_max_nnodes(args.nnodes)
    except (ValueError, RuntimeError) as err:
        print(f"training.elastic.launch: --nnodes={args.nnodes!r}: {err}; give MIN:MAX", file=sys.stderr)
        return BAD_INPUT
    if not 1 <= lo <= hi:
        print(f"training.elastic.launch: --nnodes={args.nnodes!r}: needs 1 <= MIN <= MAX", file=sys.stderr)
        return BAD_INPUT
    os.environ[ELASTIC_NODES_ENV] = f"{lo}:{hi}"
    os.environ[_NO_SHARED_STORE[0]] = _NO_SHARED_STORE[1]
    register()
    short_exit_barrier()
    torchrun.main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
