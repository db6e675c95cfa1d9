"""Stack config: schema, Pulumi.yaml in sync, clear errors for bad values, no tracebacks."""

from __future__ import annotations

import copy
import json
import string

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import StackConfigError, parse
from infra.config_schema import DEFAULT_GPU_POOLS, SCHEMA, SCHEMA_BY_NAME, pulumi_yaml_config
from infra.stack import REPO_ROOT, load_stack, validate_stack
from tests.support.stack_config import REAL_CIDR

BASE = {"owner": "ml-platform", "costCenter": "rag", "publicAccessCidrs": ["198.51.100.0/24"],
        "deployRoleArn": "arn:aws:iam::444455556666:role/deploy"}
PROD = {**BASE, "environment": "prod", "availabilityZones": ["us-west-2a", "us-west-2b", "us-west-2c"],
        "endpointPublicAccess": False, "systemNodeMinCount": 3, "apiAccessCidrs": ["10.0.0.0/16"],
        "gpuPools": [{"name": "od", "instanceTypes": ["p5.48xlarge"], "capacityType": "on-demand", "gpuLimit": 8}]}


def _parse(raw, stack="dev", region="us-west-2"):
    return parse(raw, stack=stack, region=region)


def test_pulumi_yaml_config_block_is_generated_from_schema():
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    assert project["name"] == "ragpool"
    assert project["main"] == "infra/"
    assert project["runtime"]["name"] == "python" and project["runtime"]["options"]["virtualenv"] == ".venv"
    assert project["config"] == pulumi_yaml_config(), "regenerate with: python -m infra.config_schema --pulumi-yaml"


def test_every_key_has_type_description_and_default_or_is_required():
    for key in SCHEMA:
        assert key.description.strip(), key.name
        # Pulumi cannot type objects (lists of them, maps): those are validated by infra/config.py.
        assert key.type in ("string", "integer", "boolean", "array") or key.name in ("gpuPools", "trainingTeams", "rayMaxWorkers", "dataBuckets", "dataExport", "apiTeams"), key.name
        assert key.default is not None or key.required or key.secret, f"{key.name} has neither default nor required"


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_stack_files_hold_only_overrides(stack):
    doc = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text())
    for full_key, value in doc["config"].items():
        ns, key = full_key.split(":", 1)
        if ns != "ragpool":
            continue
        assert key in SCHEMA_BY_NAME, f"{full_key} is not declared"
        assert value != SCHEMA_BY_NAME[key].default, f"{full_key} repeats the Pulumi.yaml default"


def test_dev_and_prod_parse_with_their_characters():
    dev = validate_stack(load_stack("dev"))
    prod = validate_stack(load_stack("prod"))
    assert dev.environment == "dev" and prod.environment == "prod"
    assert len(dev.network.availability_zones) == 2 and len(prod.network.availability_zones) == 3
    assert dev.network.nat_gateways == "single" and prod.network.nat_gateways == "perAz"
    assert dev.cluster.endpoint_public_access and not prod.cluster.endpoint_public_access
    assert {p.capacity_type for p in dev.gpu_pools} == {"spot"}
    assert {p.capacity_type for p in prod.gpu_pools} == {"on-demand", "spot"}
    assert prod.protect_stateful and not dev.protect_stateful


def test_config_objects_are_frozen():
    cfg = _parse(BASE)
    with pytest.raises(AttributeError):
        cfg.environment = "prod"  # type: ignore[misc]


def test_values_arrive_in_pulumi_wire_form():
    # The engine hands arrays/objects as JSON text and scalars as strings.
    cfg = _parse({**BASE, "systemNodeMinCount": "2", "endpointPublicAccess": "true",
                  "publicAccessCidrs": json.dumps(["198.51.100.0/24"]), "gpuPools": json.dumps(DEFAULT_GPU_POOLS)})
    assert cfg.cluster.system_node_min_count == 2
    assert cfg.cluster.public_access_cidrs == ("198.51.100.0/24",)
    assert cfg.gpu_pools[0].name == "gpu-spot"


