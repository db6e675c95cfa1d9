"""``ragpool submit`` refuses a run that cannot run in the stack it goes to (training/scheduler/fit.py):
a lane with no worker in its namespace (RAGPOOL_SERVED_LANES), or a training stage whose per-rank state
cannot fit the pool's GPUs (RAGPOOL_POOL_GPUS, training/rank_memory.py). Exit 2 naming the key, nothing
enqueued; with the variables unset nothing changes. Against a real redis-server."""

from __future__ import annotations

import json
import math
import struct

import pytest

from tests.support.redis_fixtures import SPEC_DATA, SPEC_DATA_YAML
from tests.training.scheduler.test_cli import _cli_at
from contract import exit_codes
from training.rank_memory import (GIB, config_parameters, fits, host_bytes_per_pod, host_fits, model_parameters,
                                  state_bytes_per_rank)
from contract.pool_gpus import POOL_GPUS_ENV, FitError, PoolGpus, format_pool_gpus, parse_pool_gpus
from contract.lanes import POOLS_ENV, SERVED_LANES_ENV

# Lanes of a namespace whose quota fits 4 one-GPU workers of gpu-spot (the default pool), and no
# worker of gpu-big; plus the Ray worker. (tests/infra/test_served_lanes.py checks that the stack
# exports exactly what infra/keda.py declares.)
SERVED = "pool.gpu-spot,pool.gpu-spot.n2,pool.gpu-spot.n4,torchrun,torchrun.n2,torchrun.n4,ray"
# Llama-2-7B's config.json (meta-llama/Llama-2-7b-hf): 6.74e9 parameters.
LLAMA_7B = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 11008,
            "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "vocab_size": 32000, "tie_word_embeddings": False, "hidden_act": "silu"}


@pytest.fixture
def submit(redis_server, namespace, monkeypatch, tmp_path, capsys):
    """``submit(spec_text, **env) -> (exit code, stderr, queued?)``, the fit variables exactly ``env``."""

    def run(text: str, **env: str):
        for name in (SERVED_LANES_ENV, POOL_GPUS_ENV, POOLS_ENV):
            monkeypatch.delenv(name, raising=False)
        path = tmp_path / "run.yaml"
        path.write_text(text if "data:" in text else text + SPEC_DATA_YAML)  # submit requires data
        cli = _cli_at(redis_server.url, monkeypatch, tmp_path, namespace, **env)
        code = cli("submit", str(path))
        err = capsys.readouterr().err
        run_id = text.split("run_id:", 1)[1].split()[0]
        return code, err, redis_server.client().exists(f"{namespace}:task:{run_id}") == 1

    return run


def refused(result, key: str) -> str:
    code, err, queued = result
    assert code == exit_codes.BAD_INPUT, err
    assert f"  {key}: " in err and "nothing was submitted" in err and "Traceback" not in err
    assert not queued, "nothing enqueued"
    return err


# ------------------------------------------------------------------ lanes


@pytest.mark.parametrize("spec, key, says", [
    ("nodes: 8", "nodes", "takes 8-node runs of unpinned runs"),
    ("pool: gpu-big", "pool", "takes pool 'gpu-big' (lane pool.gpu-big)"),
    ("pool: gpu-spot\nnodes: 3", "nodes", "gangs of at most 4 node(s)"),
])
def test_a_lane_with_no_worker_in_the_namespace_is_refused(submit, namespace, spec, key, says):
    err = refused(submit(f"run_id: r1\nstages: [retriever]\n{spec}\n",
                         **{SERVED_LANES_ENV: SERVED, POOLS_ENV: "gpu-spot,gpu-big"}), key)
    assert says in err and f"namespace {namespace!r}" in err
    assert f"{SERVED_LANES_ENV}: pool.gpu-spot, pool.gpu-spot.n2, pool.gpu-spot.n4, ray, torchrun" in err


def test_unpinned_runs_in_a_namespace_without_the_default_pool_name_pool(submit):
    """A team whose quota fits no worker of the default pool: its unpinned lane has no ScaledJob."""
    err = refused(submit("run_id: r2\nstages: [retriever]\n", **{SERVED_LANES_ENV: "pool.gpu-small,ray"}), "pool")
    assert "unpinned runs" in err and "pin one of its pools: gpu-small" in err
    code, err, queued = submit("run_id: r3\nstages: [retriever]\npool: gpu-small\n",
                               **{SERVED_LANES_ENV: "pool.gpu-small,ray"})
    assert code == 0 and queued, err
    err = refused(submit("run_id: r4\nstages: [retriever]\nexecutor: ray\n", **{SERVED_LANES_ENV: "torchrun"}),
                  "executor")
    assert "executor: ray" in err


