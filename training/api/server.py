"""The run API: what ``ragpool`` does against Redis, over HTTP, as the caller's IAM identity.

    python -m training.api.server [--host 0.0.0.0] [--port 8080]

Environment: the queue's Redis as every client reads it (training/scheduler/redis_conn.py: ``REDIS_URL``,
``REDIS_PASSWORD_FILE``, ``REDIS_REQUIRED_REPLICAS``...), ``RAGPOOL_QUEUE_NAMESPACE``, the shared root
(``RAGPOOL_SHARED_ROOT``, read-only: submit checks what the pool sees, ``logs`` reads the run directory), the
stack's facts (``RAGPOOL_POOLS``, ``RAGPOOL_SERVED_LANES``, ``RAGPOOL_POOL_GPUS``, ``RAGPOOL_RAY_POOLS``:
submit's fit check and ``/v1/facts``), and identity: ``RAGPOOL_API_CLUSTER_ID``, ``RAGPOOL_API_STS_ENDPOINT``,
``RAGPOOL_API_TEAMS_FILE``, and ``RAGPOOL_API_TEAM_QUEUES`` (each trainingTeams team's queue key namespace and facts,
contract/api.py ``TeamQueue``, with its shared root) (contract/env.py; read by training/api/settings.py). A missing
or bad one: exit 2 naming it.

Per-team queues: every verb acts on the caller's team's queue (a trainingTeams team's own key prefix, which its
workers read; otherwise the main one), a submit checked against that namespace's facts and files, ``logs``,
``report`` and ``tune`` results read from its shared root (and ``export`` uploads from it: training/api/export_routes.py
and exports.py, below the stack's ``RAGPOOL_DATA_EXPORT``), Kueue asked in its namespace; an admin names a team with
``?team=`` (submit: ``"team"``), a member may name only its own, a team that does not exist is bad input.

Every route but ``/openapi.json``, ``/healthz``, ``/readyz`` and ``/v1/info`` needs ``Authorization: Bearer
<token>`` or ``X-Ragpool-Token: <token>`` (through the API server's service proxy; training/api/identity.py). A caller acts on its team's runs only (``apiTeams``: IAM ARN patterns
per team); an admin on every run. Runs record their owner and team; submit, tune, cancel and retry are audited
(training/api/audit.py). Each verb is training/scheduler/verbs.py, the CLI's own. Answers are JSON:
``{"message", "data"}``, or ``{"error": {"code", "message", "key"?}}`` with the status of
``contract.api.ERROR_STATUS`` (training/api/answers.py). Bounded: request line and headers (training/api/connections.py
``HEADER_TIMEOUT_S``), bodies (``MAX_BODY_BYTES``, read within ``BODY_TIMEOUT_S``), each verb's time
(``VERB_TIMEOUT_S``), Redis commands (``REDIS_TIMEOUT_S``), STS calls (identity.STS_TIMEOUT_S).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from contract import exit_codes
from contract.api import API_VERSION, ERROR_STATUS, MAX_BODY_BYTES, TEAM_QUERY, TOKEN_HEADER, TeamsError, fact_keys
from contract.env import NAMESPACE_ENV
from contract.lanes import POOLS_ENV, SERVED_LANES_ENV
from contract.messages import shown
from contract.paths import is_valid_run_id
from contract.pool_gpus import POOL_GPUS_ENV
from contract.ports import RUN_API_PORT
from contract.ray_pools import POOLS_ENV as RAY_POOLS_ENV
from training.api.answers import VERB_TIMEOUT_S, ApiError, answer_of, errors, int_query, json_body, log
from training.api.export_routes import ExportRoutes
from training.api.exports import Exporter
from training.api.identity import Identity, StsUnavailable, TokenError, Verifier
from training.api.settings import ApiConfigError, ApiSettings, settings_from_env
from training.scheduler import verbs

REDIS_TIMEOUT_S = 5.0
"""The socket timeout of the API's Redis commands."""
WORKER_THREADS = 32
"""Threads that run the (blocking) verbs and STS calls."""


