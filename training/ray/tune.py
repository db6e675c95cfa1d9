"""Ray Tune search over the retriever's hyper-parameters, with ASHA early stopping.

    python -m training.ray.tune --config RUN.yaml [--start] [--key=value ...]
    ragpool tune SPEC.yaml [--start] [--wait]       # with a context: queued through the run API
    ragpool tune --results RUN_ID [--json]

Through the run API (``ragpool login``), ``ragpool tune`` queues the spec (``executor: ray``) with
``ray.tune.search`` set (``only``, or ``then_run`` with ``--start``): the worker's Ray job runs this module on
the cluster (the worker's Ray job, training/ray/job.py, starts this module instead of the driver); ``--wait`` follows it and prints its table, as ``--results`` does later.

The space is the run config's ``ray.tune`` section: learning rate (log-uniform range),
temperature (uniform range), global batch size (choices); ``ray.tune.num_samples`` trials.
Each trial is a driver function that builds a Ray Train ``TorchTrainer`` (with
``TuneReportCallback``) training the retriever through the retriever stage's own task and the
shared training loop, in ``runs/<run_id>/tune/<trial>/retriever/`` with checkpoints like a normal
stage (a restarted worker group resumes from them). A step hook scores the model on the eval
split (recall@k and MRR) every ``max_steps / ray.tune.rungs`` steps and reports it; ASHA stops
the weaker trials at those milestones. Trials at once are what the retriever's pool can hold: from
the namespace's declaration (``RAGPOOL_RAY_POOLS`` with each pool's most nodes) when it has one, so
an idle cluster autoscaling from zero starts them together, else from the live nodes' GPUs (CPUs on a
CPU-only pool), unless ``ray.tune.max_concurrent`` says otherwise (:func:`concurrency`). A trial ASHA
stops has its worker group's placement group released by Ray Train's cleaner, which asks the
State API (the dashboard, ``ray[default]``; KubeRay heads run it): without it those resources leak.

Prints a table of the trials (parameters, recall@k, MRR, steps, state), writes it to
``runs/<run_id>/tune/trials.txt`` and ``trials.json``, and the run config with the best
parameters to ``runs/<run_id>/tune/best.yaml``; ``--start`` then runs the whole run with it
(:mod:`training.ray.driver`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from contract.mappings import deep_merge
from training.config.run import RunConfig, load_run_config, split_cli
from training.config.sections import ConfigError
from contract.exit_codes import BAD_INPUT, FAILED, OK

TUNE_DIR = "tune"
"""Under ``runs/<run_id>/``: the trials' stage directories, the table and the best config."""
PARAMS = ("lr", "temperature", "global_batch_size")
"""The parameters searched (``ray.tune.<param>``) and where each goes in the retriever section."""
_PARAM_KEYS = {"lr": ("optim", "lr"), "temperature": ("temperature",), "global_batch_size": ("global_batch_size",)}
TRIAL_DRIVER_CPUS = 0.01
"""CPUs of a trial's driver function: it only waits on its TorchTrainer (whose workers reserve their
own resources), but Tune refuses an empty resource request."""