BAD = [
    ("min greater than max", {"systemNodeMinCount": 5, "systemNodeMaxCount": 3}, "systemNodeMinCount", "5"),
    ("non-GPU instance type", {"gpuPools": [{"name": "p", "instanceTypes": ["m5.large"], "capacityType": "spot",
                                            "gpuLimit": 2}]}, "gpuPools[0].instanceTypes", "m5.large"),
    ("invalid CIDR", {"vpcCidr": "10.0.0.1/16"}, "vpcCidr", "10.0.0.1/16"),
    ("public CIDR", {"vpcCidr": "8.8.0.0/16"}, "vpcCidr", "8.8.0.0/16"),
    ("one AZ", {"availabilityZones": ["us-west-2a"]}, "availabilityZones", "us-west-2a"),
    ("AZ of another region", {"availabilityZones": ["us-west-2a", "eu-west-1b"]}, "availabilityZones", "eu-west-1b"),
    ("unknown key", {"gpuPool": []}, "gpuPool", "did you mean gpuPools"),
    ("missing required", {"owner": None}, "owner", "required"),
    ("missing required secret", {"alertReceiver": "slack"}, "alertReceiverSecret", "required"),
    ("bad capacity type", {"gpuPools": [{"name": "p", "instanceTypes": ["g5.xlarge"], "capacityType": "reserved",
                                         "gpuLimit": 2}]}, "gpuPools[0].capacityType", "reserved"),
    ("zero GPU limit", {"gpuPools": [{"name": "p", "instanceTypes": ["g5.xlarge"], "capacityType": "spot",
                                      "gpuLimit": 0}]}, "gpuPools[0].gpuLimit", "0"),
    ("unknown pool field", {"gpuPools": [{"name": "p", "instanceTypes": ["g5.xlarge"], "capacityType": "spot",
                                          "gpuLimit": 1, "gpus": 4}]}, "gpuPools[0].gpus", "unknown pool field"),
    ("pool zone outside AZs", {"gpuPools": [{"name": "p", "instanceTypes": ["g5.xlarge"], "capacityType": "spot",
                                             "gpuLimit": 1, "zones": ["us-west-2d"]}]}, "gpuPools[0].zones", "us-west-2d"),
    ("reserved label domain", {"gpuPools": [{"name": "p", "instanceTypes": ["g5.xlarge"], "capacityType": "spot",
                                             "gpuLimit": 1, "labels": {"karpenter.sh/x": "y"}}]}, "gpuPools[0].labels",
     "karpenter.sh/x"),
    ("unsupported k8s version", {"kubernetesVersion": "1.20"}, "kubernetesVersion", "1.20"),
    ("open API endpoint", {"publicAccessCidrs": ["0.0.0.0/0"]}, "publicAccessCidrs", "0.0.0.0/0"),
    ("public endpoint without allow-list", {"publicAccessCidrs": []}, "publicAccessCidrs", "[]"),
    ("bad admin ARN", {"adminRoleArns": ["arn:aws:iam::12:user/x"]}, "adminRoleArns", "arn:aws:iam::12:user/x"),
    ("mutable image tag", {"imageTag": "latest"}, "imageTag", "latest"),
    ("image digest not a digest", {"imageDigest": "sha256:abc"}, "imageDigest", "sha256:abc"),
    ("image digest with its tag", {"imageDigest": "0.1.0@sha256:" + "a" * 64}, "imageDigest", "0.1.0@sha256"),
    ("deploy role missing", {"deployRoleArn": None}, "deployRoleArn", "is required but not set"),
    ("deploy role not a role", {"deployRoleArn": "arn:aws:iam::444455556666:user/ci"}, "deployRoleArn",
     "arn:aws:iam::444455556666:user/ci"),
    ("deploy role trailing newline", {"deployRoleArn": "arn:aws:iam::444455556666:role/ci\n"}, "deployRoleArn", "role/ci"),
    ("public API access range", {"apiAccessCidrs": ["8.8.8.0/24"]}, "apiAccessCidrs", "8.8.8.0/24"),
    ("not a boolean", {"endpointPublicAccess": "yes"}, "endpointPublicAccess", "yes"),
    ("not an integer", {"efsBackupRetentionDays": "two weeks"}, "efsBackupRetentionDays", "two weeks"),
]


@pytest.mark.parametrize("label,override,key,value", BAD, ids=[b[0] for b in BAD])
def test_bad_value_names_key_value_and_allowed(label, override, key, value):
    raw = {**BASE, "publicAccessCidrs": ["198.51.100.0/24"], **override}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(StackConfigError) as err:
        _parse(raw)
    message = str(err.value)
    assert f"ragpool:{key}" in message
    assert value in message
    assert "Traceback" not in message


