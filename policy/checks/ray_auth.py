"""Ray: every RayCluster (also a RayJob's or RayService's) runs with Ray token authentication."""

from __future__ import annotations

from collections.abc import Iterator

from contract.ray_auth import AUTH_MODE_ENV as _RAY_AUTH_MODE_ENV
from contract.ray_auth import TOKEN_ENV as _RAY_AUTH_TOKEN_ENV
from policy.checks.model import Context, Resource
from policy.checks.values import _is_blank
from policy.pod_templates import RAY_CLUSTER_SPEC_PATHS
from policy.pod_templates import as_list as _as_list
from policy.pod_templates import containers as _containers
from policy.pod_templates import get as _get




def check_ray_token_auth(resource: Resource, ctx: Context) -> Iterator[str]:
    """A RayCluster (or the cluster a RayJob/RayService makes) runs with Ray's token authentication:
    ``authOptions.mode: token`` (KubeRay enables it for exactly that value, utils.IsAuthEnabled), no
    container overriding the ``RAY_AUTH_MODE`` KubeRay sets (KubeRay keeps a container's own value,
    common/pod.go SetContainerTokenAuthEnvVars), and the token never written into the spec."""
    path = RAY_CLUSTER_SPEC_PATHS.get(resource.type)
    if path is None:
        return
    spec = _get(resource.inputs, *path)
    if spec is None:  # a RayJob on an existing cluster (clusterSelector): that cluster is checked itself
        return
    where = ".".join(path)
    mode = _get(spec, "authOptions", "mode")
    if mode != "token":
        yield (f"{where}.authOptions.mode is {mode!r}: the Ray dashboard, Jobs API and GCS take anyone who "
               "reaches them; set authOptions {mode: token, secretName: <the namespace's token Secret>} "
               "(infra/ray_cluster.py auth_options)")
    containers = [(f"headGroupSpec container {_get(c, 'name')!r}", c)
                  for c in _containers(_get(spec, "headGroupSpec", "template", "spec"))]
    for group in _as_list(_get(spec, "workerGroupSpecs")):
        containers += [(f"worker group {_get(group, 'groupName')!r} container {_get(c, 'name')!r}", c)
                       for c in _containers(_get(group, "template", "spec"))]
    containers.append(("autoscalerOptions", _get(spec, "autoscalerOptions")))
    for label, container in containers:
        for env in _as_list(_get(container, "env")):
            name, value = _get(env, "name"), _get(env, "value")
            if name == _RAY_AUTH_MODE_ENV and value is not None and value != "token":
                yield (f"{where} {label} sets {name}={value!r}: KubeRay keeps it instead of token; "
                       f"remove it (authOptions sets {name})")
            if name == _RAY_AUTH_TOKEN_ENV and not _is_blank(value):
                yield (f"{where} {label} carries {name} as a plain value: the token would sit in the spec; "
                       "remove it (authOptions.secretName hands it over from the Secret)")
