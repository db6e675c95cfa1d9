"""ragpool report: a self-contained report.html with plots that show the recorded values."""

from __future__ import annotations

import json
import time

import pytest

from infra.cli import main as ragpool
from tests.support.tiny_run import GENERATOR_STEPS, RETRIEVER_STEPS, RUN_ID, own_copy
from contract import exit_codes
from training.elastic import resizes
from training.reports.report import build, figures, load_run, resize_x, throughput



def _recorded_losses(shared, stage):
    steps = {}
    for text in (shared / "runs" / RUN_ID / stage / "log.jsonl").read_text().splitlines():
        rec = json.loads(text)
        if rec["message"] == "step":
            steps[rec["step"]] = rec["fields"]["loss"]
    return [steps[s] for s in sorted(steps)]


@pytest.mark.slow
@pytest.mark.torch_multiproc
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


@pytest.mark.slow
@pytest.mark.torch_multiproc
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


def _elastic_run(shared) -> list[dict]:
    """A fake run directory: a retriever stage of 12 steps whose 3 nodes became 2 after step 4's checkpoint (a node
    lost at step 6: steps 5-6 redone) and 3 again after step 9; its step records and resize marks as the loop writes
    them (training/components/logs.py, training/elastic/resizes.py)."""
    from training.components.logs import Progress, get_logger, scoped_context

    directory = shared / "runs" / "el"
    marks = [resizes.mark(4, 3, 2, 1, resizes.LOST, 1_700_000_000.0),
             resizes.mark(9, 2, 3, 1, resizes.JOINED, 1_700_000_100.0)]
    with scoped_context("el", 0, directory):
        bar = Progress(get_logger("retriever", True), 12, 1, True)
        bar.tty = False
        for step in [*range(1, 7), *range(5, 13)]:
            bar.update(step, loss=2.0 - step / 10, lr=1e-3, nodes=3 if step <= 4 or step > 9 else 2)
            time.sleep(0.002)  # records 1 ms apart at least: a throughput per step
    for m in marks:
        resizes.append(directory / "retriever", m)
    return marks


def test_resizes_are_marked_on_the_plots_and_listed(tmp_path) -> None:
    shared = tmp_path / "shared"
    marks = _elastic_run(shared)
    data = load_run(shared, "el")
    assert data.resizes == {"retriever": marks}
    figs = figures(data)
    for stem in ("loss_retriever", "throughput"):
        lines = figs[stem].axes[0].lines
        assert lines[0].get_xdata()[-1] == 12  # the data first
        assert [ln.get_xdata()[0] for ln in lines[1:]] == [resize_x(m) for m in marks] == [4.5, 9.5]
    page, _ = build(shared, "el")
    table = page.split("<h2>Resizes</h2>")[1].split("</table>")[0]
    assert "<td>3 \u2192 2</td>" in table and "<td>2 \u2192 3</td>" in table and "2023-11-14 22:13:20" in table
    assert resizes.LOST in table and resizes.JOINED in table
    # A fixed-size run has no marks: no table, no lines beyond the data.
    (shared / "runs" / "el" / "retriever" / resizes.RESIZES_FILE).unlink()
    assert "Resizes" not in build(shared, "el")[0]
    assert len(figures(load_run(shared, "el"))["loss_retriever"].axes[0].lines) == 1