def test_served_lanes_accept_and_unset_changes_nothing(submit):
    for run_id, spec in (("a1", ""), ("a2", "nodes: 4"), ("a3", "pool: gpu-spot\nnodes: 2")):
        code, err, queued = submit(f"run_id: {run_id}\nstages: [retriever]\n{spec}\n", **{SERVED_LANES_ENV: SERVED})
        assert code == 0 and queued, err
    code, err, queued = submit("run_id: a4\nstages: [retriever]\nnodes: 64\n")
    assert code == 0 and queued, "unset: not checked (as before)"
    err = refused(submit("run_id: a5\nstages: [retriever]\n", **{SERVED_LANES_ENV: "torchrun,bogus"}), "(environment)")
    assert SERVED_LANES_ENV in err and "bogus" in err


def test_an_elastic_batch_is_checked_at_the_pools_gpus_per_node(submit):
    """nodes {min: 2, max: 4}, a global batch of 12 in 3 micro-steps: at one rank per node (what the spec alone
    assumes) 1 example per rank; a pool of 8-GPU pods makes the largest world 32 ranks, which 12 cannot feed."""
    text = ("run_id: {}\nstages: [retriever]\nnodes: {{min: 2, max: 4}}\n{}"
            "hyperparameters:\n  retriever: {{global_batch_size: 12, grad_accum: 3}}\n")
    err = refused(submit(text.format("e1", ""), **{POOL_GPUS_ENV: "gpu-spot=8:80GiB", POOLS_ENV: "gpu-spot"}),
                  "hyperparameters.retriever.global_batch_size")
    assert "largest world (32 ranks)" in err and "8 ranks per node" in err and "'gpu-spot'" in err
    for run_id, spec, pool_gpus in (("e2", "", "gpu-spot=1:24GiB"), ("e3", "gpus_per_node: 1\n", "gpu-spot=8"),
                                    ("e4", "", None)):
        env = {POOLS_ENV: "gpu-spot", **({POOL_GPUS_ENV: pool_gpus} if pool_gpus else {})}
        code, err, queued = submit(text.format(run_id, spec), **env)
        assert code == 0 and queued, err  # 1 GPU per pod; one rank per node asked for; the pool's GPUs not known


# ------------------------------------------------------------------ memory


def llama_7b(root) -> str:
    model = root / "shared" / "models" / "llama-7b"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(LLAMA_7B))
    return "models/llama-7b"


def generator_run(run_id: str, model: str, strategy: str, nodes: int = 1, pool: str | None = None) -> str:
    return (f"run_id: {run_id}\nstages: [generator]\nmodels: {{generator: {model}}}\nnodes: {nodes}\n"
            + (f"pool: {pool}\n" if pool else "")
            + f"hyperparameters:\n  generator: {{parallelism.strategy: {strategy}}}\n")


def test_a_7b_model_with_ddp_on_a_24_gib_pool_is_refused_with_the_arithmetic(submit, tmp_path):
    env = {POOL_GPUS_ENV: "gpu-spot=1:24GiB", POOLS_ENV: "gpu-spot", SERVED_LANES_ENV: SERVED + ",torchrun.n8"}
    err = refused(submit(generator_run("big-ddp", llama_7b(tmp_path), "ddp"), **env),
                  "hyperparameters.generator.parallelism.strategy")
    # 6,738,149,376 parameters x 16 B = 100.4 GiB per rank against 90 % of 24 GiB.
    assert "6738149376 parameters" in err and "6.74e9 parameters x 16 B" in err
    assert "100.4 GiB per rank" in err and "21.6 GiB usable (90% of 24 GiB per GPU)" in err
    assert "pool 'gpu-spot'" in err and "at least 5 ranks" in err
    # The same model sharded with fsdp over 8 one-GPU nodes: 12.6 GiB per rank.
    code, err, queued = submit(generator_run("big-fsdp", "models/llama-7b", "fsdp", nodes=8), **env)
    assert code == 0 and queued, err
    # ... but not over 4: 25.1 GiB per rank.
    err = refused(submit(generator_run("big-fsdp4", "models/llama-7b", "fsdp", nodes=4), **env),
                  "hyperparameters.generator.parallelism.strategy")
    assert "/ 4 ranks = 25.1 GiB per rank" in err


