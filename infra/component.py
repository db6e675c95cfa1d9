"""The base class of every ragpool Pulumi component (``RagpoolComponent``).

It applies the moves recorded in ``infra/aliases.py`` (``MOVES``), so a renamed or retyped
component keeps its resources, and hands the cluster's Kubernetes provider to its children.
"""

from __future__ import annotations

import pulumi

from infra.aliases import MOVES


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
