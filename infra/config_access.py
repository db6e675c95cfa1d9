"""The access keys of the stack config: the data role's buckets (dataBuckets, dataExport) and the run API's teams.

:class:`DataConfig`; :func:`parse_access`, which validates dataBuckets and dataExport (bucket names, export prefix,
KMS key ARNs) and apiTeams (contract/api.py parses it); and :func:`check_team_routes`, which checks mainNamespaceTeams
and apiTeams against trainingTeams (infra/config.py calls both from parse).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any

from contract.api import ApiTeams, TeamsError, parse_api_teams
from contract.datasets import S3_URL_RULE, is_bucket_name, parse_s3_url
from infra.config_gpu import TeamConfig
from infra.config_reader import Reader, check
from infra.config_schema import PROJECT


@dataclass(frozen=True)
class DataBucket:
    """A bucket datasets may be imported from, and the KMS key of its SSE-KMS encryption ('' for none)."""

    name: str
    kms_key_arn: str = ""


@dataclass(frozen=True)
class DataConfig:
    """dataBuckets and dataExport: what the training namespaces' data role may read and write."""

    buckets: tuple[DataBucket, ...] = ()
    export_bucket: str = ""
    export_prefix: str = ""
    """Ends in '/'; '' when there is no export."""
    export_kms_key_arn: str = ""

    @property
    def enabled(self) -> bool:
        """Whether the stack declares a data role at all."""
        return bool(self.buckets or self.export_bucket)

    @property
    def export_url(self) -> str:
        """``s3://bucket/prefix/`` of the export destination, '' when there is none."""
        return f"s3://{self.export_bucket}/{self.export_prefix}" if self.export_bucket else ""


