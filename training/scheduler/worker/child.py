"""The child process that runs a run's stages: its command line and environment, the one builder.

The queue worker (training/scheduler/worker/), the local demo (training/demo/direct.py), the
benchmarks (bench/train_throughput.py, bench/ray_overhead.py) and the tests' stage runner
(tests/support/training.py) all start torchrun through :func:`torchrun_argv`; the worker's ray
runs are followed through :func:`ray_job_argv`. A torchrun child of one pod::

    python -m torch.distributed.run --nnodes 1 --nproc-per-node G --max-restarts 0 --standalone \\
        -m training.pipeline --config <shared>/runs/<run_id>/run.yaml

and of a multi-node run (pod ``i`` of ``N``; index 0 hosts the c10d store)::

    python -m torch.distributed.run --nnodes N --nproc-per-node G --max-restarts 0 --rdzv-backend c10d \\
        --rdzv-endpoint <host>:<port> --rdzv-id <run>-a<attempt> --rdzv-conf is_host=<i == 0> \\
        -m training.pipeline --config ...

and of an elastic run (``nodes: {min, max}``; every pod the same command, the rendezvous on the queue's Redis,
training/elastic/)::

    python -m training.elastic.launch --nnodes MIN:MAX --nproc-per-node G --max-restarts K \
        --rdzv-id <run>-a<attempt> -m training.pipeline --config ...

A ray run's child (the stages run on the namespace's Ray cluster; the worker only follows the Ray job)::

    python -m training.ray.job --config <shared>/runs/<run_id>/run.yaml

The worker builds its child with the :class:`ChildBuilder` that ``RAGPOOL_WORKER_CHILD_BUILDER``
names (``module:function``, :func:`builder_from_env`), default :func:`run_command`: the one injection point
of the worker, through which the tests and the autoscaling simulation run a shell command or a script of
their own (tests/support/worker_child.py). Jobs leave it unset.

Torch-free (``detect_nproc`` imports torch only when the spec leaves the process count open).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from contract.defaults import ELASTIC_MAX_RESTARTS
from contract.env import ATTEMPT_ENV, CHILD_BUILDER_ENV, NODE_INDEX_ENV, RUN_CONFIG_ENV, RUN_ID_ENV
from contract.paths import SHARED_ROOT_ENV, child_env, run_dir
from contract.ports import RDZV_PORT
from training.scheduler.spec import RunSpec

RUN_CONFIG_NAME = "run.yaml"
"""The run config the worker writes under ``runs/<run_id>/`` for every rank to load."""


def torchrun_argv(entry: list[str], *, nproc: int, nnodes: int = 1, rdzv_endpoint: str | None = None,
                  rdzv_id: str | None = None, is_host: bool = True) -> list[str]:
    """``python -m torch.distributed.run`` running ``entry`` (``["-m", module, ...]`` or a script and
    its arguments) in ``nproc`` processes on this node: ``--standalone`` on one node, else a c10d
    rendezvous at ``rdzv_endpoint`` (``host:port``) named ``rdzv_id``, hosted by the pod with
    ``is_host`` (index 0: saying so beats torch's hostname guess, which cannot match a
    headless-Service name against the pod's own hostname). No restarts: the worker retries runs."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
           "--nproc-per-node", str(nproc), "--max-restarts", "0"]
    if nnodes == 1:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint or not rdzv_id:
            raise ValueError(f"a torchrun of {nnodes} nodes needs rdzv_endpoint and rdzv_id")
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id,
                "--rdzv-conf", f"is_host={'true' if is_host else 'false'}"]
    return cmd + list(entry)


def elastic_argv(entry: list[str], *, nproc: int, min_nodes: int, max_nodes: int, rdzv_id: str,
                 max_restarts: int = ELASTIC_MAX_RESTARTS) -> list[str]:
    """``python -m training.elastic.launch`` running ``entry`` on ``min_nodes`` to ``max_nodes`` nodes: the
    rendezvous ``rdzv_id`` on the queue's Redis, ``max_restarts`` lost nodes before the attempt fails."""
    return [sys.executable, "-m", "training.elastic.launch", "--nnodes", f"{min_nodes}:{max_nodes}",
            "--nproc-per-node", str(nproc), "--max-restarts", str(max_restarts), "--rdzv-id", rdzv_id, *entry]


def stage_entry(module: str, config: str | os.PathLike[str], *args: str) -> list[str]:
    """``-m training.<module> --config CONFIG [args]``: a stage command (or ``pipeline``) as torchrun's entry."""
    return ["-m", f"training.{module}", "--config", str(config), *args]


def ray_job_argv(config: str | os.PathLike[str]) -> list[str]:
    """``python -m training.ray.job --config CONFIG``: a ray run's child (submits and follows its Ray job)."""
    return [sys.executable, "-m", "training.ray.job", "--config", str(config)]


def detect_nproc(spec: RunSpec) -> int:
    """Processes per node: the spec's ``gpus_per_node``, else CUDA devices, else 1 (CPU)."""
    if spec.gpus_per_node:
        return spec.gpus_per_node
    try:
        import torch
    except ImportError:
        return 1
    return torch.cuda.device_count() or 1


