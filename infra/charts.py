"""Helm charts ragpool installs, pinned in one place.

Versions match ../shared/schemas/helm/<chart>/<version>/, so tests check our values
files against the defaults of the exact chart that will be installed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Chart:
    name: str
    version: str
    repo: str | None  # None for OCI charts, whose location is the chart name

    @property
    def chart_ref(self) -> str:
        return self.name


KARPENTER = Chart("oci://public.ecr.aws/karpenter/karpenter", "1.14.1", None)

# chart key in ../shared/schemas/helm -> Chart
BY_SCHEMA_NAME = {
    "karpenter": KARPENTER,
}
