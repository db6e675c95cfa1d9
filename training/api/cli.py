"""``ragpool login`` and ``ragpool context``: reach a cluster's run API from a laptop.

    ragpool login --cluster NAME [--region R] [--context NAME] [--profile AWS_PROFILE]
    ragpool login --stack NAME [--outputs-file JSON] [--context NAME] [--profile AWS_PROFILE]
    ragpool login --endpoint URL [--cluster-id NAME] [--context NAME] [--profile AWS_PROFILE] [--ca-file PEM]
    ragpool context list
    ragpool context use NAME

``--cluster``: ``eks:DescribeCluster`` gives the API server's endpoint and CA (stored beside the context file),
then the login ConfigMap (``contract.api.LOGIN_CONFIGMAP`` in the main training namespace, read with the same
token EKS accepts) gives the run API's proxy path, cluster id, STS endpoint and region. ``--stack``: the same
facts from the stack's outputs (``pulumi stack output --json --stack NAME``, or ``--outputs-file`` holding that
JSON, for CI). ``--endpoint``: the API itself says where tokens are signed for (``/v1/info``). Then login
checks who you are (``/v1/whoami``: your ARN, team, admin), stores the context (training/api/contexts.py) and
makes it current. From then on ``ragpool submit|status|list|cancel|retry|show|logs`` go through the API (unless
``REDIS_URL`` is set). Exit codes: 0 done, 1 your identity has no team or no access here, 2 bad input or refused
credentials (with the fix), 3 no such cluster or the stack writes no login facts, 4 unreachable (named, within
10 s).
"""

from __future__ import annotations

import json
import os
import sys

from contract import exit_codes


