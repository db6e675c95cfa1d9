"""``make demo``'s driver (training/demo/through_queue.py): what it does before any run starts."""

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