@dataclass(frozen=True)
class Caller:
    identity: Identity
    team: str | None
    admin: bool

    @property
    def arn(self) -> str:
        return self.identity.arn

    def teams(self) -> list[str] | None:
        """The teams whose runs it may see (None: all)."""
        return None if self.admin else [self.team or ""]


@dataclass(frozen=True)
class Route:
    """The queue one request acts on: the caller's team's (an admin: the ``team`` it names, else the main one)."""

    team: str | None
    queue: Any
    environ: Mapping[str, str] | None
    """The namespace's facts as fit.py and spec.py read them (None: this process's environment, the main one)."""
    main: bool
    root: str = ""
    """The shared root the team's runs write to, as this API mounts it (read-only): the main one, or a
    trainingTeams team's own (``TeamQueue.shared_root``)."""
    namespace: str = ""
    """A trainingTeams team's Kubernetes namespace, where its lanes' Jobs run ('' for the main queue: the API's
    own)."""


class RunApi(ExportRoutes):
    """The application: routes, the queue, the verifier, the audit trail."""

    def __init__(self, settings: ApiSettings, queue, *, verifier: Verifier | None = None, audit_stream=None,
                 kube=None):
        from training.api.audit import Audit

        self.settings, self.queue = settings, queue
        self.queues = {team: type(queue)(queue.client, namespace=tq.queue_namespace,
                                         required_replicas=queue.required_replicas,
                                         replica_wait_ms=queue.replica_wait_ms)
                       for team, tq in settings.team_queues.items()}
        """One queue per trainingTeams team, on the main queue's Redis client: the key prefix its workers read."""
        self.kube = kube
        """Where ``status`` asks Kueue about a queued run's lane (a ``quota_wait.KubeTarget``; :func:`open_api` finds
        the pod's); None: not asked."""
        self.verifier = verifier or Verifier(settings.cluster_id, settings.sts_endpoint)
        self.audit = Audit(queue, audit_stream)
        self.pool = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="ragpool-api")
        self.exporter = Exporter()
        """``ragpool export``'s uploads (training/api/exports.py), in their own threads."""

    def app(self) -> web.Application:
        from training.api.openapi import openapi

        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[errors])
        v = f"/{API_VERSION}"
        spec = openapi()

        async def openapi_json(_request: web.Request) -> web.Response:
            return web.json_response(spec)

        async def healthz(_request: web.Request) -> web.Response:
            return web.json_response({"message": "ok", "data": {}})

        app.router.add_get("/openapi.json", openapi_json)
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get(f"{v}/info", self.info)
        app.router.add_get(f"{v}/whoami", self.whoami)
        app.router.add_get(f"{v}/facts", self.facts)
        app.router.add_get(f"{v}/queue", self.overview)
        app.router.add_get(f"{v}/audit", self.audit_events)
        app.router.add_get(f"{v}/runs", self.list_runs)
        app.router.add_post(f"{v}/runs", self.submit)
        app.router.add_get(f"{v}/runs/{{run_id}}", self.status)
        app.router.add_get(f"{v}/runs/{{run_id}}/spec", self.show)
        app.router.add_get(f"{v}/runs/{{run_id}}/logs", self.logs)
        app.router.add_post(f"{v}/runs/{{run_id}}/cancel", self.cancel)
        app.router.add_post(f"{v}/runs/{{run_id}}/retry", self.retry)
        app.router.add_get(f"{v}/runs/{{run_id}}/report", self.report)
        app.router.add_get(f"{v}/runs/{{run_id}}/tune", self.tune_results)
        app.router.add_post(f"{v}/runs/{{run_id}}/export", self.export)
        app.router.add_get(f"{v}/runs/{{run_id}}/export", self.export_status)
        app.router.add_post(f"{v}/tune", self.tune)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, _app) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.exporter.close()

    async def _run(self, fn, *args):
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self.pool, fn, *args), VERB_TIMEOUT_S)

    # -- identity ---------------------------------------------------------------------------

    async def caller(self, request: web.Request, what: str) -> Caller:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if request.headers.get(TOKEN_HEADER):  # through the API server's proxy (it strips Authorization)
            scheme, token = "bearer", request.headers[TOKEN_HEADER]
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError("unauthenticated", "no token: send Authorization: Bearer <token> (ragpool login, then "
                                              "any ragpool command, signs one with your AWS credentials)")
        try:
            identity = await self._run(self.verifier.verify, token.strip())
        except TokenError as exc:
            await self._audit(request, None, what, "", 401, "unauthenticated", exc.reason)
            raise ApiError("unauthenticated", f"token refused: {exc.reason}; sign in again with the AWS "
                                              "credentials of this cluster's account (aws sso login), then retry")
        except StsUnavailable as exc:
            raise ApiError("unavailable", f"cannot verify the token now: {exc}") from None
        arns = (identity.arn, identity.canonical_arn)
        caller = Caller(identity, self.settings.teams.team_of(*arns), self.settings.teams.is_admin(*arns))
        if caller.team is None and not caller.admin:
            await self._audit(request, caller, what, "", 403, "forbidden", "no team")
            raise ApiError("forbidden", f"{identity.arn} belongs to no team of this pool (the stack's apiTeams); "
                                        "ask the pool's admins to add your role")
        return caller

    async def _audit(self, request, caller: Caller | None, what: str, run_id: str, status: int, result: str,
                     detail: str = "") -> None:
        try:
            await self._run(lambda: self.audit.record(
                who=caller.arn if caller else "-", team=(caller.team or ("admin" if caller.admin else "")) if caller
                else "", what=what, run_id=run_id, status=status, result=result,
                request_id=request.get("request_id", ""), detail=detail))
        except Exception:  # never lose the answer over the trail; Audit.record already keeps the line
            log.exception("audit event of %s %s not written", what, run_id)

    def route(self, caller: Caller, named: object = None) -> Route:
        """The queue of ``caller``'s team, or of the team it names (``team``: admins, or a member naming its own);
        a team that does not exist is bad input naming it, another team's forbidden."""
        known = set(self.settings.teams.teams) | set(self.settings.team_queues)
        if named is not None:
            if not isinstance(named, str) or named not in known:
                raise ApiError("bad_input", f"{TEAM_QUERY}: team {shown(named)} does not exist; teams: "
                                            f"{', '.join(sorted(known)) or '(none)'}", TEAM_QUERY)
            if not caller.admin and named != caller.team:
                raise ApiError("forbidden", f"{TEAM_QUERY}: only an admin names another team; you ({caller.arn}) "
                                            f"act on team {caller.team!r}'s runs only", TEAM_QUERY)
        team = named if named is not None else caller.team
        tq = self.settings.team_queues.get(team or "")
        if tq is None:
            return Route(team, self.queue, None, True, self.settings.shared_root)
        env = {k: v for k, v in os.environ.items() if k not in fact_keys()}
        env.update(tq.facts)
        env[NAMESPACE_ENV] = tq.queue_namespace
        return Route(team, self.queues[tq.team], env, False, tq.shared_root or self.settings.shared_root,
                     tq.namespace)

    def _route_of(self, request: web.Request, caller: Caller) -> Route:
        return self.route(caller, request.query.get(TEAM_QUERY))

    async def _run_of(self, request: web.Request, caller: Caller, route: Route | None = None):
        """The run of the path in the caller's team's queue, when the caller may act on it (404 unknown, 403 another
        team's)."""
        route = route or self._route_of(request, caller)
        run_id = request.match_info["run_id"]
        if not is_valid_run_id(run_id):
            raise ApiError("bad_input", f"run_id: {shown(run_id)} is not a run id", "run_id")
        info = await self._run(route.queue.get, run_id)
        if info is None:
            raise ApiError("not_found", f"no run {shown(run_id)}")
        if not caller.admin and info.team != caller.team:
            raise ApiError("forbidden", f"run {run_id} belongs to team {info.team or '(none)'!r}; you ({caller.arn}) "
                                        f"act on team {caller.team!r}'s runs only")
        return run_id, info

    # -- routes -------------------------------------------------------------------------------

    async def readyz(self, request: web.Request) -> web.Response:
        try:
            await self._run(self.queue.client.ping)
        except Exception as exc:
            raise ApiError("unavailable", f"the queue is unavailable ({type(exc).__name__})") from None
        return web.json_response({"message": "ready", "data": {}})

    async def info(self, request: web.Request) -> web.Response:
        """What ``ragpool login`` stores: where tokens are signed for (no secret, no auth)."""
        s = self.settings
        return web.json_response({"message": "", "data": {"cluster_id": s.cluster_id, "sts_endpoint": s.sts_endpoint,
                                                          "region": s.region, "api_version": API_VERSION}})

    async def whoami(self, request: web.Request) -> web.Response:
        caller = await self.caller(request, "whoami")
        return web.json_response({"message": f"{caller.arn} (team {caller.team or '-'}{', admin' if caller.admin else ''})",
                                  "data": {"arn": caller.arn, "canonical_arn": caller.identity.canonical_arn,
                                           "account": caller.identity.account, "team": caller.team,
                                           "admin": caller.admin}})

    async def facts(self, request: web.Request) -> web.Response:
        """The stack's facts submit checks against (from the Deployment's environment, never from the user)."""
        route = self._route_of(request, await self.caller(request, "facts"))
        env = os.environ if route.environ is None else route.environ
        data = {"pools": env.get(POOLS_ENV), "served_lanes": env.get(SERVED_LANES_ENV),
                "pool_gpus": env.get(POOL_GPUS_ENV), "ray_pools": env.get(RAY_POOLS_ENV),
                "required_replicas": route.queue.required_replicas, "queue_namespace": route.queue.prefix[:-1],
                "team": route.team, "teams": sorted(set(self.settings.teams.teams) | set(self.settings.team_queues))}
        return web.json_response({"message": "", "data": data})

    async def audit_events(self, request: web.Request) -> web.Response:
        """The newest audit events (``count``, default 100, at most 1000), newest first: admins only."""
        caller = await self.caller(request, "audit")
        if not caller.admin:
            raise ApiError("forbidden", f"the audit trail is the admins' ({caller.arn} is not one)")
        count = int_query(request, "count", 100)
        if not 1 <= count <= 1000:
            raise ApiError("bad_input", "count: 1 to 1000", "count")
        return web.json_response({"message": "", "data": await self._run(self.audit.events, count)})

    async def overview(self, request: web.Request) -> web.Response:
        caller = await self.caller(request, "status")
        route = self._route_of(request, caller)
        return answer_of(await self._run(lambda: verbs.overview(route.queue, teams=caller.teams())))

    async def list_runs(self, request: web.Request) -> web.Response:
        caller = await self.caller(request, "list")
        states = request.query.getall("state", []) or None
        limit = int_query(request, "limit", 50)
        route = self._route_of(request, caller)
        return answer_of(await self._run(lambda: verbs.list_runs(route.queue, states=states, limit=limit,
                                                                     teams=caller.teams())))

    async def status(self, request: web.Request) -> web.Response:
        caller = await self.caller(request, "status")
        route = self._route_of(request, caller)
        run_id, _info = await self._run_of(request, caller, route)
        # Kueue is asked in the namespace whose workers serve the run's queue (the API's, or the team's)
        kube = self.kube if self.kube is None or route.main else self.kube.in_namespace(route.namespace)
        return answer_of(await self._run(lambda: verbs.status(route.queue, run_id, shared_root=route.root,
                                                                  kube=kube)))

    async def show(self, request: web.Request) -> web.Response:
        caller = await self.caller(request, "show")
        route = self._route_of(request, caller)
        run_id, _info = await self._run_of(request, caller, route)
        return answer_of(await self._run(verbs.show, route.queue, run_id))

    async def logs(self, request: web.Request) -> web.Response:
        caller = await self.caller(request, "logs")
        route = self._route_of(request, caller)
        run_id, _info = await self._run_of(request, caller, route)
        offset, limit = int_query(request, "offset", 0), int_query(request, "limit", 1000)
        rank = int_query(request, "rank", None)
        stage = request.query.get("stage") or None
        return answer_of(await self._run(lambda: verbs.logs(route.root, run_id, offset=offset,
                                                                limit=limit, stage=stage, rank=rank)))

    async def _change(self, request: web.Request, what: str, verb) -> web.Response:
        caller = await self.caller(request, what)
        try:
            route = self._route_of(request, caller)
            run_id, _info = await self._run_of(request, caller, route)
        except ApiError as exc:
            await self._audit(request, caller, what, request.match_info["run_id"][:63], ERROR_STATUS[exc.code],
                              exc.code, exc.message)
            raise
        outcome = await self._run(verb, route.queue, run_id)
        answer = answer_of(outcome)
        await self._audit(request, caller, what, run_id, answer.status, outcome.error or "ok", outcome.message)
        return answer

    async def cancel(self, request: web.Request) -> web.Response:
        return await self._change(request, "cancel", verbs.cancel)

    async def retry(self, request: web.Request) -> web.Response:
        return await self._change(request, "retry", verbs.retry)

    async def report(self, request: web.Request) -> web.Response:
        """``ragpool report``: the run's report page (training/reports/report.py, its plots embedded), built from
        the shared root without writing to it; the CLI saves it where the user asks."""
        from training.reports.report import REPORT_HTML, ReportError, build

        caller = await self.caller(request, "report")
        route = self._route_of(request, caller)
        run_id, _info = await self._run_of(request, caller, route)
        try:
            page, _pngs = await self._run(build, route.root, run_id)
        except ReportError as exc:
            raise ApiError("not_found", str(exc)) from None
        return web.json_response({"message": f"report of {run_id}",
                                  "data": {"run_id": run_id, "filename": REPORT_HTML, "html": page}})

    async def tune_results(self, request: web.Request) -> web.Response:
        """``ragpool tune --results``: the table, trials and files of the run's finished Tune search."""
        from training.ray.tune import results

        caller = await self.caller(request, "tune")
        route = self._route_of(request, caller)
        run_id, info = await self._run_of(request, caller, route)
        found = await self._run(results, route.root, run_id)
        if found is None:
            raise ApiError("not_found", f"run {run_id} ({info.state}) has no Tune results yet (runs/{run_id}/tune/"
                                        "trials.json); ragpool logs -f follows its search")
        return web.json_response({"message": "", "data": found})

    async def tune(self, request: web.Request) -> web.Response:
        """``ragpool tune``: submit (as :meth:`submit`, audited as ``tune``) an ``executor: ray`` spec whose Ray
        job runs the search (``ray.tune.search``: ``only``; ``then_run`` with ``"start": true``)."""
        return await self.submit(request, what="tune")

    async def submit(self, request: web.Request, what: str = "submit") -> web.Response:
        caller = await self.caller(request, what)
        body = await json_body(request)
        text, source, team = body.get("spec"), body.get("source", "run spec"), body.get("team")
        if not isinstance(text, str):
            raise ApiError("bad_input", "spec: must be the run spec's text (YAML or JSON) as a string", "spec")
        if not isinstance(source, str) or len(source) > 256:
            raise ApiError("bad_input", "source: must be a file name of at most 256 characters", "source")
        route = self.route(caller, team)
        start = body.get("start", False)
        if what == "tune" and not isinstance(start, bool):
            raise ApiError("bad_input", "start: must be true or false", "start")
        search = ("then_run" if start else "only") if what == "tune" else None
        outcome, run_id = await self._run(self._submit, caller, text, source, route, search)
        answer = answer_of(outcome, created=bool(outcome.ok and outcome.data.get("created")))
        await self._audit(request, caller, what, run_id, answer.status, outcome.error or "ok", outcome.message)
        return answer

    def _submit(self, caller: Caller, text: str, source: str, route: Route,
                search: str | None = None) -> tuple[verbs.Outcome, str]:
        from training.scheduler.fit import fit_problems
        from training.scheduler.spec import SpecError
        from training.scheduler.spec_file import parse_spec_text

        root = route.root
        try:
            spec = parse_spec_text(text, source=source, shared_root=root, environ=route.environ)
            if search is not None:
                spec = _tuning(spec, search, source, root, route.environ)
            problems, notes = fit_problems(spec, root, route.environ)
            if problems:
                raise SpecError(problems, source)
        except SpecError as exc:
            key = exc.problems[0][0] if exc.problems else None
            return verbs.Outcome(exit_codes.BAD_INPUT, str(exc), {"key": key, "problems": exc.problems},
                                 "bad_input"), ""
        existing = route.queue.get(spec.run_id)
        team = route.team or (existing.team if existing is not None and caller.admin else None)
        if not team:
            return verbs.Outcome(exit_codes.BAD_INPUT, "team: an admin without a team of its own names the run's "
                                                       "team", {"key": "team"}, "bad_input"), spec.run_id
        if existing is not None and not caller.admin and existing.team != team:
            return verbs.Outcome(exit_codes.REFUSED, f"run id {spec.run_id!r} is taken by another team; choose a new "
                                                     "run_id", {"run_id": spec.run_id}, "forbidden"), spec.run_id
        outcome = verbs.submit(route.queue, spec, owner=caller.arn, team=team)
        if not outcome.data.get("created") and outcome.data.get("team") != team and not caller.admin:
            # another team's submission of the same new id won the race between the check above and the script
            return verbs.Outcome(exit_codes.REFUSED, f"run id {spec.run_id!r} is taken by another team; choose a new "
                                                     "run_id", {"run_id": spec.run_id}, "forbidden"), spec.run_id
        if isinstance(outcome.data, dict):
            outcome.data["notes"] = notes
        return outcome, spec.run_id