@pytest.mark.parametrize("override,key,fragment", [
    ({"gpuPools": [{"name": "s", "instanceTypes": ["g5.xlarge"], "capacityType": "spot", "gpuLimit": 4}]},
     "gpuPools", "on-demand"),
    ({"endpointPublicAccess": True, "publicAccessCidrs": ["198.51.100.0/24"]}, "endpointPublicAccess", "private"),
    ({"availabilityZones": ["us-west-2a", "us-west-2b"]}, "availabilityZones", "at least 3"),
    ({"apiAccessCidrs": []}, "apiAccessCidrs", "private API endpoint"),
])
def test_prod_rules(override, key, fragment):
    with pytest.raises(StackConfigError) as err:
        _parse({**PROD, **override}, stack="prod")
    assert f"ragpool:{key}" in str(err.value) and fragment in str(err.value)


def test_all_problems_are_reported_together():
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, "vpcCidr": "nope", "kubernetesVersion": "0.1", "imageTag": "latest"}, region=None)
    assert len(err.value.problems) >= 4  # + aws:region missing
    assert any(p.startswith("aws:region") for p in err.value.problems)


def test_secret_values_are_never_echoed():
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, "publicAccessCidrs": ["198.51.100.0/24"], "alertReceiver": "bogus",
                "alertReceiverSecret": 12345})
    assert "12345" not in str(err.value)


# ------------------------------------------------------------------ fuzz: never a traceback

_text = st.text(alphabet=string.ascii_letters + string.digits + "-./:% _", max_size=24)
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10, 10_000), _text)
_pool = st.fixed_dictionaries({}, optional={
    "name": st.one_of(_text, st.sampled_from(["gpu", "a", "spot-1"])),
    "instanceTypes": st.one_of(st.lists(st.one_of(_text, st.sampled_from(["g5.xlarge", "m5.large", "p5.48xlarge"])),
                                        max_size=3), _scalar),
    "capacityType": st.one_of(st.sampled_from(["spot", "on-demand", "x"]), _scalar),
    "gpuLimit": _scalar, "zones": st.one_of(st.lists(_text, max_size=2), _scalar),
    "diskSizeGiB": _scalar, "labels": st.one_of(st.dictionaries(_text, _text, max_size=2), _scalar),
    "expireAfter": _scalar, "disruptionBudget": _scalar, "bogus": _scalar,
})
_values = {
    "environment": st.one_of(st.sampled_from(["dev", "prod", "staging"]), _scalar),
    "vpcCidr": st.one_of(st.sampled_from(["10.0.0.0/16", "10.1.0.0/20", "192.168.0.0/24"]), _scalar),
    "availabilityZones": st.one_of(st.lists(st.sampled_from(["us-west-2a", "us-west-2b", "us-west-2c", "x"]),
                                            max_size=4), _scalar),
    "natGateways": st.one_of(st.sampled_from(["single", "perAz"]), _scalar),
    "kubernetesVersion": st.one_of(st.sampled_from(["1.35", "1.33", "2.0"]), _scalar),
    "endpointPublicAccess": _scalar, "publicAccessCidrs": st.one_of(st.lists(_text, max_size=2), _scalar),
    "systemNodeMinCount": _scalar, "systemNodeMaxCount": _scalar,
    "gpuPools": st.one_of(st.lists(_pool, max_size=3), _scalar, st.just("{not json")),
    "imageTag": _scalar, "alertReceiver": st.one_of(st.sampled_from(["none", "slack"]), _scalar),
    "owner": _scalar, "unexpectedKey": _scalar,
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.fixed_dictionaries({}, optional=_values), wire=st.booleans(),
       region=st.one_of(st.none(), st.sampled_from(["us-west-2", "mars-1"])))
def test_fuzzed_configs_parse_or_fail_cleanly(raw, wire, region):
    raw = {k: v for k, v in raw.items() if v is not None}
    if wire:  # as the Pulumi engine would pass them
        raw = {k: v if isinstance(v, str) else json.dumps(v) if not isinstance(v, bool) else str(v).lower()
               for k, v in raw.items()}
    try:
        cfg = parse(copy.deepcopy(raw), stack="fuzz", region=region)
    except StackConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
        assert "Traceback" not in str(exc)
    else:
        assert cfg.network.availability_zones and cfg.gpu_pools


