"""``make demo``'s driver (training/demo/through_queue.py): what it does before any run starts, and the laptop's
path to the queue it sets up (the run API, signed in as a local IAM user)."""

from __future__ import annotations

from training.demo.through_queue import remove_previous_runs
from contract.paths import run_dir


def test_a_demo_removes_only_its_own_previous_runs(tmp_path) -> None:
    shared = tmp_path / "shared"
    for run_id in ("demo", "demo-ray", "mine"):
        (run_dir(shared, run_id) / "retriever").mkdir(parents=True)
        (run_dir(shared, run_id) / "retriever" / "_COMPLETE").write_text("{}")
    data = shared / "datasets" / "synthetic"
    data.mkdir(parents=True)
    (data / "corpus.jsonl").write_text("{}\n")

    removed = remove_previous_runs(shared, ["demo", "demo-ray", "demo-tune"])

    assert removed == [run_dir(shared, "demo"), run_dir(shared, "demo-ray")]  # demo-tune was never made
    assert not run_dir(shared, "demo").exists() and not run_dir(shared, "demo-ray").exists()
    assert (run_dir(shared, "mine") / "retriever" / "_COMPLETE").is_file()  # another run is left alone
    assert (data / "corpus.jsonl").is_file()  # and so is the dataset


def test_the_demo_reaches_the_queue_through_the_run_api_as_a_local_iam_user(redis_server, namespace, tmp_path,
                                                                            capsys) -> None:
    """Step 2 of the demo: a laptop's path (login, then the CLI through the API as the local IAM user, no
    ``REDIS_URL``); the run is the user's, the submit is audited, and the environment is restored after."""
    import json
    import os

    import yaml

    from contract.env import CONFIG_ENV, REDIS_URL_ENV
    from training.demo import synthetic
    from training.demo.direct import demo_spec
    from training.demo.through_queue import AUDIT_FILE, DEMO_TEAM, DEMO_USER, ragpool, through_run_api

    shared = tmp_path / "shared"
    synthetic.write(shared / "datasets" / "synthetic", seed=0, n_entities=10)
    spec = tmp_path / "demo.yaml"
    spec.write_text(yaml.safe_dump(demo_spec("demo", 2, shared), sort_keys=False))
    before = dict(os.environ)
    with through_run_api(redis_server, namespace, shared, tmp_path) as laptop:
        assert REDIS_URL_ENV not in os.environ and os.environ[CONFIG_ENV] != before.get(CONFIG_ENV)
        assert laptop.arn.endswith(f":user/{DEMO_USER}") and laptop.endpoint.startswith("http://127.0.0.1:")
        assert f"through the run API at {laptop.endpoint} as {laptop.arn}" in capsys.readouterr().out
        assert ragpool("submit", str(spec)) == 0
        capsys.readouterr()
        assert ragpool("status", "demo", "--json") == 0
        status = json.loads(capsys.readouterr().out)
        assert status["owner"] == laptop.arn and status["team"] == DEMO_TEAM  # what the API answers
        info = laptop.api.queue.get("demo")  # what Redis holds
        assert info is not None and info.state == "queued" and info.owner == laptop.arn
    assert dict(os.environ) == before
    events = [json.loads(line) for line in (tmp_path / AUDIT_FILE).read_text().splitlines()]
    assert [(e["what"], e["run_id"], e["who"], e["team"]) for e in events if e["what"] == "submit"] == \
        [("submit", "demo", laptop.arn, DEMO_TEAM)], events
