"""ragpool report: a self-contained report.html with plots that show the recorded values."""

from __future__ import annotations

import json

import pytest

from infra.cli import main as ragpool
from tests.support.tiny_run import GENERATOR_STEPS, RETRIEVER_STEPS, RUN_ID, own_copy
from contract import exit_codes
from training.reports.report import figures, load_run, throughput

pytestmark = [pytest.mark.slow, pytest.mark.torch_multiproc]


def _recorded_losses(shared, stage):
    steps = {}
    for text in (shared / "runs" / RUN_ID / stage / "log.jsonl").read_text().splitlines():
        rec = json.loads(text)
        if rec["message"] == "step":
            steps[rec["step"]] = rec["fields"]["loss"]
    return [steps[s] for s in sorted(steps)]


def test_plots_show_one_point_per_step_with_the_recorded_loss(finished_run) -> None:
    shared, _ = finished_run
    data = load_run(shared, RUN_ID)
    figs = figures(data)
    for stage, n in (("retriever", RETRIEVER_STEPS), ("generator", GENERATOR_STEPS)):
        line = figs[f"loss_{stage}"].axes[0].lines[0]
        assert list(line.get_xdata()) == list(range(1, n + 1))
        assert list(line.get_ydata()) == pytest.approx(_recorded_losses(shared, stage))
    lr_lines = {ln.get_label(): ln for ln in figs["learning_rate"].axes[0].lines}
    assert set(lr_lines) == {"retriever", "generator"} and len(lr_lines["retriever"].get_xdata()) == RETRIEVER_STEPS
    steps, rates, unit = throughput(data.series["retriever"])
    assert len(steps) >= RETRIEVER_STEPS - 1 and all(r > 0 for r in rates) and unit in ("samples/s", "steps/s")
    assert set(figs) >= {"loss_retriever", "loss_generator", "learning_rate", "throughput", "stage_timings"}


def test_report_command_writes_html_and_pngs(finished_run, tmp_path, capsys) -> None:
    shared = own_copy(finished_run[0], tmp_path)
    assert ragpool(["report", RUN_ID, "--shared-root", str(shared)]) == exit_codes.OK
    run_dir = shared / "runs" / RUN_ID
    page = (run_dir / "report.html").read_text()
    assert str(run_dir / "report.html") in capsys.readouterr().out
    for stem in ("loss_retriever", "loss_generator", "learning_rate", "throughput", "stage_timings"):
        png = run_dir / "report" / f"{stem}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f'alt="{stem}" src="data:image/png;base64,' in page  # embedded: one file to share
    report = json.loads((run_dir / "evaluate" / "report.json").read_text())
    assert f"{report['retrieval']['mrr']:.3f}" in page and f"{report['retrieval_pretrained']['mrr']:.3f}" in page
    assert "exact match" in page and "recall@1" in page and "http" not in page.split("<body>")[1].split("Generated")[0]


def test_unknown_run_exits_3(tmp_path, capsys) -> None:
    assert ragpool(["report", "no-such-run", "--shared-root", str(tmp_path)]) == exit_codes.NOT_FOUND
    assert "no run 'no-such-run'" in capsys.readouterr().err