def test_deploy_role_is_first_cluster_admin_and_placeholders_are_refused_only_for_deploy():
    from infra.deploy_config import deploy_problems

    cfg = _parse({**BASE, "publicAccessCidrs": [REAL_CIDR],  # BASE's is a documentation range
                  "adminRoleArns": ["arn:aws:iam::444455556666:role/ops", "arn:aws:iam::444455556666:role/deploy"]})
    assert cfg.cluster.cluster_admin_arns == ("arn:aws:iam::444455556666:role/deploy", "arn:aws:iam::444455556666:role/ops")
    assert deploy_problems(cfg) == []
    committed = validate_stack(load_stack("dev"))  # the stack file's marked placeholder parses offline
    role, cidr = deploy_problems(committed)
    assert "ragpool:deployRoleArn" in role and "111122223333" in role and "pulumi config set deployRoleArn" in role
    assert cidr.startswith('ragpool:publicAccessCidrs[0] = "203.0.113.0/24": a documentation range')


@pytest.mark.parametrize(("cidrs", "refused"), [
    (["198.51.100.0/24"], [0]), (["192.0.2.128/25"], [0]), (["2001:db8:1::/48"], [0]),
    (["198.51.99.0/24", "203.0.113.0/24"], [1]),  # the neighbour of a documentation range is a real one
    (["100.64.0.0/10", "2001:db9::/32"], []),
])
def test_deploy_refuses_a_documentation_range_as_public_access_cidrs(cidrs, refused):
    from infra.deploy_config import deploy_problems

    problems = deploy_problems(_parse({**BASE, "endpointPublicAccess": True, "publicAccessCidrs": cidrs}))
    assert [int(p.split("[", 1)[1].split("]")[0]) for p in problems if "publicAccessCidrs" in p] == refused
    for p in problems:
        assert "fix: pulumi config set --path 'publicAccessCidrs[" in p


# ------------------------------------------------------------------ one rule per identifier, applied whole

_POOL = {"name": "p", "instanceTypes": ["g5.xlarge"], "capacityType": "spot", "gpuLimit": 2}


@pytest.mark.parametrize("override,key", [
    ({"imageTag": "v1\n"}, "imageTag"),
    ({"owner": "ml-platform\n"}, "owner"),
    ({"deployRoleArn": "arn:aws:iam::444455556666:role/ci\n"}, "deployRoleArn"),
    ({"adminRoleArns": ["arn:aws:iam::444455556666:role/admin\n"]}, "adminRoleArns"),
    ({"systemNodeInstanceTypes": ["m7i.large\n"]}, "systemNodeInstanceTypes"),
    ({"availabilityZones": ["us-west-2a\n", "us-west-2b"]}, "availabilityZones"),
    ({"vpcCidr": "10.0.0.0/16\n"}, "vpcCidr"),
    ({"publicAccessCidrs": ["198.51.100.0/24\n"]}, "publicAccessCidrs"),
    ({"prometheusRetention": "31d\n"}, "prometheusRetention"),
    ({"gpuAmiAlias": "al2023@latest\n"}, "gpuAmiAlias"),
    ({"redisNodeType": "cache.r7g.large\n"}, "redisNodeType"),
    ({"runbookBaseUrl": "https://example.com/rb\x00"}, "runbookBaseUrl"),
    ({"gpuPools": [{**_POOL, "name": "gpu\n"}]}, "gpuPools[0].name"),
    ({"gpuPools": [{**_POOL, "instanceTypes": ["g5.xlarge\n"]}]}, "gpuPools[0].instanceTypes"),
    ({"gpuPools": [{**_POOL, "expireAfter": "720h\n"}]}, "gpuPools[0].expireAfter"),
    ({"gpuPools": [{**_POOL, "consolidateAfter": "30m\n"}]}, "gpuPools[0].consolidateAfter"),
    ({"gpuPools": [{**_POOL, "disruptionBudget": "10%\n"}]}, "gpuPools[0].disruptionBudget"),
    ({"gpuPools": [{**_POOL, "labels": {"team\n": "a"}}]}, "gpuPools[0].labels"),
    ({"gpuPools": [{**_POOL, "labels": {"team": "search\n"}}]}, "gpuPools[0].labels.team"),
    ({"trainingTeams": [{"name": "search\n", "gpuQuota": 1}]}, "trainingTeams[0].name"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_identifier_with_trailing_newline_or_control_character_is_refused(override, key):
    """re.match(r"...$") lets "x\\n" through; every identifier rule must hold for the whole value."""
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, **override})
    assert any(p.startswith(f"ragpool:{key} = ") for p in err.value.problems), err.value.problems


def test_region_with_trailing_newline_or_wrong_type_is_refused():
    for region in ("us-west-2\n", ["us-west-2"], 7):
        with pytest.raises(StackConfigError) as err:
            _parse(BASE, region=region)
        assert any(p.startswith("aws:region = ") for p in err.value.problems)


@pytest.mark.parametrize("key", [k.name for k in SCHEMA])
def test_key_set_to_null_is_an_error_naming_it(key):
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, key: None})
    assert any(p.startswith(f"ragpool:{key} is set to null") for p in err.value.problems), err.value.problems