def with_params(tree: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """The run config ``tree`` with the trial's parameters set in its retriever section."""
    out = tree
    for name, value in params.items():
        path = _PARAM_KEYS[name]
        nested: dict[str, Any] = {path[-1]: value}
        for key in reversed(path[:-1]):
            nested = {key: nested}
        out = deep_merge(out, {"retriever": nested})
    return out


def param_space(cfg: RunConfig) -> dict[str, Any]:
    from ray import tune

    t = cfg.ray.tune
    return {"lr": tune.loguniform(*t.lr), "temperature": tune.uniform(*t.temperature),
            "global_batch_size": tune.choice(list(t.global_batch_size))}


def check_space(cfg: RunConfig) -> None:
    """Every batch-size choice must split over the retriever's workers (else ConfigError naming the key)."""
    workers = cfg.ray.retriever.workers * cfg.retriever.grad_accum
    bad = [b for b in cfg.ray.tune.global_batch_size if b % workers]
    if bad:
        raise ConfigError(f"ray.tune.global_batch_size={list(cfg.ray.tune.global_batch_size)!r}: {bad} not a "
                          f"multiple of ray.retriever.workers*retriever.grad_accum={workers}", "ray.tune.global_batch_size")


def milestone_every(cfg: RunConfig) -> int:
    return max(1, cfg.retriever.max_steps // cfg.ray.tune.rungs)


# --------------------------------------------------------------------------- on the Ray Train workers


def candidates(corpus: Any, examples: list[Any], limit: int, seed: int) -> list[int]:
    """The corpus rows a milestone's score searches: every row when the corpus has at most ``limit``, else the
    examples' positives and a seeded sample of the other rows, ``limit`` in all (sorted)."""
    import random

    if corpus.rows <= limit:
        return list(range(corpus.rows))
    positives = {r for ex in examples for i in ex.positive_ids if (r := corpus.row_of(i)) is not None}
    rng, chosen = random.Random(seed), set(positives)
    while len(chosen) < max(limit, len(positives)):
        chosen.add(rng.randrange(corpus.rows))
    return sorted(chosen)


def score(cfg: RunConfig, env: Any, model: Any, tokenizer: Any, data: Any) -> dict[str, float]:
    """recall@k and MRR of ``model`` on the eval split (rank 0 computes; every rank gets the result), over
    :func:`candidates` of the corpus (``ray.tune.eval_passages``), read by row."""
    import torch

    from training.components import distributed as D
    from training.components.models import encode_texts
    from training.components.search import build_faiss, retrieval_metrics, search

    metrics = None
    if env.is_main:
        n = cfg.ray.tune.eval_questions
        examples = data.eval[:n] if n else data.eval
        ks = cfg.evaluate.recall_at
        rows = candidates(data.corpus, examples, cfg.ray.tune.eval_passages, cfg.seed)
        with torch.no_grad():
            p = encode_texts(model, tokenizer, data.corpus.texts(rows), cfg.retriever.max_length,
                             cfg.index.batch_size, env.device)
            q = encode_texts(model, tokenizer, [x.question for x in examples], cfg.retriever.max_length,
                             cfg.index.batch_size, env.device)
        index = build_faiss(p.numpy(), "flat", 1, 1, 1, 1)
        retrieved = search(index, q, [data.corpus.id_of(r) for r in rows], max(ks))
        metrics = retrieval_metrics(retrieved, [x.positive_ids for x in examples], ks)
    return D.broadcast_object(env, metrics)


def trial_worker(config: dict[str, Any]) -> None:
    """Ray Train worker of one trial: the retriever's task and the shared loop, reporting at milestones."""
    import ray.train

    from training import retriever
    from training.components import distributed as D
    from training.components import logs
    from training.components.run_data import load_run_data
    from training.components.loop import seed_everything, train
    from training.components.models import load_encoder

    cfg = load_run_config(config["cfg"])
    stage_dir = Path(config["stage_dir"])
    env = D.init_distributed(cfg.device)
    data = load_run_data(cfg, env)
    seed_everything(cfg.seed)
    model, tokenizer = load_encoder(cfg.retriever.model)
    every = milestone_every(cfg)
    last = cfg.retriever.max_steps

    def report(trainer: Any) -> None:
        if trainer.step % every == 0 or trainer.step == last:
            metrics = score(cfg, env, trainer.model, tokenizer, data)
            ray.train.report({**metrics, "step": trainer.step, "loss": trainer.losses[-1]})

    # Records carry the run id and rank; no run_dir: a trial never writes the run's own retriever log.
    with logs.scoped_context(cfg.run_id, env.rank):
        task = retriever.make_task(cfg, env, data.corpus, data.train, model, tokenizer)
        result = train(task, cfg, env, stage_dir, hooks=[report])
    if result.exit_code != OK:
        raise RuntimeError(f"trial training exited with {result.exit_code}")


def trial(config: dict[str, Any]) -> None:
    """One Tune trial (the trainable): a TorchTrainer for the trial's retriever, reporting to Tune."""
    from ray import tune
    from ray.train import FailureConfig
    from ray.train import RunConfig as TrainRunConfig
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from training.ray.placement import plan
    from training.ray.driver import _nodes, _worker_env

    params = {k: config[k] for k in PARAMS}
    cfg = load_run_config(with_params(config["tree"], params))
    trial_id = tune.get_context().get_trial_id()
    # A trial trains at a fixed size, the range's max (an elastic retriever's range is for the run's own stage).
    placement = plan("retriever", dataclasses.replace(cfg.ray.retriever, min_workers=0), _nodes())
    TorchTrainer(
        trial_worker,
        train_loop_config={"cfg": cfg.to_dict(), "stage_dir": str(cfg.run_dir() / TUNE_DIR / trial_id / "retriever")},
        scaling_config=ScalingConfig(**placement.scaling_kwargs()),
        run_config=TrainRunConfig(name=f"{cfg.run_id}-{trial_id}", storage_path=str(cfg.run_dir() / TUNE_DIR / "ray"),
                                  failure_config=FailureConfig(max_failures=cfg.ray.max_failures),
                                  callbacks=[TuneReportCallback()],
                                  worker_runtime_env={"env_vars": _worker_env()}),
    ).fit()


# --------------------------------------------------------------------------- the search


def concurrency(cfg: RunConfig, nodes: list[dict[str, Any]], declared: str | None = None) -> int:
    """Trials at once: ``ray.tune.max_concurrent``; else what the retriever's pool can hold at once.

    From the namespace's declaration (``declared``, the ``RAGPOOL_RAY_POOLS`` text; None = this
    process's) when it gives the pool's GPUs per node and most nodes (``name=GPUSxNODES``,
    contract/ray_pools.py) and a trial uses GPUs: each node holds GPUS // ``gpus`` of a trial's
    workers, so the pool holds NODES x that // ``workers`` trials (an empty pool, "any node": the sum
    over every declared pool, when each declares its nodes). On an idle cluster (Ray autoscaling from
    zero) no node is alive, and counting live nodes would start one trial at a time; starting as many
    as the pool will hold lets Ray's autoscaler scale for all of them at once.

    Otherwise (no declaration of the pool's nodes, or CPU-only trials: the declaration carries no
    CPUs) from the live nodes: their GPUs / GPUs per trial, or their CPUs / CPUs per trial on a
    CPU-only pool. At least 1."""
    if cfg.ray.tune.max_concurrent:
        return cfg.ray.tune.max_concurrent
    from training.ray.placement import pool_nodes
    from contract.ray_pools import POOLS_ENV, parse_pool_nodes, parse_pools

    res = cfg.ray.retriever
    text = os.environ.get(POOLS_ENV, "") if declared is None else declared
    try:
        gpus_per_node, most_nodes = parse_pools(text), parse_pool_nodes(text)
    except ValueError as err:  # PoolsError: the same message the placement plan gives
        raise ConfigError(str(err), POOLS_ENV) from None
    pools = [res.pool] if res.pool else list(gpus_per_node)
    if res.gpus and pools and all(p in gpus_per_node and p in most_nodes for p in pools):
        trials = sum(most_nodes[p] * (gpus_per_node[p] // res.gpus) for p in pools) // res.workers
        return max(1, trials)
    members = pool_nodes(nodes, res.pool)
    if res.gpus:
        total, per = sum(n["Resources"].get("GPU", 0) for n in members), res.gpus * res.workers
    else:
        total, per = sum(n["Resources"].get("CPU", 0) for n in members), res.cpus * res.workers + TRIAL_DRIVER_CPUS
    return max(1, int(total // per)) if per else 1


def search(cfg: RunConfig) -> list[dict[str, Any]]:
    """Run the search; returns one row per trial (params, metrics, steps, state), best first."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from training.ray.driver import _nodes

    check_space(cfg)
    t = cfg.ray.tune
    # max_t one past the last step: a trial that trains to the end returns on its own (its TorchTrainer
    # releases its workers' placement group); only the trials ASHA stops early are stopped by Tune.
    scheduler = ASHAScheduler(time_attr="step", max_t=cfg.retriever.max_steps + 1,
                              grace_period=milestone_every(cfg), reduction_factor=t.reduction_factor)
    tuner = tune.Tuner(
        tune.with_resources(trial, {"CPU": TRIAL_DRIVER_CPUS}),
        param_space={"tree": cfg.to_dict(), **param_space(cfg)},
        tune_config=tune.TuneConfig(metric=t.metric, mode="max", scheduler=scheduler, num_samples=t.num_samples,
                                    max_concurrent_trials=concurrency(cfg, _nodes())),
        run_config=tune.RunConfig(name="search", storage_path=str(cfg.run_dir() / TUNE_DIR / "ray"), verbose=0),
    )
    grid = tuner.fit()
    rows = []
    for result in grid:
        m = dict(result.metrics or {})
        steps = int(m.get("step", 0))
        state = ("error" if result.error else "complete" if steps >= cfg.retriever.max_steps
                 else "stopped (ASHA)" if steps else "not started")
        rows.append({"trial": m.get("trial_id", ""), **{k: result.config[k] for k in PARAMS},
                     **{k: m[k] for k in (*(f"recall@{k}" for k in cfg.evaluate.recall_at), "mrr") if k in m},
                     "steps": steps, "state": state,
                     **({"error": str(result.error).splitlines()[0][:200]} if result.error else {})})
    rows.sort(key=lambda r: (r.get(t.metric) is not None, r.get(t.metric) or -math.inf, r["steps"]), reverse=True)
    return rows


def table(rows: list[dict[str, Any]], metric_keys: list[str]) -> str:
    """The trials as a fixed-width text table."""
    cols = ["trial", "lr", "temperature", "global_batch_size", *metric_keys, "steps", "state"]

    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))

    cells = [[cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def write_results(cfg: RunConfig, rows: list[dict[str, Any]]) -> dict[str, Path]:
    """trials.json, trials.txt and best.yaml (the run config with the best trial's parameters)."""
    import yaml

    from training.components.stage import write_json_atomic

    out = cfg.run_dir() / TUNE_DIR
    out.mkdir(parents=True, exist_ok=True)
    metric_keys = [*(f"recall@{k}" for k in cfg.evaluate.recall_at), "mrr"]
    write_json_atomic(out / "trials.json", {"metric": cfg.ray.tune.metric, "trials": rows})
    (out / "trials.txt").write_text(table(rows, metric_keys) + "\n")
    paths = {"trials": out / "trials.json", "table": out / "trials.txt"}
    ok = [r for r in rows if r.get(cfg.ray.tune.metric) is not None]
    if ok:
        # search off: the driver runs the best config itself (a queued search's config has it on)
        best = deep_merge(with_params(cfg.to_dict(), {k: ok[0][k] for k in PARAMS}), {"ray": {"tune": {"search": "off"}}})
        load_run_config(best)  # the best config is a valid run config
        (out / "best.yaml").write_text(yaml.safe_dump(best, sort_keys=False))
        paths["best"] = out / "best.yaml"
    return paths


def printed(table_text: str, paths: dict[str, str]) -> str:
    """What ``ragpool tune`` prints of a finished search, directly or through the run API: the trials' table
    (``trials.txt``) and the files it wrote."""
    return table_text.rstrip() + "\n" + json.dumps(paths)


def results(shared_root: str, run_id: str) -> dict[str, Any] | None:
    """A finished search of ``run_id`` as the run API answers it (``ragpool tune --results``): the table, the
    trials (best first), the metric and the files' paths; None when it has written no table yet."""
    from contract.paths import run_dir

    out = run_dir(shared_root, run_id) / TUNE_DIR
    try:
        table_text = (out / "trials.txt").read_text(encoding="utf-8", errors="replace")
        trials = json.loads((out / "trials.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    paths = {"trials": out / "trials.json", "table": out / "trials.txt", "best": out / "best.yaml"}
    return {"run_id": run_id, "metric": trials.get("metric") if isinstance(trials, dict) else None,
            "trials": trials.get("trials", []) if isinstance(trials, dict) else [], "table": table_text,
            "paths": {k: str(v) for k, v in paths.items() if v.is_file()}}


def tune_spec(spec: Any, start: bool = False) -> int:
    """``ragpool tune SPEC``: the spec's training config written to ``runs/<run_id>/tune/run.yaml``, searched."""
    import yaml

    from contract.paths import run_dir, shared_root_from_env

    root = shared_root_from_env()
    path = run_dir(root, spec.run_id) / TUNE_DIR / "run.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec.to_training_config(root), sort_keys=False))
    return main(["--config", str(path), *(["--start"] if start else [])])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m training.ray.tune", add_help=True)
    parser.add_argument("--start", action="store_true", help="then run the whole run with the best parameters")
    args, rest = parser.parse_known_args(argv)
    try:
        path, overrides = split_cli(rest)
        cfg = load_run_config(path, overrides)
        check_space(cfg)
    except ConfigError as err:
        print(f"ragpool tune: config error: {err}", file=sys.stderr)
        return BAD_INPUT
    from training.ray import driver

    driver.connect(cfg)
    rows = search(cfg)
    paths = write_results(cfg, rows)
    print(printed(paths["table"].read_text(), {k: str(v) for k, v in paths.items()}))
    if "best" not in paths:
        print("ragpool tune: no trial finished a milestone; nothing to start", file=sys.stderr)
        return FAILED
    if args.start:
        return driver.main(["--config", str(paths["best"])])
    return OK


if __name__ == "__main__":
    sys.exit(main())
