"""The run configuration (pure Python, no torch), as torchtitan keeps its ``config/``: the schema apart from the
loader.

- ``sections``: ``ConfigError``, the stage names, and one dataclass per section (data, optimizer, parallelism,
  retriever, index, generator, evaluate, checkpoint, metrics, distributed), each checking its own fields.
- ``ray_executor``: the Ray executor's sections (``ray:``: per-stage resources and pools, failures, Tune).
- ``run``: ``RunConfig`` (the top level) and how a YAML run file plus ``--key=value`` flags becomes one
  (``load_run_config``, ``split_cli``, ``describe_fields``, ``nest``/``flatten``).

Import each name from its module; this package re-exports nothing.
"""