def write_run_config(spec: RunSpec, shared_root: str) -> Path:
    """Write ``<shared>/runs/<run_id>/run.yaml`` atomically and return its path: the training config
    of ``spec`` (``RunSpec.to_training_config``), which the worker validated when it parsed the
    claimed spec with the same ``shared_root``; every rank loads it, nothing checks it again."""
    import yaml

    directory = run_dir(shared_root, spec.run_id)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RUN_CONFIG_NAME
    tmp = directory / f".{RUN_CONFIG_NAME}.{os.getpid()}.tmp"
    tmp.write_text(yaml.safe_dump(spec.to_training_config(shared_root), sort_keys=False))
    os.replace(tmp, path)
    return path


class ChildBuilder(Protocol):
    """How the worker turns one attempt of a claimed run into its child: ``(argv, env)`` of the process it
    starts on pod ``node_index`` (:func:`run_command` in production; see :func:`builder_from_env`)."""

    def __call__(self, spec: RunSpec, config: Path, attempt: int, *, shared_root: str, node_index: int = 0,
                 rdzv_host: str = "127.0.0.1", rdzv_port: int = RDZV_PORT) -> tuple[list[str], dict[str, str]]: ...


def run_env(spec: RunSpec, config: Path, attempt: int, *, shared_root: str, node_index: int = 0) -> dict[str, str]:
    """The child's environment: this process's plus ``RAGPOOL_RUN_ID``, ``RAGPOOL_RUN_CONFIG``,
    ``RAGPOOL_ATTEMPT``, ``RAGPOOL_SHARED_ROOT``, ``RAGPOOL_NODE_INDEX`` (and the package on
    ``PYTHONPATH``: the child imports the same training package as the worker)."""
    return child_env(**{RUN_ID_ENV: spec.run_id, RUN_CONFIG_ENV: str(config), ATTEMPT_ENV: str(attempt),
                        SHARED_ROOT_ENV: shared_root, NODE_INDEX_ENV: str(node_index)})


def torchrun_command(spec: RunSpec, entry: list[str], attempt: int, *, node_index: int = 0,
                     rdzv_host: str = "127.0.0.1", rdzv_port: int = RDZV_PORT) -> list[str]:
    """torchrun of ``entry`` for one attempt of ``spec`` on pod ``node_index``: ``--standalone`` on one node,
    else the run's c10d rendezvous on the index-0 pod (``<run_id>-a<attempt>``)."""
    if spec.nodes == 1:
        return torchrun_argv(entry, nproc=detect_nproc(spec))
    if spec.min_nodes is not None:
        return elastic_argv(entry, nproc=detect_nproc(spec), min_nodes=spec.min_nodes, max_nodes=spec.nodes,
                            rdzv_id=f"{spec.run_id}-a{attempt}")
    return torchrun_argv(entry, nproc=detect_nproc(spec), nnodes=spec.nodes,
                         rdzv_endpoint=f"{rdzv_host}:{rdzv_port}", rdzv_id=f"{spec.run_id}-a{attempt}",
                         is_host=node_index == 0)


def run_command(spec: RunSpec, config: Path, attempt: int, *, shared_root: str, node_index: int = 0,
                rdzv_host: str = "127.0.0.1", rdzv_port: int = RDZV_PORT) -> tuple[list[str], dict[str, str]]:
    """The production :class:`ChildBuilder`: the child of one attempt of ``spec`` on pod ``node_index``,
    torchrun of ``training.pipeline`` (a ray run: ``training.ray.job``) with :func:`run_env`."""
    env = run_env(spec, config, attempt, shared_root=shared_root, node_index=node_index)
    if spec.executor == "ray":
        # The stages run on the namespace's Ray cluster; this pod only follows the Ray job
        # (heartbeats, cancel and lease loss work as for torchrun: SIGTERM stops the job).
        return ray_job_argv(config), env
    return torchrun_command(spec, stage_entry("pipeline", config), attempt, node_index=node_index,
                            rdzv_host=rdzv_host, rdzv_port=rdzv_port), env


_BUILDER_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def builder_from_env(environ: Mapping[str, str] | None = None) -> ChildBuilder:
    """The :class:`ChildBuilder` that ``RAGPOOL_WORKER_CHILD_BUILDER`` names (``module:function``, the module
    importable from the worker's ``PYTHONPATH``); unset or empty: :func:`run_command`. ValueError (the
    worker exits BAD_INPUT) for a value that is not ``module:function`` or names nothing callable."""
    value = (os.environ if environ is None else environ).get(CHILD_BUILDER_ENV) or ""
    if not value:
        return run_command
    fix = "set it to module:function (e.g. tests.support.worker_child:build) or unset it for the production builder"
    if not _BUILDER_PATH.fullmatch(value):
        raise ValueError(f"{CHILD_BUILDER_ENV}={value!r} is not module:function; {fix}")
    module_name, _, name = value.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # not found, or failed on import: either way no builder
        raise ValueError(f"{CHILD_BUILDER_ENV}={value!r}: cannot import {module_name} ({exc}); {fix}") from exc
    builder = getattr(module, name, None)
    if not callable(builder):
        raise ValueError(f"{CHILD_BUILDER_ENV}={value!r}: {module_name} has no function {name}; {fix}")
    return builder