def _tuning(spec, search: str, source: str, root: str, environ: Mapping[str, str] | None = None):
    """``spec`` with ``hyperparameters.run`` ``ray.tune.search`` set to ``search`` (validated again, the search
    space checked as ``ragpool tune`` does); SpecError naming the key."""
    from training.config.run import load_run_config
    from training.config.sections import ConfigError
    from training.ray.tune import check_space
    from training.scheduler.spec import RUN_SECTION, SpecError, parse_spec

    if spec.executor != "ray":
        raise SpecError([("executor", "must be ray for ragpool tune: the search runs on the namespace's Ray "
                                      "cluster (executor: ray)")], source)
    payload = spec.to_payload()
    payload["hyperparameters"][RUN_SECTION] = {**payload["hyperparameters"].get(RUN_SECTION, {}),
                                               "ray.tune.search": search}
    tuned = parse_spec(payload, source=source, shared_root=root, environ=environ)
    try:
        check_space(load_run_config(tuned.to_training_config(root)))
    except ConfigError as exc:
        raise SpecError([(getattr(exc, "key", None) or "ray.tune", str(exc))], source) from None
    return tuned


def open_api(settings: ApiSettings | None = None, **kwargs) -> RunApi:
    """The API on the environment's queue (its Redis commands bounded by :data:`REDIS_TIMEOUT_S`), and in its pod
    the Kubernetes API with the pod's service account (``quota_wait.in_cluster``; None elsewhere)."""
    from training.scheduler.quota_wait import in_cluster
    from training.scheduler.redis_conn import settings_from_env as redis_settings
    from training.scheduler.run_queue import namespace_from_env, open_queue

    redis = dataclasses.replace(redis_settings(), socket_timeout_s=REDIS_TIMEOUT_S, retries=2)
    kwargs.setdefault("kube", in_cluster())
    return RunApi(settings or settings_from_env(), open_queue(redis, namespace=namespace_from_env()), **kwargs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.api.server", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=RUN_API_PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from training.scheduler.redis_conn import RedisConfigError

    try:
        api = open_api()
    except (ApiConfigError, RedisConfigError, TeamsError) as exc:
        print(f"ragpool api: {exc}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    from training.api.connections import serve

    serve(api.app(), args.host, args.port)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())