_KMS_KEY_ARN = re.compile(r"arn:aws(-cn|-us-gov)?:kms:[a-z]{2}(-gov)?-[a-z]+-\d:\d{12}:key/"
                          r"(mrk-[0-9a-f]{32}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_KMS_RULE = "must be a KMS key ARN: arn:aws:kms:<region>:<12-digit account>:key/<key id> (not an alias)"


def parse_access(r: Reader) -> dict[str, Any]:
    """dataBuckets, dataExport and apiTeams, as StackConfig's data and api_teams (apiTeams left out when invalid)."""
    return {**_parse_data(r), **_parse_api_teams(r)}


def _parse_data(r: Reader) -> dict[str, Any]:
    """dataBuckets and dataExport."""
    buckets_raw, export_raw = r.get("dataBuckets"), r.get("dataExport")
    buckets: list[DataBucket] = []
    if not isinstance(buckets_raw, list):
        r.problem("dataBuckets", buckets_raw, "must be a list of {bucket, kmsKeyArn?} objects, e.g. [{bucket: my-corpora}]")
        buckets_raw = []
    for i, b in enumerate(buckets_raw):
        at = f"dataBuckets[{i}]"
        if not isinstance(b, dict) or "bucket" not in b or set(b) - {"bucket", "kmsKeyArn"}:
            r.problem(at, b, "must be an object with bucket and optionally kmsKeyArn")
            continue
        name, key = b["bucket"], b.get("kmsKeyArn", "")
        ok = check(is_bucket_name(name), r, f"{at}.bucket", name,
                   "must be an S3 bucket name: 3-63 lowercase letters, digits, '.' or '-'")
        ok &= check(name not in [x.name for x in buckets], r, f"{at}.bucket", name, "is listed twice")
        ok &= check(key == "" or (isinstance(key, str) and bool(_KMS_KEY_ARN.fullmatch(key))), r, f"{at}.kmsKeyArn",
                    key, _KMS_RULE)
        if ok:
            buckets.append(DataBucket(name, key))
    export = {"export_bucket": "", "export_prefix": "", "export_kms_key_arn": ""}
    if not isinstance(export_raw, dict) or set(export_raw) - {"bucket", "prefix", "kmsKeyArn"}:
        r.problem("dataExport", export_raw, "must be an object {bucket, prefix, kmsKeyArn?} or empty ({})")
    elif export_raw:
        bucket, prefix, key = export_raw.get("bucket"), export_raw.get("prefix"), export_raw.get("kmsKeyArn", "")
        ok = check(is_bucket_name(bucket), r, "dataExport.bucket", bucket,
                   "must be an S3 bucket name: 3-63 lowercase letters, digits, '.' or '-'")
        loc = None
        if ok and isinstance(prefix, str):
            try:
                loc = parse_s3_url(f"s3://{bucket}/{prefix}", need_prefix=True)
            except ValueError as exc:
                r.problem("dataExport.prefix", prefix, f"{exc} ({S3_URL_RULE})")
        elif not isinstance(prefix, str):
            r.problem("dataExport.prefix", prefix, "must be a key prefix such as exports/ (exports go below it only)")
        ok = check(key == "" or (isinstance(key, str) and bool(_KMS_KEY_ARN.fullmatch(key))), r,
                   "dataExport.kmsKeyArn", key, _KMS_RULE)
        if loc is not None and ok:
            export = {"export_bucket": loc.bucket, "export_prefix": loc.prefix, "export_kms_key_arn": key}
    return {"data": DataConfig(buckets=tuple(buckets), **export)}


def _parse_api_teams(r: Reader) -> dict[str, Any]:
    """apiTeams (contract/api.py parses it, for the stack and for the run API alike)."""
    raw = r.get("apiTeams")
    try:
        return {"api_teams": parse_api_teams(raw if raw is not None else {})}
    except TeamsError as exc:
        for key, message in exc.problems:
            r.problems.append(f"{PROJECT}:{key}: {message} (fix: pulumi config set --path '{key}' VALUE)")
        return {}


def check_team_routes(r: Reader, teams: tuple[TeamConfig, ...], api_teams: ApiTeams | None) -> None:
    """mainNamespaceTeams, and apiTeams against trainingTeams: the run API sends an apiTeams team to the trainingTeams
    team of the same name, any other to the main namespace's queue and quota (training/api/server.py ``route``). With
    trainingTeams set, that fallback must be asked for (mainNamespaceTeams): a misspelt team would otherwise lose its
    quota and queue without a word. Without trainingTeams every team uses the main namespace: nothing to check."""
    main = r.get("mainNamespaceTeams")
    if not isinstance(main, list) or not all(isinstance(t, str) for t in main):
        r.problem("mainNamespaceTeams", main, "must be a list of apiTeams team names, e.g. [platform]")
        return
    if api_teams is None or any(p.startswith((f"{PROJECT}:trainingTeams", f"{PROJECT}:apiTeams")) for p in r.problems):
        return  # judged once those parse
    training = {t.name: t for t in teams}
    for i, name in enumerate(main):
        if name not in api_teams.teams:
            r.problem(f"mainNamespaceTeams[{i}]", name, f"is not an apiTeams team (apiTeams.teams: "
                      f"{', '.join(sorted(api_teams.teams)) or '(none)'}): add it there, or delete this entry")
        elif name in training:
            r.problem(f"mainNamespaceTeams[{i}]", name, "is a trainingTeams team, whose runs go to its own namespace "
                      f"{training[name].namespace}: delete this entry, or the team from trainingTeams")
    if not training:
        return
    for name in sorted(set(api_teams.teams) - set(training) - set(main)):
        near = difflib.get_close_matches(name, sorted(training), n=1)
        r.problems.append(
            f"{PROJECT}:apiTeams.teams.{name} is not a trainingTeams team ({', '.join(sorted(training))}), so the run API would "
            f"send its runs to the main namespace's queue and quota{f' (did you mean {near[0]}?)' if near else ''}: "
            "add it to trainingTeams, rename it to its trainingTeams team, or, if it is meant to share the main "
            f"namespace, list it in mainNamespaceTeams (fix: pulumi config set --path 'mainNamespaceTeams[0]' {name})")