def test_non_string_keys_and_huge_values_are_named_and_bounded():
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, 7: "x", "owner\n": 1, "gpuHoursBudget": 10**5000, "costCenter": "x" * 100_000,
                "gpuPools": [{**_POOL, 3: "x", "labels": {1: "a"}}]})
    text = str(err.value)
    assert "key 7 is not a string" in text
    assert 'ragpool:"owner\\n" is not a ragpool config key' in text
    assert "ragpool:gpuHoursBudget = <16610-bit integer>" in text
    assert "ragpool:gpuPools[0].3" in text and "ragpool:gpuPools[0].labels" in text
    assert max(len(line) for line in text.splitlines()) < 1000


def test_values_in_messages_are_bounded_even_when_shared_exponentially():
    bomb: object = "lol"
    for _ in range(30):  # 2^30 leaves if expanded
        bomb = [bomb, bomb]
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, "owner": bomb, "gpuPools": bomb})
    assert all(len(p) < 1000 for p in err.value.problems)


# ------------------------------------------------------------------ GPU families: one rule for config and policy


@pytest.mark.parametrize("instance_type,gpu", [
    ("g5.xlarge", True), ("g6e.12xlarge", True), ("gr6.4xlarge", True), ("p5.48xlarge", True),
    ("p6-b200.48xlarge", True), ("p6e-gb200.36xlarge", True), ("g5g.xlarge", True),
    ("g4ad.xlarge", False),  # AMD Radeon: no nvidia.com/gpu
    ("p2.xlarge", False), ("g3.4xlarge", False),  # Kepler/Maxwell: not supported by current NVIDIA drivers
    ("inf2.xlarge", False), ("trn1.2xlarge", False), ("m7i.large", False), ("g5.xlarge\n", False),
])
def test_config_and_policy_agree_on_gpu_instance_types(instance_type, gpu):
    from policy.checks import NODEPOOL_TYPES, Resource, is_gpu_nodepool

    def nodepool(key, values):
        return Resource(sorted(NODEPOOL_TYPES)[0], "pool", {"spec": {"template": {"spec": {"requirements": [
            {"key": key, "operator": "In", "values": values}]}}}})

    try:
        _parse({**BASE, "gpuPools": [{**_POOL, "instanceTypes": [instance_type]}]})
        accepted = True
    except StackConfigError:
        accepted = False
    assert accepted is gpu
    assert is_gpu_nodepool(nodepool("node.kubernetes.io/instance-type", [instance_type])) is gpu
    family = instance_type.split(".")[0]
    if "\n" not in instance_type:
        assert is_gpu_nodepool(nodepool("karpenter.k8s.aws/instance-family", [family])) is gpu


def test_pool_fields_left_out_take_the_dataclass_defaults():
    from dataclasses import fields

    from infra.config_gpu import GpuPoolConfig

    [pool] = _parse({**BASE, "gpuPools": [_POOL]}).gpu_pools
    for f in fields(GpuPoolConfig):
        if f.name not in ("name", "instance_types", "capacity_type", "gpu_limit", "zones"):
            assert getattr(pool, f.name) == f.default, f.name
    assert pool.zones == ("us-west-2a", "us-west-2b")  # no zones: every availability zone


