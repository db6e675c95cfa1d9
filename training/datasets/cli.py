"""``ragpool data import``, ``ragpool data status`` and ``ragpool export``: datasets in and out of the shared storage.

    ragpool data import s3://BUCKET/PREFIX datasets/NAME [--local | --print] [--image IMAGE] [--namespace NS]
    ragpool data status NAME [--json]
    ragpool data prepare datasets/NAME/CORPUS_DIR [--json]
    ragpool export RUN [s3://BUCKET/PREFIX] [--wait | --status]

The buckets an import may read come from ``RAGPOOL_DATA_BUCKETS`` and the export destination from
``RAGPOOL_DATA_EXPORT`` (the stack outputs ``dataBuckets`` and ``dataExport``); the shared storage from
``RAGPOOL_SHARED_ROOT``. ``data import`` runs the copy in this process with ``--local``, or when kubectl has no
current context; otherwise it creates the import Job in the training namespace (``--print`` prints it
instead): ``kubectl -n NS logs -f job/NAME`` follows it, ``ragpool data status NAME`` reads its progress
where the shared storage is mounted. ``export`` goes through the run API when a login context is active (the API
uploads a succeeded run of the caller's team from its shared storage: ``--wait`` follows it, ``--status`` reads
the latest), else runs here (the default destination: the declared one).

Exit codes: 0 done (or the Job created), 1 the copy or kubectl failed, 2 bad input (an undeclared bucket, a
prefix with no objects, a destination outside datasets/, an object changed while it was copied, a file
that failed verification: the message names it), 3 no such dataset or run (or nothing to export), 75 ``export
--wait`` stopped waiting (the export goes on).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from contract import exit_codes
from contract.datasets import dataset_dir, dataset_path, declared_buckets
from contract.messages import shown
from contract.paths import PathError, resolve_confined, shared_root_from_env

EXPORT_WAIT_S = 3600.0
"""The longest ``ragpool export --wait`` by default."""
EXPORT_POLL_S = 2.0
"""How often ``ragpool export --wait`` reads the export's progress."""


def register(subparsers) -> None:
    data = subparsers.add_parser("data", help="datasets on the shared storage: import from S3, status")
    sub = data.add_subparsers(dest="data_command", metavar="DATA_COMMAND", required=True)
    p = sub.add_parser("import", help="copy s3://BUCKET/PREFIX onto the shared storage as datasets/NAME")
    p.add_argument("source", help="s3://BUCKET/PREFIX (BUCKET one of the stack's dataBuckets)")
    p.add_argument("destination", help="datasets/NAME on the shared storage")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="copy in this process (RAGPOOL_SHARED_ROOT)")
    where.add_argument("--print", action="store_true", dest="print_job", help="print the import Job, apply nothing")
    p.add_argument("--image", help="the training image (stack output trainingImage); needed for the Job")
    p.add_argument("--namespace", help="training namespace of the Job (default: the main one, ragpool-training)")
    p.add_argument("--region", default=os.environ.get("AWS_REGION", ""), help="AWS region of the buckets")
    p.add_argument("--workers", type=int, default=8, help="objects fetched at once (default 8)")
    p.add_argument("--shared-root", help="the shared storage (default RAGPOOL_SHARED_ROOT)")
    p.set_defaults(handler=cmd_import)
    p = sub.add_parser("status", help="an imported dataset's state and progress")
    p.add_argument("name", help="NAME or datasets/NAME")
    p.add_argument("--json", action="store_true")
    p.add_argument("--shared-root", help="the shared storage (default RAGPOOL_SHARED_ROOT)")
    p.set_defaults(handler=cmd_status)
    p = sub.add_parser("prepare", help="validate a corpus directory of JSONL shards once and write its manifest, "
                                       "offsets and id table (training/components/corpus.py)")
    p.add_argument("corpus", help="datasets/NAME/... : a directory of *.jsonl shards on the shared storage")
    p.add_argument("--json", action="store_true")
    p.add_argument("--shared-root", help="the shared storage (default RAGPOOL_SHARED_ROOT)")
    p.set_defaults(handler=cmd_prepare)
    p = subparsers.add_parser("export", help="copy a run's models and index to S3 (below the stack's dataExport)")
    p.add_argument("run_id")
    p.add_argument("destination", nargs="?",
                   help="s3://BUCKET/PREFIX inside the stack's dataExport (default: the dataExport prefix itself)")
    p.add_argument("--wait", action="store_true", help="through the run API: wait for the export to end")
    p.add_argument("--status", action="store_true",
                   help="through the run API: show the run's latest export instead of starting one")
    p.add_argument("--timeout", type=float, default=EXPORT_WAIT_S, metavar="SECONDS",
                   help=f"longest --wait (default {EXPORT_WAIT_S:.0f}); past it exit 75, the export goes on")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--shared-root", help="the shared storage, copied from here (default RAGPOOL_SHARED_ROOT; "
                                         "without it and with a login context the run API exports)")
    p.set_defaults(handler=cmd_export)