def test_a_7b_fsdp_stage_whose_host_memory_peaks_do_not_fit_the_worker_pod_is_refused(submit, tmp_path):
    """The pod memory of RAGPOOL_POOL_GPUS (:mem<M>GiB): 6.74e9 parameters gather 6 B each on rank 0 (37.7 GiB)
    and stage 12.1 B per parameter of each rank's shard at every checkpoint (bench/fsdp_memory.py --host-memory)."""
    key = "hyperparameters.generator.parallelism.strategy"
    served = SERVED + ",torchrun.n8,pool.gpu-big"
    # Sharded over 8 one-GPU nodes, the GPU state fits (12.6 GiB per rank) but a dev-sized pod of 11 GiB cannot
    # take the rank-0 gather: only a pool with larger pods helps, so the key is the run's pool.
    env = {POOL_GPUS_ENV: "gpu-spot=1:24GiB:mem11GiB,gpu-big=8:80GiB:mem1055GiB", POOLS_ENV: "gpu-spot,gpu-big",
           SERVED_LANES_ENV: served}
    err = refused(submit(generator_run("host-gather", llama_7b(tmp_path), "fsdp", nodes=8), **env), "pool")
    assert "cannot be gathered on rank 0" in err and "rank-0 gather 6.74e9 x 6 B = 37.7 GiB" in err
    assert "9.9 GiB usable (90% of the 11 GiB memory limit of a worker pod)" in err and "pool 'gpu-spot'" in err
    # 8 ranks of one pod staging 1/8 each: 75.9 GiB, more than 90 % of a 64 GiB pod.
    small = {**env, POOL_GPUS_ENV: "gpu-big=8:80GiB:mem64GiB", POOLS_ENV: "gpu-big"}
    err = refused(submit(generator_run("host-staging", "models/llama-7b", "fsdp", pool="gpu-big"), **small), key)
    assert "cannot stage its checkpoint" in err and "8 rank(s) of the pod" in err and "= 75.9 GiB" in err
    # A p4d-sized pod (1055 GiB, infra/gpu_memory.py) holds both: accepted.
    code, err, queued = submit(generator_run("host-ok", "models/llama-7b", "fsdp", pool="gpu-big"), **env)
    assert code == 0 and queued, err
    # A stack that exports no pod memory: the host check is not made (as before it).
    code, err, queued = submit(generator_run("host-old", "models/llama-7b", "fsdp", nodes=8),
                               **{**env, POOL_GPUS_ENV: "gpu-spot=1:24GiB"})
    assert code == 0 and queued, err


def test_the_host_arithmetic():
    params = config_parameters(LLAMA_7B)
    staging, gather = host_bytes_per_pod(params, "fsdp", 8, 8, 8)
    assert staging == 8 * math.ceil(12.1 * params / 8) and gather == math.ceil(6 * params)
    assert host_bytes_per_pod(params, "ddp", 8, 8, 8)[0] == math.ceil(12.1 * params), "ddp: rank 0 alone snapshots"
    assert host_bytes_per_pod(params, "hsdp", 16, 8, 8)[0] == 8 * math.ceil(12.1 * params / 8)
    assert host_fits(params, "fsdp", 8, 8, 8, 1055)[:2] == (True, True)
    assert host_fits(params, "fsdp", 8, 1, 1, 11)[:2] == (True, False)
    assert host_fits(params, "fsdp", 8, 8, 8, 64)[:2] == (False, True)