@pytest.mark.parametrize("pool,refused", [
    ({**_POOL, "checkpointSeconds": 47}, None),
    ({**_POOL, "checkpointSeconds": 48}, "must fit the spot notice"),
    ({**_POOL, "checkpointSeconds": None}, "must be an integer from 1 to 3600"),
    ({**_POOL, "checkpointSeconds": "90s"}, "must be an integer from 1 to 3600"),
    ({**_POOL, "capacityType": "on-demand", "checkpointSeconds": 600}, None),
])
def test_a_spot_pools_declared_checkpoint_must_fit_the_spot_notice(pool, refused):
    """120 s notice - 10 s for it to reach the pod - 15 s for the worker to hand the run back: 95 s on spot for the
    background save in flight and the SIGTERM save after it, 47 s each; on-demand has no such limit (its grace
    period grows instead: test below)."""
    raw = {**BASE, "gpuPools": [pool]}
    if refused is None:
        assert _parse(raw).gpu_pools[0].checkpoint_seconds == pool["checkpointSeconds"]
        return
    with pytest.raises(StackConfigError) as err:
        _parse(raw)
    assert "ragpool:gpuPools[0].checkpointSeconds" in str(err.value) and refused in str(err.value)


def test_grace_periods_fit_the_spot_notice_and_the_declared_checkpoint():
    """Spot: Karpenter deletes the (do-not-disrupt) worker pods as soon as the interruption drain starts only when
    the NodePool's terminationGracePeriod is no longer than their own (terminator.go DeleteExpiringPods), and the
    instance is gone 120 s after the notice. On-demand: 300 s, or two declared checkpoints (the one in flight, the
    SIGTERM one) plus the worker's margin."""
    from infra.config_gpu import (SPOT_GRACE_S, SPOT_NOTICE_S, STOP_MARGIN_S, node_termination_grace,
                                  pod_grace_seconds)

    spot, = _parse({**BASE, "gpuPools": [{**_POOL, "checkpointSeconds": 47}]}).gpu_pools
    assert pod_grace_seconds(spot) == SPOT_GRACE_S < SPOT_NOTICE_S
    assert node_termination_grace(spot) == f"{pod_grace_seconds(spot)}s"
    assert 2 * spot.checkpoint_seconds + STOP_MARGIN_S <= pod_grace_seconds(spot)
    for declared, grace in ((None, 300), (100, 300), (600, 1215)):
        extra = {} if declared is None else {"checkpointSeconds": declared}
        od, = _parse({**BASE, "gpuPools": [{**_POOL, "capacityType": "on-demand", **extra}]}).gpu_pools
        assert pod_grace_seconds(od) == grace and node_termination_grace(od) == "24h"


# ------------------------------------------------------------------ dataBuckets, dataExport

_KEY = "arn:aws:kms:us-west-2:444455556666:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def test_data_keys_default_to_no_data_role_and_parse_when_set():
    assert not _parse(BASE).data.enabled
    data = _parse({**BASE, "dataBuckets": json.dumps([{"bucket": "corpora", "kmsKeyArn": _KEY}, {"bucket": "open.data"}]),
                   "dataExport": {"bucket": "exports", "prefix": "ragpool"}}).data
    assert [(b.name, b.kms_key_arn) for b in data.buckets] == [("corpora", _KEY), ("open.data", "")]
    assert data.export_url == "s3://exports/ragpool/" and data.enabled


@pytest.mark.parametrize(("values", "named"), [
    ({"dataBuckets": [{"bucket": "Corpora_1"}]}, "ragpool:dataBuckets[0].bucket = \"Corpora_1\""),
    ({"dataBuckets": [{"bucket": "a-b"}, {"bucket": "a-b"}]}, "ragpool:dataBuckets[1].bucket = \"a-b\": is listed twice"),
    ({"dataBuckets": [{"bucket": "a-b", "kmsKeyArn": "alias/x"}]}, "ragpool:dataBuckets[0].kmsKeyArn = \"alias/x\""),
    ({"dataBuckets": [{"name": "a-b"}]}, "ragpool:dataBuckets[0] = "),
    ({"dataBuckets": "a-b"}, "ragpool:dataBuckets = \"a-b\""),
    ({"dataExport": {"bucket": "exports", "prefix": ""}}, "ragpool:dataExport.prefix = \"\""),
    ({"dataExport": {"bucket": "exports", "prefix": "a/../b"}}, "ragpool:dataExport.prefix"),
    ({"dataExport": {"bucket": "x", "prefix": "p/"}}, "ragpool:dataExport.bucket = \"x\""),
    ({"dataExport": {"bucket": "exports", "prefix": "p/", "acl": "public"}}, "ragpool:dataExport = "),
])
def test_bad_data_keys_are_named(values, named):
    with pytest.raises(StackConfigError) as caught:
        _parse({**BASE, **values})
    assert named in str(caught.value), str(caught.value)


