"""Renamed and moved components, recorded so `pulumi up` keeps existing resources.

Renaming or retyping a component would otherwise change its URN (and, for a retype,
every child's URN, which embeds the parent's type): Pulumi would delete and recreate
the cluster, the file system and the queue. To rename, change the name in
``infra/__main__.py`` and add an entry here; to change a component's type token, add
its old type. Children keep their names (a child's URN holds its parent's type, not its
name) and inherit the component's alias for a retype, so nothing is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi


@dataclass(frozen=True)
class Moved:
    """What a component was called before (None: unchanged)."""

    old_name: str | None = None
    old_type: str | None = None


# (type token, current name) -> previous identity. Empty until something moves.
MOVES: dict[tuple[str, str], Moved] = {}


class RagpoolComponent(pulumi.ComponentResource):
    """Base of every ragpool component: applies recorded moves and a stable child prefix.

    ``k8s_provider``: the cluster's Kubernetes provider. The component passes it on to its
    children (Pulumi's ``providers`` option), so every Kubernetes object it declares uses it
    without naming it, and none can fall back to the ambient kubeconfig.
    """

    child_prefix: str

    def __init__(self, type_token: str, name: str, opts: pulumi.ResourceOptions | None = None, *,
                 k8s_provider: pulumi.ProviderResource | None = None):
        moved = MOVES.get((type_token, name))
        if moved:
            alias = pulumi.Alias(name=moved.old_name or name, type_=moved.old_type or type_token)
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(aliases=[alias]))
        if k8s_provider is not None:
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(providers=[k8s_provider]))
        super().__init__(type_token, name, None, opts)
        self.child_prefix = moved.old_name if moved and moved.old_name else name