def _error(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _has_cluster() -> bool:
    """kubectl on PATH with a current context."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return False
    done = subprocess.run([kubectl, "config", "current-context"], capture_output=True, text=True, timeout=30)
    return done.returncode == 0 and bool(done.stdout.strip())


def cmd_import(args: argparse.Namespace) -> int:
    from training.datasets.s3sync import check_source, run_import
    from training.datasets.transfer import TransferError

    try:  # the same checks as the Job's, before anything is created
        check_source(args.source, declared_buckets())
        dataset_path(args.destination)
    except TransferError as exc:
        return _error(str(exc), exc.code)
    except PathError as exc:
        return _error(f"destination {shown(args.destination)} {exc}", exit_codes.BAD_INPUT)
    except ValueError as exc:
        return _error(str(exc), exit_codes.BAD_INPUT)
    if args.workers < 1 or args.workers > 64:
        return _error(f"--workers {args.workers}: must be from 1 to 64", exit_codes.BAD_INPUT)
    if args.local or (not args.print_job and not _has_cluster()):
        if not args.local:
            print("no cluster (kubectl has no current context): importing in this process", file=sys.stderr)
        try:
            result = run_import(args.source, args.destination, shared_root=args.shared_root, workers=args.workers)
        except TransferError as exc:
            return _error(str(exc), exc.code)
        print(json.dumps({"dataset": result.dataset, "objects": result.objects, "bytes": result.bytes,
                          "fetched": len(result.fetched), "skipped": result.skipped, "ready": result.ready,
                          "seconds": round(result.seconds, 2)}))
        return exit_codes.OK
    if not args.image:
        return _error("--image is required to build the import Job (the stack output trainingImage)",
                      exit_codes.BAD_INPUT)
    if not args.region:
        return _error("--region (or AWS_REGION) is required to build the import Job: the buckets' region",
                      exit_codes.BAD_INPUT)
    from infra.data_access import import_job, import_job_name  # Pulumi: only the cluster path needs it
    from infra.peers import TRAINING_NAMESPACE

    namespace = args.namespace or TRAINING_NAMESPACE
    job = import_job(args.source, args.destination, namespace=namespace, image=args.image,
                     buckets=declared_buckets(), region=args.region, workers=args.workers,
                     name=import_job_name(args.source, args.destination, time.strftime("%m%d%H%M%S")))
    if args.print_job:
        print(json.dumps(job, indent=2))
        return exit_codes.OK
    done = subprocess.run(["kubectl", "create", "-f", "-"], input=json.dumps(job), text=True)
    if done.returncode != 0:
        return _error(f"kubectl create of Job {job['metadata']['name']} failed (exit {done.returncode})",
                      exit_codes.FAILED)
    print(f"import Job {job['metadata']['name']} created; follow it with: "
          f"kubectl -n {namespace} logs -f job/{job['metadata']['name']}")
    return exit_codes.OK


def cmd_status(args: argparse.Namespace) -> int:
    from training.datasets.s3sync import read_status

    try:
        path = dataset_dir(args.shared_root or shared_root_from_env(), args.name)
    except PathError as exc:
        return _error(f"dataset {shown(args.name)} {exc}", exit_codes.BAD_INPUT)
    status = read_status(path)
    if status is None:
        return _error(f"dataset {shown(args.name)} has no import at {path}", exit_codes.NOT_FOUND)
    if args.json:
        print(json.dumps(status, sort_keys=True))
    else:
        eta = status.get("eta_seconds")
        print(f"{path.name}: {status['state']}  {status.get('objects_done', 0)}/{status.get('objects_total', '?')} objects  "
              f"{status.get('bytes_done', 0) / 2**20:.1f}/{status.get('bytes_total', 0) / 2**20:.1f} MiB"
              + (f"  ETA {eta:.0f}s" if status["state"] == "copying" and eta is not None else ""))
        for failure in status.get("failures", []):
            print(f"  failed: {failure}")
    return exit_codes.OK if status["state"] != "failed" else exit_codes.FAILED


def cmd_export(args: argparse.Namespace) -> int:
    """Through the run API when a login context is active (and no ``--shared-root``): the API uploads from the
    shared storage it mounts; else here, from the shared storage mounted here."""
    from contract.datasets import DATA_EXPORT_ENV, declared_export
    from training.datasets.export import export_run
    from training.datasets.transfer import TransferError

    if args.timeout <= 0:
        return _error(f"--timeout {args.timeout:g}: must be more than 0 seconds", exit_codes.BAD_INPUT)
    if not args.shared_root:
        from training.scheduler.cli_route import remote_client

        client, code = remote_client("export")
        if code is not None:
            return code
        if client is not None:
            return _remote_export(client, args)
    if args.wait or args.status:
        return _error("--wait and --status follow an export of the run API (ragpool login); here the export runs "
                      "in this process and ends with the command", exit_codes.BAD_INPUT)
    destination = args.destination
    try:
        if destination is None:
            declared = declared_export()
            if declared is None:
                return _error(f"no destination given and none declared ({DATA_EXPORT_ENV} is unset): name "
                              "s3://BUCKET/PREFIX, or set the stack output dataExport", exit_codes.BAD_INPUT)
            destination = declared.url
        result = export_run(args.run_id, destination, shared_root=args.shared_root, workers=args.workers)
    except TransferError as exc:
        return _error(str(exc), exc.code)
    except ValueError as exc:  # a malformed RAGPOOL_DATA_EXPORT
        return _error(str(exc), exit_codes.BAD_INPUT)
    print(json.dumps({"destination": result.destination, "files": result.files, "bytes": result.bytes,
                      "seconds": round(result.seconds, 2)}))
    return exit_codes.OK



def _remote_export(client, args: argparse.Namespace) -> int:
    """Start the export through the run API (``--status``: read the latest), then with ``--wait`` poll it until
    it ends or ``--timeout`` passes (exit 75: it goes on; the same command waits again)."""
    from training.api.exports import FAILED, LIVE

    outcome = client.export_status(args.run_id) if args.status else client.export(args.run_id, args.destination)
    if not outcome.ok:
        return _error(outcome.message, outcome.code)
    print(outcome.message, file=sys.stderr)
    deadline = time.monotonic() + args.timeout
    record = outcome.data
    shown_at = ""
    while args.wait and record.get("state") in LIVE:
        line = (f"export {args.run_id}: {record.get('state')} {record.get('objects_done', 0)}/"
                f"{record.get('objects_total', 0)} objects, {record.get('bytes_done', 0) / 2**20:.1f}/"
                f"{record.get('bytes_total', 0) / 2**20:.1f} MiB")
        if line != shown_at:
            print(line, file=sys.stderr)
            shown_at = line
        if time.monotonic() >= deadline:
            return _error(f"stopped waiting for the export of run {args.run_id} to {record.get('destination')} "
                          f"after {args.timeout:g}s; it is {record.get('state')} and goes on (exit "
                          f"{exit_codes.RETRIABLE}: wait again with ragpool export {args.run_id} --status --wait)",
                          exit_codes.RETRIABLE)
        time.sleep(min(EXPORT_POLL_S, max(0.0, deadline - time.monotonic())))
        outcome = client.export_status(args.run_id)
        if not outcome.ok:
            return _error(outcome.message, outcome.code)
        record = outcome.data
    print(json.dumps(record, sort_keys=True))
    if record.get("state") == FAILED:
        return _error(f"the export of run {args.run_id} failed: {record.get('error')}", exit_codes.FAILED)
    return exit_codes.OK


def cmd_prepare(args: argparse.Namespace) -> int:
    """Prepare a corpus in place (``<dir>/_corpus/``): every record validated, ids unique across shards;
    nothing is marked ready on an error (exit 2, each bad record named by shard and line)."""
    from training.components.corpus import PREPARED_DIR, prepare
    from training.components.data import DataError

    root = args.shared_root or shared_root_from_env()
    try:
        source = resolve_confined(root, dataset_path(args.corpus))
    except PathError as err:
        return _error(f"corpus={shown(args.corpus)}: {err}", exit_codes.BAD_INPUT)
    if not source.is_dir():
        if source.is_file():
            return _error(f"corpus={shown(args.corpus)}: a single JSONL file needs no preparation (a run prepares "
                          "it into its own directory); prepare a directory of shards", exit_codes.BAD_INPUT)
        return _error(f"corpus={shown(args.corpus)}: no such directory under {root}", exit_codes.NOT_FOUND)
    t0 = time.monotonic()
    try:
        corpus = prepare(source, source / PREPARED_DIR)
    except DataError as err:
        return _error(str(err), exit_codes.BAD_INPUT)
    summary = {"corpus": args.corpus, "passages": corpus.rows, "shards": len(corpus.shards),
               "bytes": sum(s.bytes for s in corpus.shards), "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps(summary) if args.json else
          f"prepared {args.corpus}: {summary['passages']} passages in {summary['shards']} shard(s), "
          f"{summary['bytes'] / 2**20:.1f} MiB, {summary['seconds']}s; name it as data.corpus in a run spec")
    return exit_codes.OK
