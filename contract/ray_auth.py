"""Ray token authentication as ragpool's Ray clients and clusters use it (torch-free, Ray-free).

Every RayCluster runs with Ray's token authentication (Ray 2.58: ``RAY_AUTH_MODE=token``). On
Kubernetes, KubeRay 1.7's ``spec.authOptions`` (``mode: token``, ``secretName``) gives every Ray
container of the cluster ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the key
``auth_token`` of that Secret (ray-project/kuberay v1.7.0,
ray-operator/controllers/ray/common/pod.go ``SetContainerTokenAuthEnvVars``;
ray-operator/controllers/ray/utils/constant.go ``RAY_AUTH_TOKEN_SECRET_KEY``). A client outside
the Ray pods (the Ray worker template, infra/worker_jobs.py) mounts that Secret as a volume and
points ``RAY_AUTH_TOKEN_PATH`` at the file; :data:`SECRET_ENV` names the Secret so that a refusal
says where the token comes from. The token itself is never printed.

Ray's own clients attach the token only when their process runs with ``RAY_AUTH_MODE=token``
(read once per process by ``ray._raylet``); :func:`auth_headers` sends it explicitly instead, so
that a Jobs API call carries it whatever mode the process started in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

AUTH_MODE_ENV = "RAY_AUTH_MODE"
"""Ray's switch: ``token`` on every Ray process of a ragpool cluster and on its clients."""
TOKEN_MODE = "token"
TOKEN_ENV = "RAY_AUTH_TOKEN"
"""The token itself (how KubeRay hands it to the Ray containers, from the Secret)."""
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
"""A file holding the token (how the Ray worker template gets it: a secret volume)."""
TOKEN_SECRET_KEY = "auth_token"
"""The Secret's data key KubeRay reads the token from (utils.RAY_AUTH_TOKEN_SECRET_KEY)."""
SECRET_ENV = "RAGPOOL_RAY_AUTH_SECRET"
"""``<namespace>/<name>`` of the Secret the token comes from, for error messages."""


class RayAuthError(Exception):
    """The Ray cluster refused this client's token, or there is no token to send; the message names
    the Secret (never the token)."""


def token_source(environ: Mapping[str, str] = os.environ) -> str:
    """Where the token comes from, in words: the Secret, and the variable that carries it here."""
    secret = environ.get(SECRET_ENV)
    if environ.get(TOKEN_ENV):
        here = TOKEN_ENV
    elif environ.get(TOKEN_PATH_ENV):
        here = f"{TOKEN_PATH_ENV}={environ[TOKEN_PATH_ENV]}"
    else:
        here = f"neither {TOKEN_ENV} nor {TOKEN_PATH_ENV} is set"
    where = f"Secret {secret} (key {TOKEN_SECRET_KEY})" if secret else "the RayCluster's token Secret"
    return f"{where}; here: {here}"


def load_token(environ: Mapping[str, str] = os.environ) -> str | None:
    """The token this client sends: ``RAY_AUTH_TOKEN``, else the file at ``RAY_AUTH_TOKEN_PATH``
    (surrounding whitespace dropped); None when neither is set. A path that cannot be read, or an
    empty token, is a :class:`RayAuthError`."""
    if environ.get(TOKEN_ENV):
        return environ[TOKEN_ENV].strip()
    path = environ.get(TOKEN_PATH_ENV)
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise RayAuthError(f"cannot read the Ray token file ({exc.strerror or type(exc).__name__}): "
                           f"mount {token_source(environ)}") from None
    if not token:
        raise RayAuthError(f"the Ray token file is empty: {token_source(environ)}")
    return token


def auth_headers(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The HTTP header that authenticates a request to the Ray dashboard / Jobs API ({} without a token)."""
    token = load_token(environ)
    return {"Authorization": f"Bearer {token}"} if token else {}


def refusal(address: str, environ: Mapping[str, str] = os.environ) -> str:
    """The one-line error for a request the cluster refused (Ray's HTTP 403 for a wrong token, 401 for none)."""
    sent = bool(environ.get(TOKEN_ENV) or environ.get(TOKEN_PATH_ENV))
    what = "refused this client's token" if sent else "requires a token and none was sent"
    return (f"the Ray cluster at {address} {what}: the token comes from {token_source(environ)}; "
            "check that the pod mounts that Secret and the RayCluster's authOptions.secretName names it")


def client_env(token_path: str | os.PathLike[str]) -> dict[str, str]:
    """The environment of a Ray client (a worker, ``ray.init``, the ray CLI) of a token-mode cluster."""
    return {AUTH_MODE_ENV: TOKEN_MODE, TOKEN_PATH_ENV: str(token_path)}