def test_unknown_gpu_memory_or_an_unreadable_model_skips_with_a_note(submit, tmp_path):
    llama_7b(tmp_path)
    code, err, queued = submit(generator_run("u1", "models/llama-7b", "ddp"),
                               **{POOL_GPUS_ENV: "gpu-spot=1", POOLS_ENV: "gpu-spot"})
    assert code == 0 and queued, err
    assert "note: memory check of generator skipped: pool 'gpu-spot' has an instance family whose GPU memory " \
           "is not recorded" in err
    (tmp_path / "shared" / "models" / "no-config").mkdir()  # a directory whose size cannot be read
    code, err, queued = submit(generator_run("u2", "models/no-config", "ddp"), **{POOL_GPUS_ENV: "gpu-spot=1:24GiB"})
    assert code == 0 and queued and "cannot read the size of" in err, err
    err = refused(submit(generator_run("u4", "models/not-here", "ddp")), "models.generator")
    assert "models/not-here does not exist" in err
    code, err, queued = submit(generator_run("u3", "models/llama-7b", "ddp"))
    assert code == 0 and queued and "note" not in err, "unset: not checked (as before)"


def test_a_malformed_pool_gpus_refuses_the_submit_naming_the_variable(submit, tmp_path):
    llama_7b(tmp_path)
    # The old GPUSxGiB form: in RAGPOOL_RAY_POOLS x multiplies GPUs by nodes, so it is no longer read.
    err = refused(submit(generator_run("m1", "models/llama-7b", "ddp"), **{POOL_GPUS_ENV: "gpu-spot=1x24"}),
                  "(environment)")
    assert f"{POOL_GPUS_ENV}: 'gpu-spot=1x24' is not pool=GPUS:<N>GiB (e.g. gpu-spot=1:24GiB)" in err


def test_the_arithmetic():
    params = config_parameters(LLAMA_7B)
    assert params == 6_738_149_376  # embeddings 2 x 32000 x 4096 + 32 x (4 x 4096^2 + 3 x 4096 x 11008)
    assert state_bytes_per_rank(params, "ddp", 8, 8) == 16 * params
    assert state_bytes_per_rank(params, "fsdp", 16, 8) == 16 * params // 16
    assert state_bytes_per_rank(params, "hsdp", 16, 8) == 16 * params // 8, "hsdp shards within a node only"
    assert fits(params, "ddp", 1, 1, 141)[0] and not fits(params, "ddp", 1, 1, 80)[0]
    assert fits(10**9, "ddp", 1, 1, 24)[0] and not fits(2 * 10**9, "ddp", 1, 1, 24)[0]
    assert 16 * 10**9 / GIB < 0.9 * 24 < 32 * 10**9 / GIB


def test_safetensors_headers_give_the_exact_count(tmp_path):
    def write(name: str, shapes: dict[str, list[int]]):
        offset, header = 0, {"__metadata__": {"format": "pt"}}
        for key, shape in shapes.items():
            size = 4 * (1 if not shape else __import__("math").prod(shape))
            header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(header).encode()
        (tmp_path / name).write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)

    write("model-00001-of-00002.safetensors", {"embed.weight": [100, 8], "norm.weight": [8]})
    write("model-00002-of-00002.safetensors", {"lm_head.weight": [100, 8], "scalar": []})
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_7B))  # ignored: the headers are exact
    assert model_parameters(tmp_path) == (1609, "the headers of 2 safetensors file(s)")


def test_pool_gpus_round_trip_and_bad_values():
    pools = {"gpu-spot": PoolGpus(1, 24.0), "gpu-big": PoolGpus(8, None), "h200": PoolGpus(8, 141.0)}
    assert format_pool_gpus(pools) == "gpu-spot=1:24GiB,gpu-big=8,h200=8:141GiB"
    assert parse_pool_gpus(format_pool_gpus(pools)) == pools
    # With the worker pod's memory (infra/gpu_memory.py pod_memory_gib), with or without the GPU memory.
    pools = {"gpu-spot": PoolGpus(1, 24.0, 11.0), "gpu-x": PoolGpus(4, None, 167.0), "gpu-big": PoolGpus(8, 40.0)}
    assert format_pool_gpus(pools) == "gpu-spot=1:24GiB:mem11GiB,gpu-x=4:mem167GiB,gpu-big=8:40GiB"
    assert parse_pool_gpus(format_pool_gpus(pools)) == pools
    assert list(parse_pool_gpus("b=1,a=2")) == ["b", "a"], "order kept: the first is the default pool"
    for bad in ("gpu-spot", "gpu-spot=0:24GiB", "Gpu=1:24GiB", "gpu=1:", "gpu=1:24", "gpu=1:GiB",
                "gpu=1:24gib", "gpu=1x24", "gpu=1:24GiBx", "gpu=1:mem", "gpu=1:mem11", "gpu=1:mem11GiB:24GiB"):  # the old GPUSxGiB form too: x means nodes elsewhere
        with pytest.raises(FitError, match=POOL_GPUS_ENV):
            parse_pool_gpus(bad)


