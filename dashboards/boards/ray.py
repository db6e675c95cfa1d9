"""Ray's own Grafana dashboards, generated from the pinned Ray, shipped next to ragpool's.

Ray ships its dashboards as code (``ray.dashboard.modules.metrics.grafana_dashboard_factory``);
ragpool does not hand-write them. ``python -m dashboards.boards.ray --write`` regenerates
``dashboards/boards/ray-generated/*.json`` with the installed Ray, which must be the pinned version
(``training.ray.RAY_VERSION``); a test regenerates them and compares bytes, so the committed
files cannot drift from the Ray the cluster runs. The files are committed so the offline
plan and ``pulumi up`` need no Ray import; infra/ray_cluster.py ships them as Grafana
ConfigMaps (label ``grafana_dashboard``).

They stay out of ``dashboards.boards.ALL`` (ragpool's own, grafana-foundation-sdk boards, whose
every metric the coverage tests account for): these read Ray's metrics, by construction of Ray.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from contract import exit_codes
from contract.names import RAY_VERSION

RAY_BOARDS_DIR = Path(__file__).resolve().parent / "ray-generated"
# Output stem -> name of the generator in ray's grafana_dashboard_factory. Ray Core (nodes,
# tasks, actors, placement groups, autoscaler) and Ray Train; ragpool runs no Serve or Data.
GENERATORS = {
    "ray-default": "generate_default_grafana_dashboard",
    "ray-train": "generate_train_grafana_dashboard",
}


class RayVersionError(RuntimeError):
    """The installed Ray is not the pinned one."""


def generate() -> dict[str, str]:
    """File name -> dashboard JSON (compact, keys sorted) from the installed Ray."""
    import ray
    from ray.dashboard.modules.metrics import grafana_dashboard_factory as factory

    if ray.__version__ != RAY_VERSION:
        raise RayVersionError(f"installed ray is {ray.__version__}, the pin is {RAY_VERSION} "
                              f"(training/ray/__init__.py RAY_VERSION): install ray=={RAY_VERSION}")
    out = {}
    for stem, function in GENERATORS.items():
        content, _uid = getattr(factory, function)()
        out[f"{stem}.json"] = json.dumps(json.loads(content), sort_keys=True, separators=(",", ":"),
                                         ensure_ascii=False) + "\n"
    return out


def committed() -> dict[str, str]:
    """File name -> the committed dashboard JSON (what the cluster gets)."""
    return {f"{stem}.json": (RAY_BOARDS_DIR / f"{stem}.json").read_text(encoding="utf-8") for stem in GENERATORS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.boards.ray", description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"regenerate {RAY_BOARDS_DIR}/*.json")
    args = parser.parse_args(argv)
    try:
        boards = generate()
    except (ImportError, RayVersionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    if not args.write:
        stale = sorted(name for name, text in boards.items() if committed().get(name) != text)
        print("stale: " + ", ".join(stale) if stale else "up to date")
        return 1 if stale else 0
    RAY_BOARDS_DIR.mkdir(exist_ok=True)
    for name, text in boards.items():
        (RAY_BOARDS_DIR / name).write_text(text, encoding="utf-8")
        print(RAY_BOARDS_DIR / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
