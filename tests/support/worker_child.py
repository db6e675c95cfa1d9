"""The worker's child for the tests and the autoscaling simulation: a shell command, or a script under torchrun.

A worker started with :func:`worker_env` in its environment builds its child with :func:`build` (the worker's
one injection point, ``RAGPOOL_WORKER_CHILD_BUILDER``: training/scheduler/worker/child.py) instead of
``child.run_command``; a worker in the test's own process takes :func:`builder`'s directly
(``WorkerConfig(child_builder=...)``). :func:`build` reads its own variables, set by :func:`worker_env`:

- :data:`COMMAND_ENV`: a JSON list of strings, the whole argv in place of torchrun (any executor);
  ``{config}``, ``{run_id}``, ``{attempt}``, ``{node_index}`` are substituted.
- :data:`ENTRYPOINT_ENV`: a script path torchrun runs (``SCRIPT --config <run.yaml>``) instead of
  ``-m training.pipeline``, with the run's own torchrun settings (processes, rendezvous); a ray run is unchanged.

With neither set it is ``child.run_command``. The child's environment is always ``child.run_env``'s.
Importable from the repository root, which ``contract.paths.child_env`` puts on every worker's ``PYTHONPATH``.
Nothing here is read by production code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from contract.env import CHILD_BUILDER_ENV
from contract.ports import RDZV_PORT
from training.scheduler.spec import RunSpec
from training.scheduler.worker.child import ChildBuilder, run_command, run_env, torchrun_command

#: The whole argv of the child, a JSON list of strings (placeholders substituted, see the module docstring).
COMMAND_ENV = "RAGPOOL_WORKER_TEST_COMMAND"
#: A script torchrun runs instead of ``-m training.pipeline``.
ENTRYPOINT_ENV = "RAGPOOL_WORKER_TEST_ENTRYPOINT"
#: :func:`build`, as ``RAGPOOL_WORKER_CHILD_BUILDER`` names it.
BUILDER = f"{__name__}:build"


def worker_env(command: list[str] | None = None, entrypoint: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The variables that make a worker run ``command`` (the whole argv) or ``entrypoint`` (under torchrun)."""
    env = {CHILD_BUILDER_ENV: BUILDER}
    if command is not None:
        env[COMMAND_ENV] = json.dumps(command)
    if entrypoint is not None:
        env[ENTRYPOINT_ENV] = str(entrypoint)
    return env


def command_from_env(environ: Mapping[str, str] | None = None) -> list[str] | None:
    """:data:`COMMAND_ENV` parsed (None when unset); ValueError (the worker exits BAD_INPUT) unless a list of strings."""
    raw = (os.environ if environ is None else environ).get(COMMAND_ENV)
    if not raw:
        return None
    value = json.loads(raw)
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ValueError(f"{COMMAND_ENV} must be a JSON list of strings")
    return value


def builder(command: list[str] | None = None, entrypoint: str | os.PathLike[str] | None = None) -> ChildBuilder:
    """A ``ChildBuilder`` that runs ``command`` (the whole argv, placeholders substituted), else ``entrypoint``
    under the run's torchrun (a ray run: unchanged), else is ``child.run_command``; the environment is always
    ``child.run_env``'s. For a worker in this process (``WorkerConfig(child_builder=...)``)."""
    def build_child(spec: RunSpec, config: Path, attempt: int, *, shared_root: str, node_index: int = 0,
                    rdzv_host: str = "127.0.0.1", rdzv_port: int = RDZV_PORT) -> tuple[list[str], dict[str, str]]:
        if command:
            subst = {"{config}": str(config), "{run_id}": spec.run_id, "{attempt}": str(attempt),
                     "{node_index}": str(node_index)}
            argv = []
            for part in command:
                for token, value in subst.items():
                    part = part.replace(token, value)
                argv.append(part)
            return argv, run_env(spec, config, attempt, shared_root=shared_root, node_index=node_index)
        if entrypoint and spec.executor != "ray":
            argv = torchrun_command(spec, [str(entrypoint), "--config", str(config)], attempt, node_index=node_index,
                                    rdzv_host=rdzv_host, rdzv_port=rdzv_port)
            return argv, run_env(spec, config, attempt, shared_root=shared_root, node_index=node_index)
        return run_command(spec, config, attempt, shared_root=shared_root, node_index=node_index,
                           rdzv_host=rdzv_host, rdzv_port=rdzv_port)

    return build_child


def build(spec: RunSpec, config: Path, attempt: int, *, shared_root: str, node_index: int = 0,
          rdzv_host: str = "127.0.0.1", rdzv_port: int = RDZV_PORT) -> tuple[list[str], dict[str, str]]:
    """The ``ChildBuilder`` :func:`worker_env` names: :func:`builder` of :data:`COMMAND_ENV` and
    :data:`ENTRYPOINT_ENV`, read from this process's environment."""
    child = builder(command_from_env(), os.environ.get(ENTRYPOINT_ENV) or None)
    return child(spec, config, attempt, shared_root=shared_root, node_index=node_index, rdzv_host=rdzv_host,
                 rdzv_port=rdzv_port)