def test_a_ray_stage_is_checked_on_its_own_pool_and_workers(tmp_path, monkeypatch):
    from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV
    from training.scheduler.fit import memory_problems
    from training.scheduler.spec import parse_spec

    llama_7b(tmp_path)
    monkeypatch.setenv(RAY_POOLS_ENV, "gpu-spot=1,gpu-big=8")
    root = str(tmp_path / "shared")

    def ray_run(strategy: str, workers: int):
        return parse_spec({"run_id": "r", "stages": ["generator"], "executor": "ray",
                           "models": {"generator": "models/llama-7b"},
                           "hyperparameters": {"generator": {"parallelism.strategy": strategy},
                                               "run": {"ray.generator.pool": "gpu-spot", "ray.generator.gpus": 1,
                                                       "ray.generator.workers": workers}}}, shared_root=root)

    env = {POOL_GPUS_ENV: "gpu-big=8:80GiB,gpu-spot=1:24GiB"}  # the default pool does not matter: the stage names its own
    problems, notes = memory_problems(ray_run("ddp", 8), root, env)
    assert [k for k, _ in problems] == ["hyperparameters.generator.parallelism.strategy"] and not notes
    assert "pool 'gpu-spot'" in problems[0][1] and "100.4 GiB per rank" in problems[0][1]
    assert memory_problems(ray_run("fsdp", 8), root, env) == ([], []), "fsdp over 8 Ray Train workers: 12.6 GiB"
    # With the Ray worker pods' memory: the rank-0 gather (37.7 GiB) does not fit an 11 GiB pod: the stage's pool.
    problems, _ = memory_problems(ray_run("fsdp", 8), root, {POOL_GPUS_ENV: "gpu-big=8:80GiB,gpu-spot=1:24GiB:mem11GiB"})
    assert [k for k, _ in problems] == ["hyperparameters.run.ray.generator.pool"], problems


# ------------------------------------------------------------------ index settings against the corpus


def test_index_settings_the_prepared_corpus_cannot_hold_are_refused_at_submit(submit, tmp_path):
    from training.components.corpus import PREPARED_DIR, prepare

    shared = tmp_path / "shared"
    corpus = shared / "datasets" / "big" / "passages"
    corpus.mkdir(parents=True)
    (corpus / "s0.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "text": "t"}) + "\n" for i in range(300)))
    prepare(corpus, corpus / PREPARED_DIR)
    encoder = shared / "models" / "enc"
    encoder.mkdir(parents=True)
    (encoder / "config.json").write_text(json.dumps({"hidden_size": 32}))
    qa = f"qa_train: {SPEC_DATA['qa_train']}, qa_eval: {SPEC_DATA['qa_eval']}"
    spec = ("run_id: {rid}\nstages: [index]\ndata: {{corpus: datasets/big/passages, " + qa + "}}\n"
            "models: {{retriever: models/enc}}\nhyperparameters:\n  index: {{{index}}}\n")
    err = refused(submit(spec.format(rid="pq-bad", index="kind: ivfpq, nlist: 1000, nprobe: 4, pq_m: 5")),
                  "hyperparameters.index.nlist")
    assert "more clusters than the 300 passages" in err
    assert "  hyperparameters.index.pq_m: must divide the encoder's dimension 32" in err
    code, err, queued = submit(spec.format(rid="pq-ok", index="kind: ivfpq, nlist: 4, nprobe: 4, pq_m: 8"))
    assert code == 0 and queued, err
    # Not prepared: accepted (its shards parse), with a note that the stage checks it.
    (shared / "datasets" / "raw").mkdir()
    (shared / "datasets" / "raw" / "s0.jsonl").write_text(json.dumps({"id": "p0", "text": "t"}) + "\n")
    code, err, queued = submit(spec.format(rid="pq-later", index="kind: ivfpq, nlist: 4, nprobe: 4, pq_m: 8")
                               .replace("datasets/big/passages", "datasets/raw"))
    assert code == 0 and queued and "index settings checked when the stage starts" in err
