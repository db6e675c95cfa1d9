"""``ragpool export``'s routes in the run API: start a succeeded run's export to S3, and read its progress.

:class:`ExportRoutes` is a base of training/api/server.py's ``RunApi`` (whose ``app`` routes ``POST`` and ``GET
/v1/runs/{run_id}/export`` to these methods): they check the caller, the run and the destination with its helpers,
then hand the upload to its ``Exporter`` (training/api/exports.py), which runs it in the background.
"""

from __future__ import annotations

from aiohttp import web

from contract.api import API_VERSION, ERROR_STATUS
from contract.messages import shown
from training.api.answers import ApiError, json_body


class ExportRoutes:
    """The export routes of ``RunApi``, which provides ``caller``, ``_route_of``, ``_run_of``, ``_run``, ``_audit``,
    ``settings`` and ``exporter``."""

    async def export(self, request: web.Request) -> web.Response:
        """``ragpool export RUN [s3://BUCKET/PREFIX]``: upload a succeeded run's models and index from its team's
        shared root to ``destination`` (body; default: the stack's declared export prefix), below which they land
        as ``RUN/...``, manifest last (training/api/exports.py): 202 with the record and its status URL; the live
        export of the run, if one is running to the same place (200; elsewhere: 409). Audited."""
        caller = await self.caller(request, "export")
        try:
            route = self._route_of(request, caller)
            run_id, info = await self._run_of(request, caller, route)
            prefix = await self._export_checks(request, run_id, info, route)
            record, started = await self._run(lambda: self.exporter.start(
                route.queue, run_id, prefix, root=route.root, export_url=self.settings.data_export, who=caller.arn))
            if not started and record["destination"] != f"{prefix}{run_id}/":
                raise ApiError("refused", f"run {run_id} is being exported to {record['destination']} "
                                          f"({record['state']}); wait for it (ragpool export {run_id} --status "
                                          "--wait), then export again")
        except ApiError as exc:
            await self._audit(request, caller, "export", request.match_info["run_id"][:63], ERROR_STATUS[exc.code],
                              exc.code, exc.message)
            raise
        url = f"/{API_VERSION}/runs/{run_id}/export"
        data = {**record, "status_url": url}
        message = (f"exporting run {run_id} to {record['destination']}" if started else
                   f"run {run_id} is already being exported to {record['destination']} ({record['state']})")
        status = 202 if started else 200
        await self._audit(request, caller, "export", run_id, status, "ok", message)
        return web.json_response({"message": f"{message}; follow it: ragpool export {run_id} --status --wait",
                                  "data": data}, status=status, headers={"Location": url})

    async def _export_checks(self, request: web.Request, run_id: str, info, route) -> str:
        """The export prefix ``s3://B/P/`` of the request (bad input naming ``destination``), once the run has
        succeeded (409) and has something to export (404)."""
        from contract.datasets import DATA_EXPORT_ENV, parse_s3_url
        from contract.paths import run_dir
        from training.datasets.export import EXPORTED_PARTS
        from training.scheduler.queue_records import State

        body = await json_body(request) if request.body_exists else {}
        allowed = self.settings.data_export
        if not allowed:
            raise ApiError("bad_input", f"destination: this stack declares no export destination (the run API's "
                                        f"{DATA_EXPORT_ENV} is unset): its admins set ragpool:dataExport",
                           "destination")
        wanted = allowed if body.get("destination") is None else body["destination"]
        try:
            dest = parse_s3_url(wanted, need_prefix=True)
        except ValueError as exc:
            raise ApiError("bad_input", f"destination: {shown(wanted)} {exc}", "destination") from None
        if not parse_s3_url(allowed).contains(dest):
            raise ApiError("bad_input", f"destination: {dest.url} is outside the stack's declared export "
                                        f"destination {allowed}; name a prefix inside it, or none (it)",
                           "destination")
        if info.state != State.SUCCEEDED:
            raise ApiError("refused", f"run {run_id} is {info.state}: only a succeeded run is exported (ragpool "
                                      f"submit --wait, ragpool status {run_id})")
        run = run_dir(route.root, run_id)
        if not await self._run(lambda: any((run / p).is_dir() for p in EXPORTED_PARTS)):
            raise ApiError("not_found", f"run {run_id} has nothing to export: none of {', '.join(EXPORTED_PARTS)} "
                                        "in its run directory")
        return dest.url

    async def export_status(self, request: web.Request) -> web.Response:
        """The run's latest export: state, objects and bytes done and in all, destination, error."""
        from training.api.exports import read

        caller = await self.caller(request, "export")
        route = self._route_of(request, caller)
        run_id, _info = await self._run_of(request, caller, route)
        record = await self._run(read, route.queue, run_id)
        if record is None:
            raise ApiError("not_found", f"run {run_id} has not been exported (or its export is older than a week): "
                                        f"ragpool export {run_id} starts one")
        return web.json_response({"message": f"export of {run_id} to {record.get('destination')}: "
                                             f"{record.get('state')}", "data": record})
