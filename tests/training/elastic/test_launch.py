"""An elastic run trained by real queue workers with real torch ranks (CPU/gloo, bench/elastic.py's harness): three
worker pods of one Indexed Job, each running ``training.elastic.launch`` x 1 rank, min 2, on a real redis-server.
The pod holding the run's lease is SIGKILLed mid-run (worker, agent and rank: its node is gone) -> the other two go on
at world 2 from the newest checkpoint and one takes the lease over; the Job's replacement pod for that index joins
the run -> world 3 again (the running ranks stop at a step boundary on torch's SIGTERM, checkpoint, resume at 3);
the new holder gets the spot notice (SIGTERM) -> every rank stops at the step boundary with a checkpoint, it hands
its lease off and two go on; the run ends at ``max_steps`` with the model a fixed-size run of the same samples gives,
succeeded on its first attempt."""

from __future__ import annotations

import pytest

from bench import elastic
from contract import exit_codes
from training.elastic import resizes

pytestmark = [pytest.mark.slow, pytest.mark.torch_multiproc]

KILL_AT = 6
EVERY = 4
WAIT_S = 180
"""Bound on each wait of the scenario (a restart of the ranks: ~10 s on a quiet 2-core machine, 3x that under
the suite's load on a slow day)."""


def test_a_lost_node_shrinks_the_run_and_a_new_one_grows_it(tmp_path, redis_server, namespace) -> None:
    run = elastic.ElasticRun(tmp_path, redis_server.url, namespace, max_steps=24, checkpoint_every=EVERY)
    try:
        seen = elastic.scenario(run, KILL_AT, timeout_s=WAIT_S)
    finally:
        run.close()
    # The survivors end with the run; the noticed pod exits RETRIABLE (the Job replaces its index).
    assert seen["exit_codes"] == [0, 0] and seen["noticed_exit_code"] == exit_codes.RETRIABLE, run.logs()
    # The lease moved twice (a takeover from the lost holder, a hand-off from the noticed one), on one attempt.
    first, second, last = seen["holders"]
    assert len({first, second, last}) == 3 and seen["takeovers"] == 2, seen["holders"]
    assert (seen["info"].state, seen["info"].attempts) == ("succeeded", 1), seen["info"]
    steps = seen["steps"]
    got = elastic.figures(steps, seen["killed"], seen["joined"], seen["noticed"], KILL_AT, EVERY)
    # 3 ranks, then 2 (each accumulating 3 micro-batches of 2 instead of 2: the global batch of 12 kept), 3, 2.
    assert got["worlds"] == [3, 2, 3, 2] and got["final_step"] == 24, steps
    assert {s["accum"] for s in steps if s["world"] == 2} == {3} and {s["accum"] for s in steps if s["world"] == 3} == {2}
    # The SIGKILL after step 6 cost the 2 steps since step 4's checkpoint; the join and the spot notice none.
    assert (got["lost_steps_sigkill"], got["lost_steps_join"], got["lost_steps_sigterm"]) == (2, 0, 0), steps
    assert got["loss_continuity"], steps
    text = "".join(run.log(i).read_text() for i in range(len(run.pods)))  # rank 0 may be on any pod
    assert "world size changed: 3 -> 2 ranks at step 4" in text, run.logs()
    assert "world size changed: 2 -> 3 ranks at step 15" in text, run.logs()
    assert "world size changed: 3 -> 2 ranks at step 19" in text, run.logs()
    # Rank 0 marked each resize in the stage directory, with its cause (what ragpool report shows).
    marks = [(m["step"], m["from_nodes"], m["to_nodes"], m["cause"]) for m in resizes.read(run.out)]
    assert marks[-3:] == [(4, 3, 2, resizes.LOST), (15, 2, 3, resizes.JOINED), (19, 3, 2, resizes.NOTICE)], marks
    # The same samples in the same order on one process give the same model (float tolerance).
    assert elastic.params_match(run.out / elastic.elastic_task.FINAL_FILE,
                                elastic.reference(tmp_path, 24, EVERY, timeout_s=120))


def test_the_launcher_adds_its_rendezvous_and_refuses_another(capsys) -> None:
    from contract.exit_codes import BAD_INPUT
    from contract.names import ELASTIC_RDZV_BACKEND
    from training.elastic import launch

    entry = ["--nnodes", "2:3", "-m", "training.pipeline"]
    assert launch.elastic_argv(entry) == ["--rdzv-backend", ELASTIC_RDZV_BACKEND, "--rdzv-endpoint", "redis", *entry]
    assert launch.main(["--rdzv-backend", "c10d", *entry]) == BAD_INPUT
    assert launch.main(["--nnodes", "3:2", "-m", "training.pipeline"]) == BAD_INPUT
    assert launch.main(["--nnodes", "1:2:3", "-m", "training.pipeline"]) == BAD_INPUT
    err = capsys.readouterr().err
    assert "'c10d'" in err and "MIN <= MAX" in err and "MIN:MAX" in err


def test_the_agents_exit_barrier_is_short_and_torchrun_builds_that_agent(monkeypatch) -> None:
    """An agent killed after its ranks finished must not hold the others for torch's 300 s: the launcher's agent
    waits EXIT_BARRIER_S, and torch's launch_agent builds its agent from the module name the launcher replaces."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher import api

    from training.elastic import launch

    monkeypatch.setattr(api, "LocalElasticAgent", api.LocalElasticAgent)  # restored after the test
    agent_cls = launch.short_exit_barrier()
    assert api.LocalElasticAgent is agent_cls
    assert "LocalElasticAgent" in api.launch_agent.__code__.co_names  # read as a module global at call time
    spec = WorkerSpec(role="trainer", local_world_size=1, rdzv_handler=object(), entrypoint="x")
    assert agent_cls(spec, DefaultLogsSpecs())._exit_barrier_timeout == launch.EXIT_BARRIER_S < 300