# ------------------------------------------------------------------ apiTeams (the run API)

def test_api_teams_parse_and_bad_patterns_are_named():
    teams = {"teams": {"team-a": ["arn:aws:iam::123456789012:role/ml-a-*"]},
             "admins": ["arn:aws:iam::123456789012:role/pool-admin"]}
    cfg = _parse({**BASE, "apiTeams": teams}).api_teams
    assert cfg.team_of("arn:aws:iam::123456789012:role/ml-a-eu") == "team-a" and cfg.to_json() == teams
    assert _parse(BASE).api_teams.teams == {}
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, "apiTeams": {"teams": {"team-a": ["arn:aws:iam::*:role/x"], "Bad_Team": ["x"]}, "admin": []}})
    text = str(err.value)
    for key in ("apiTeams.teams.team-a[0]", "apiTeams.teams", "apiTeams.admin"):
        assert f"ragpool:{key}" in text, text


# ------------------------------------------------------------------ apiTeams vs trainingTeams (which queue a team gets)

ARN = "arn:aws:iam::123456789012:role/ml-a"
RESEARCH = {"trainingTeams": [{"name": "research", "gpuQuota": 1}, {"name": "search", "gpuQuota": 1}]}


def test_an_api_team_that_is_no_training_team_is_refused_when_training_teams_exist():
    """The run API sends an apiTeams team that is no trainingTeams team to the main namespace's queue and quota: a
    typo would do that silently, so it is refused, naming the key, the trainingTeams and the fixes."""
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, **RESEARCH, "apiTeams": {"teams": {"reseach": [ARN], "search": [ARN]}}})
    [problem] = err.value.problems
    assert problem.startswith("ragpool:apiTeams.teams.reseach is not a trainingTeams team (research, search)")
    for part in ("did you mean research?", "add it to trainingTeams", "rename it", "mainNamespaceTeams"):
        assert part in problem, problem


def test_main_namespace_teams_and_no_training_teams_keep_the_main_queue():
    """Asked for (mainNamespaceTeams), a team shares the main namespace beside trainingTeams; without trainingTeams
    every apiTeams team does, with nothing to declare."""
    cfg = _parse({**BASE, **RESEARCH, "apiTeams": {"teams": {"research": [ARN], "platform": [ARN]}},
                  "mainNamespaceTeams": ["platform"]})
    assert set(cfg.api_teams.teams) == {"research", "platform"}
    assert _parse({**BASE, "apiTeams": {"teams": {"reseach": [ARN]}}}).teams == ()


@pytest.mark.parametrize("main, named, says", [
    (["research"], "ragpool:mainNamespaceTeams[0]", "its own namespace ragpool-team-research"),
    (["nope"], "ragpool:mainNamespaceTeams[0]", "is not an apiTeams team (apiTeams.teams: research)"),
    ([3], "ragpool:mainNamespaceTeams", "must be a list"),
    ("platform", "ragpool:mainNamespaceTeams", "list"),
])
def test_bad_main_namespace_teams_are_named(main, named, says):
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, **RESEARCH, "apiTeams": {"teams": {"research": [ARN]}}, "mainNamespaceTeams": main})
    assert named in str(err.value) and says in str(err.value), str(err.value)


def test_a_broken_training_teams_list_is_not_judged_against_api_teams():
    """One problem at a time: a trainingTeams entry that does not parse is named, not also every apiTeams team."""
    with pytest.raises(StackConfigError) as err:
        _parse({**BASE, "trainingTeams": [{"name": "research", "gpuQuota": "x"}],
                "apiTeams": {"teams": {"research": [ARN]}}})
    assert "apiTeams" not in str(err.value) and "trainingTeams[0].gpuQuota" in str(err.value)
