"""Registry: the ECR repository of the training image and, when enabled, the image
build+push from training/Dockerfile (pulumi-docker-build, BuildKit)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_aws as aws

from infra.component import RagpoolComponent
from infra.common import aws_tags, child
from infra.config import StackConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
LIFECYCLE_POLICY = {"rules": [
    {"rulePriority": 1, "description": "Drop untagged layers after 7 days",
     "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed", "countUnit": "days", "countNumber": 7},
     "action": {"type": "expire"}},
    {"rulePriority": 2, "description": "Keep the newest 50 tagged images",
     "selection": {"tagStatus": "any", "countType": "imageCountMoreThan", "countNumber": 50},
     "action": {"type": "expire"}},
]}


@dataclass(frozen=True)
class RegistryArgs:
    config: StackConfig


class Registry(RagpoolComponent):
    def __init__(self, name: str, args: RegistryArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("ragpool:infra:Registry", name, opts)
        name = self.child_prefix
        cfg = args.config
        self.repository = aws.ecr.Repository(
            f"{name}-training", name=f"{cfg.name_prefix}/training", image_tag_mutability="IMMUTABLE",
            image_scanning_configuration={"scan_on_push": True},
            encryption_configurations=[{"encryption_type": "KMS"}],
            force_delete=not cfg.is_prod, tags=aws_tags(cfg, f"{cfg.name_prefix}-training"),
            opts=child(self, protect=cfg.protect_stateful))
        aws.ecr.LifecyclePolicy(f"{name}-training", repository=self.repository.name,
                                policy=json.dumps(LIFECYCLE_POLICY), opts=child(self))
        # By digest when imageDigest is set (the deploy workflow's build): what runs is exactly what was scanned.
        self.image_ref = self.repository.repository_url.apply(
            lambda url: f"{url}:{cfg.image_tag}" + (f"@{cfg.image_digest}" if cfg.image_digest else ""))

        if cfg.build_image:
            import pulumi_docker_build as docker_build

            token = aws.ecr.get_authorization_token_output(registry_id=self.repository.registry_id)
            image = docker_build.Image(
                f"{name}-training-image",
                context={"location": str(REPO_ROOT)},
                dockerfile={"location": str(REPO_ROOT / "training" / "Dockerfile")},
                platforms=["linux/amd64"],
                push=True,
                tags=[self.image_ref],
                registries=[{"address": self.repository.repository_url, "username": token.user_name,
                             "password": token.password}],
                opts=child(self))
            self.image_ref = image.ref
        self.repository_url = self.repository.repository_url
        self.register_outputs({"repository_url": self.repository_url, "image_ref": self.image_ref})
