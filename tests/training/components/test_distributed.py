"""training.components.distributed: the gradient-preserving all-gather, and the row-sparse embedding all-reduce
that gives DDP's dense gradients exactly."""

from __future__ import annotations

import multiprocessing
import traceback
from pathlib import Path

import pytest
import torch

from training.components.distributed import DistEnv, SparseEmbeddingGrads, wrap_ddp

VOCAB, WIDTH = 4096, 8


class Toy(torch.nn.Module):
    """An untied table (qualifies), a small one (too few rows) and a tied input/output pair."""

    def __init__(self, misuse: bool = False) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(VOCAB, WIDTH)
        self.small = torch.nn.Embedding(16, WIDTH)
        self.tied_in = torch.nn.Embedding(2048, WIDTH)
        self.tied_out = torch.nn.Linear(WIDTH, 2048, bias=False)
        self.tied_out.weight = self.tied_in.weight
        self.misuse = misuse

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.table(ids) + self.small(ids % 16) + self.tied_in(ids % 2048)
        out = self.tied_out(h).logsumexp(-1).mean()
        if self.misuse:  # reads every row of the table outside its forward
            out = out + (h.mean(0) @ self.table.weight.T).logsumexp(-1)
        return out


def _ids(rank: int, micro: int) -> torch.Tensor:
    # Each rank and micro-step looks up its own rows plus a few shared ones.
    g = torch.Generator().manual_seed(100 * rank + micro)
    return torch.cat([torch.randint(0, VOCAB, (40,), generator=g), torch.arange(5)])


def _train(mode: str, rank: int, misuse: bool = False) -> tuple[dict[str, torch.Tensor], object]:
    torch.manual_seed(0)
    model = Toy(misuse)
    env = DistEnv(rank, 2, rank, 2, torch.device("cpu"))
    ddp = wrap_ddp(model, env, sparse_embedding_grads=mode)
    for step in range(2):
        with ddp.no_sync():  # gradient accumulation: rows of the silent micro-step count too
            ddp(_ids(rank, 2 * step)).backward()
        ddp(_ids(rank, 2 * step + 1)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
            p.grad = None
    return grads, getattr(ddp, "sparse_embedding_grads", None)


SCENARIOS = ("exact", "misuse")
"""What the two ranks run, in this order, in one process group (each process start costs seconds of imports):
the misuse last, as it stops both ranks' training with an error."""


def _worker(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    from training.components.stage import exit_process

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    code = 1
    try:
        for scenario in SCENARIOS:
            if scenario == "exact":
                dense, none = _train("never", rank)
                sparse, state = _train("always", rank)
                torch.save({"dense": dense, "sparse": sparse, "no_state_when_off": none is None,
                            "rows_sent": state.rows_sent, "rows_total": state.rows_total,
                            "tables": len(state.masks)}, f"{out}/{scenario}-rank{rank}.pt")
            else:
                try:
                    _train("always", rank, misuse=rank == 1)  # one rank is enough to stop both
                    torch.save({"error": None}, f"{out}/{scenario}-rank{rank}.pt")
                except RuntimeError as e:
                    torch.save({"error": str(e)}, f"{out}/{scenario}-rank{rank}.pt")
        code = 0
    except Exception:
        Path(f"{out}/rank{rank}.err").write_text(traceback.format_exc())
    finally:
        dist.destroy_process_group()
    # As a rank ends (training/components/stage.py): a spawned child otherwise finalizes its interpreter,
    # where Gloo's threads can abort it (SIGABRT, "terminate called without an active exception").
    exit_process(code)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict]]:
    """``SCENARIOS`` run by 2 spawned gloo ranks: scenario -> each rank's results."""
    out = tmp_path_factory.mktemp("two_ranks")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, str(out / "store"), str(out))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    errors = [f.read_text() for f in out.glob("rank*.err")]
    assert all(p.exitcode == 0 for p in procs), errors
    return {scenario: [torch.load(out / f"{scenario}-rank{r}.pt") for r in range(2)] for scenario in SCENARIOS}


@pytest.mark.torch_multiproc  # two spawned gloo ranks (``two_ranks``)
def test_sparse_embedding_allreduce_equals_dense_allreduce(two_ranks) -> None:
    results = two_ranks["exact"]
    for r in results:
        assert r["no_state_when_off"] and r["tables"] == 1  # only the untied, large table
        for name, dense in r["dense"].items():
            assert torch.equal(r["sparse"][name], dense), name
        # The table gradient really is row-sparse, and the hook sent only those rows.
        assert 0 < r["rows_sent"] < r["rows_total"] / 10
    # Rows one rank never looked up still got the other rank's gradient (the union was sent).
    assert torch.equal(results[0]["sparse"]["table.weight"], results[1]["sparse"]["table.weight"])
    assert int((results[0]["sparse"]["table.weight"] != 0).any(1).sum()) > len(_ids(0, 3))


@pytest.mark.torch_multiproc
def test_table_used_outside_its_forward_is_refused_on_every_rank(two_ranks) -> None:
    for r in two_ranks["misuse"]:
        assert r["error"] is not None and "no forward looked up" in r["error"]
        assert "sparse_embedding_grads: never" in r["error"]


def test_tied_and_small_tables_are_left_dense() -> None:
    model = Toy()
    state = SparseEmbeddingGrads(model)
    assert list(state.masks) == [id(model.table.weight)]
    model.table(torch.tensor([3, 7, 7]))
    with torch.no_grad():  # evaluation does not add rows
        model.table(torch.tensor([11]))
    assert state.masks[id(model.table.weight)].nonzero().flatten().tolist() == [3, 7]


@pytest.mark.slow
@pytest.mark.torch_multiproc
def test_gather_with_grad_gives_the_global_gradient(tmp_path: Path) -> None:
    """Under torchrun: d(mean loss over ranks)/dx via all_gather_with_grad equals the single-process gradient."""
    script = tmp_path / "gather_check.py"
    script.write_text('''
import torch, torch.distributed as dist
from training.components import distributed as D
env = D.init_distributed("cpu")
torch.manual_seed(0)
full = torch.randn(4, 3, dtype=torch.float64)
x = full[env.rank * 2:(env.rank + 1) * 2].clone().requires_grad_(True)
g = D.all_gather_with_grad(env, x)
w = torch.arange(12, dtype=torch.float64).reshape(4, 3)
loss = ((g * w).sum() ** 2) * (env.rank + 1)
loss.backward()
ref = full.clone().requires_grad_(True)
total = sum(((ref * w).sum() ** 2) * (r + 1) for r in range(2))
total.backward()
assert torch.allclose(x.grad, ref.grad[env.rank * 2:(env.rank + 1) * 2]), (x.grad, ref.grad)
import pathlib, sys
pathlib.Path(sys.argv[1], f"ok{env.rank}").write_text("ok")  # stdout of two ranks interleaves
D.destroy()
from training.components.stage import exit_process
exit_process(0)  # as a rank ends: no finalization for Gloo's threads to abort
''')
    import subprocess

    from tests.support.training import REPO, stage_env
    from training.scheduler.worker.child import torchrun_argv

    out = subprocess.run(torchrun_argv([str(script), str(tmp_path)], nproc=2), cwd=REPO, env=stage_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / "ok0").is_file() and (tmp_path / "ok1").is_file()