def register(subparsers) -> None:
    p = subparsers.add_parser("login", help="store a context for a cluster's run API (and check who you are)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--cluster", metavar="NAME", help="the EKS cluster's name (eks:DescribeCluster, then the "
                                                         "login ConfigMap it holds)")
    where.add_argument("--stack", metavar="NAME", help="the Pulumi stack (its outputs clusterEndpoint, "
                                                       "clusterCertificateAuthority, runApiLogin)")
    where.add_argument("--endpoint", help="the run API's URL itself (a local API, an internal load balancer)")
    p.add_argument("--region", help="with --cluster: the cluster's region (default: your AWS profile's)")
    p.add_argument("--sts-endpoint", help="with --cluster: the STS endpoint the first token is presigned for "
                                          "(default https://sts.<region>.amazonaws.com)")
    p.add_argument("--outputs-file", help="with --stack: a file holding `pulumi stack output --json` (CI; no pulumi "
                                          "needed)")
    p.add_argument("--cluster-id", help="the cluster you expect (refused when the API serves another)")
    p.add_argument("--context", help="the context's name (default: the cluster id)")
    p.add_argument("--profile", help="AWS profile to sign with (default: the default credential chain)")
    p.add_argument("--ca-file", help="CA bundle of the endpoint's certificate (default: the system's trust store)")
    p.set_defaults(handler=cmd_login)

    p = subparsers.add_parser("context", help="list the stored contexts, or choose the current one")
    sub = p.add_subparsers(dest="context_command", required=True)
    q = sub.add_parser("list", help="the stored contexts (* = current)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=cmd_context_list)
    q = sub.add_parser("use", help="make NAME the current context")
    q.add_argument("name")
    q.set_defaults(handler=cmd_context_use)


def _fail(command: str, message: str, code: int) -> int:
    print(f"ragpool {command}: {message}", file=sys.stderr)
    return code


def cmd_login(args, *, credentials=None) -> int:
    from training.api.client import ApiClient
    from training.api.contexts import Context, ContextError, check_endpoint, check_name, load

    try:
        if args.context:
            check_name(args.context)
        state = load()
    except ContextError as exc:
        return _fail("login", str(exc), exit_codes.BAD_INPUT)
    ca_file = os.path.abspath(os.path.expanduser(args.ca_file)) if args.ca_file else None
    if ca_file and not os.path.isfile(ca_file):
        return _fail("login", f"--ca-file: {args.ca_file!r} is not a readable file", exit_codes.BAD_INPUT)
    if getattr(args, "cluster", None) or getattr(args, "stack", None):
        from training.api.login import LoginError, from_cluster, from_stack

        try:
            if args.cluster:
                context = from_cluster(args.cluster, region=args.region, profile=args.profile,
                                       sts_url=args.sts_endpoint, context=args.context, ca_file=ca_file,
                                       credentials=credentials)
            else:
                context = from_stack(args.stack, outputs_file=args.outputs_file, profile=args.profile,
                                     context=args.context, ca_file=ca_file)
        except LoginError as exc:
            return _fail("login", exc.message, exc.code)
        if args.cluster_id and args.cluster_id != context.cluster_id:
            return _fail("login", f"--cluster-id: that is cluster {context.cluster_id!r}, not {args.cluster_id!r}",
                         exit_codes.BAD_INPUT)
        return _store(args, state, context, credentials)
    try:
        endpoint = check_endpoint(args.endpoint, "--endpoint")
    except ContextError as exc:
        return _fail("login", str(exc), exit_codes.BAD_INPUT)
    probe = ApiClient(Context(endpoint, "", "", "", ca_file=ca_file))
    info = probe.info()
    if not info.ok:
        return _fail("login", info.message, info.code)
    data = info.data if isinstance(info.data, dict) else {}
    cluster_id, sts, region = data.get("cluster_id"), data.get("sts_endpoint"), data.get("region")
    if not (isinstance(cluster_id, str) and isinstance(sts, str) and isinstance(region, str)):
        return _fail("login", f"{endpoint} did not answer /v1/info as a run API does", exit_codes.BAD_INPUT)
    if args.cluster_id and args.cluster_id != cluster_id:
        return _fail("login", f"--cluster-id: {endpoint} serves cluster {cluster_id!r}, not {args.cluster_id!r}; "
                              "check the endpoint", exit_codes.BAD_INPUT)
    return _store(args, state, Context(endpoint, cluster_id, sts, region, args.profile, ca_file), credentials)


def _store(args, state: dict, context, credentials) -> int:
    """Check who the caller is through ``context`` (``/v1/whoami``), then save it as the current context."""
    from training.api.client import ApiClient
    from training.api.contexts import ContextError, check_name, save

    who = ApiClient(context, credentials=credentials).whoami()
    if not who.ok:
        return _fail("login", who.message, who.code)
    name = args.context or context.cluster_id
    try:
        check_name(name)
    except ContextError as exc:
        return _fail("login", f"{exc} (the cluster id; name one with --context)", exit_codes.BAD_INPUT)
    state["contexts"][name] = context
    state["current"] = name
    path = save(state)
    print(f"logged in to {name} ({context.endpoint}) as {who.message}; context saved in {path}")
    return exit_codes.OK


def cmd_context_list(args) -> int:
    from training.api.contexts import ContextError, load

    try:
        state = load()
    except ContextError as exc:
        return _fail("context list", str(exc), exit_codes.BAD_INPUT)
    if args.json:
        print(json.dumps({"current": state["current"], "contexts": {
            n: {"endpoint": c.endpoint, "cluster_id": c.cluster_id} for n, c in state["contexts"].items()}}, indent=2))
        return exit_codes.OK
    if not state["contexts"]:
        print("no contexts (ragpool login --endpoint URL)")
    for name, c in sorted(state["contexts"].items()):
        print(f"{'*' if name == state['current'] else ' '} {name}  {c.endpoint}  cluster {c.cluster_id}")
    return exit_codes.OK


def cmd_context_use(args) -> int:
    from training.api.contexts import ContextError, load, save

    try:
        state = load()
    except ContextError as exc:
        return _fail("context use", str(exc), exit_codes.BAD_INPUT)
    if args.name not in state["contexts"]:
        have = ", ".join(sorted(state["contexts"])) or "none"
        return _fail("context use", f"no context {args.name!r} (contexts: {have}); ragpool login --context NAME",
                     exit_codes.NOT_FOUND)
    state["current"] = args.name
    save(state)
    print(f"current context: {args.name}")
    return exit_codes.OK
