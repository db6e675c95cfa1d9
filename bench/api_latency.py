"""What the run API adds to a run command, on this machine (all servers local, started and stopped here).

    python bench/api_latency.py [--runs 200] [--clients 50] [--requests 20]

One fresh ``redis-server``, the local STS (training/localdev/sts_server.py: moto, verifying presigned URLs) and
the run API (training/api/server.py, aiohttp in a thread of this process), then:

- ``direct_submit_p50_ms`` / ``direct_submit_p99_ms``, ``direct_status_*``: the verbs on Redis
  (training/scheduler/verbs.py, what ``ragpool`` does with ``REDIS_URL`` set), ``--runs`` each;
- ``api_submit_*``, ``api_status_*``: the same verbs through the API with one client (its token signed once and
  reused, as one command or a ``--follow`` loop does; the first call, which signs it and has the API ask STS,
  is ``api_first_call_ms``; one submit before the clock starts warms the server's imports);
- ``added_p99_ms``: the larger of the submit and status p99 differences (goal <= 20);
- ``concurrent_clients``, ``concurrent_requests_per_s``, ``errors``: ``--clients`` threads, each its own
  client and token, each ``--requests`` status calls against the one server (goal: 0 errors).

The last line printed is one JSON object with these figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from contract.api import parse_api_teams  # noqa: E402
from training.api.client import ApiClient  # noqa: E402
from training.api.contexts import Context  # noqa: E402
from training.api.server import RunApi  # noqa: E402
from training.api.settings import ApiSettings  # noqa: E402
from training.localdev.redis_server import LocalRedisServer  # noqa: E402
from training.localdev.run_api import run_api_server  # noqa: E402
from training.localdev.sts_server import ACCOUNT, sts_server  # noqa: E402
from training.scheduler import verbs  # noqa: E402
from training.scheduler.run_queue import TaskQueue  # noqa: E402
from training.scheduler.spec import parse_spec  # noqa: E402

CLUSTER = "bench"
DATA = {name: f"datasets/synthetic/{name}.jsonl" for name in ("corpus", "qa_train", "qa_eval")}
"""The run's data (submit requires it and checks the files): the demo's synthetic set, written into the shared root."""
SPEC = "run_id: {run}\nstages: [retriever]\ndata: " + json.dumps(DATA).replace("{", "{{").replace("}", "}}") + "\n"


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


def _timed(fn, n: int) -> list[float]:
    out = []
    for i in range(n):
        started = time.perf_counter()
        outcome = fn(i)
        out.append(time.perf_counter() - started)
        if not outcome.ok:
            raise RuntimeError(f"call {i} failed: {outcome}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="submits and statuses per path")
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients")
    parser.add_argument("--requests", type=int, default=20, help="status calls per concurrent client")
    args = parser.parse_args(argv)
    result: dict = {}
    with tempfile.TemporaryDirectory() as tmp, sts_server() as sts:
        redis_server = LocalRedisServer(data_dir=Path(tmp) / "redis").start()
        try:
            user = sts.user("bench-user")
            teams = parse_api_teams({"teams": {"bench": [f"arn:aws:iam::{ACCOUNT}:user/bench-*"]}})
            from training.demo import synthetic

            synthetic.write(Path(tmp) / "shared" / "datasets" / "synthetic", seed=1, n_entities=12)
            settings = ApiSettings(CLUSTER, sts.endpoint, teams, str(Path(tmp) / "shared"), "us-west-2")
            queue = TaskQueue(redis_server.client(), namespace="bench")
            api = RunApi(settings, queue, audit_stream=open("/dev/null", "w"))
            with run_api_server(api) as endpoint:
                def client() -> ApiClient:
                    return ApiClient(Context(endpoint, CLUSTER, sts.endpoint, "us-west-2"),
                                     credentials=user.credentials())

                direct_submit = _timed(lambda i: verbs.submit(queue, parse_spec(
                    {"run_id": f"d-{i}", "stages": ["retriever"], "data": DATA}, shared_root=settings.shared_root)), args.runs)
                direct_status = _timed(lambda i: verbs.status(queue, f"d-{i}"), args.runs)
                one = client()
                started = time.perf_counter()
                first = one.whoami()
                result["api_first_call_ms"] = round((time.perf_counter() - started) * 1000, 3)
                assert first.ok, first
                assert one.submit(SPEC.format(run="warm-up")).ok  # the API's first submit imports the fit check
                api_submit = _timed(lambda i: one.submit(SPEC.format(run=f"a-{i}")), args.runs)
                api_status = _timed(lambda i: one.status(f"a-{i}"), args.runs)
                for name, samples in (("direct_submit", direct_submit), ("direct_status", direct_status),
                                      ("api_submit", api_submit), ("api_status", api_status)):
                    result[f"{name}_p50_ms"], result[f"{name}_p99_ms"] = _pct(samples, 0.5), _pct(samples, 0.99)
                result["added_p99_ms"] = round(max(result["api_submit_p99_ms"] - result["direct_submit_p99_ms"],
                                                   result["api_status_p99_ms"] - result["direct_status_p99_ms"]), 3)

                errors: list[str] = []
                done = [0]
                lock = threading.Lock()
                clients = [client() for _ in range(args.clients)]
                for c in clients:  # each signs its token (and the API asks STS) before the clock starts
                    c.token()

                def hammer(c: ApiClient, k: int) -> None:
                    for j in range(args.requests):
                        outcome = c.status(f"a-{(k * args.requests + j) % args.runs}")
                        with lock:
                            done[0] += 1
                            if not outcome.ok:
                                errors.append(outcome.message)

                threads = [threading.Thread(target=hammer, args=(c, k)) for k, c in enumerate(clients)]
                started = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(600)
                took = time.perf_counter() - started
                result.update(concurrent_clients=args.clients, concurrent_requests=done[0],
                              concurrent_requests_per_s=round(done[0] / took, 1), errors=len(errors),
                              median_direct_status_ms=round(statistics.median(direct_status) * 1000, 3))
                if errors:
                    result["first_error"] = errors[0][:200]
        finally:
            redis_server.stop()
    print(json.dumps(result))
    return 0 if not result.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
