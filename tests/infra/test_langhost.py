"""The program as Pulumi's Python language host runs it (infra/langhost/): a fresh interpreter that
has imported only pulumi, the program directory first on sys.path (issue 21, item 0)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

import infra.plan as plan_module
from infra.langhost.shadowing import program_module_names, program_shadowing
from infra.plan import INFRA_DIR, HostRun, ProgramError, render_plan, run_program, run_program_as_host
from infra.stack import load_stack

REFERENCE = INFRA_DIR / "reference" / "pulumi_language_host.yaml"


def _host_imports_script() -> str:
    """A script that imports what pulumi-language-python-exec imports before run_path and writes sys.modules."""
    imports = yaml.safe_load(REFERENCE.read_text())["imports_before_run_path"]
    assert imports[-2:] == ["pulumi", "pulumi.runtime"]
    return "\n".join([*(f"import {m}" for m in imports), "loaded = sorted(sys.modules)", "import json",
                      "with open(sys.argv[1], 'w') as f:", "    json.dump(loaded, f)", ""])


@pytest.fixture(scope="module")
def host_runs() -> dict[str, HostRun]:
    return {stack: run_program_as_host(load_stack(stack)) for stack in ("dev", "prod")}


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_program_runs_as_the_language_host_runs_it(host_runs, stack):
    settings = load_stack(stack)
    run = host_runs[stack]
    assert len(run.recorded) > 100
    # Nothing is lost on the way back from the child: the plan equals the program run in-process.
    assert render_plan(settings, run.recorded) == render_plan(settings, run_program(settings))


def test_host_run_imports_nothing_before_run_path_that_the_host_does_not(host_runs, tmp_path):
    script = tmp_path / "host_imports.py"
    script.write_text(_host_imports_script())
    out = tmp_path / "host.json"
    subprocess.run([sys.executable, str(script), str(out)], cwd=tmp_path, check=True, timeout=120)
    host = set(json.loads(out.read_text()))
    assert "redis" not in host and not any(m == "infra" or m.startswith("infra.") for m in host)
    for stack, run in host_runs.items():
        # The mocks may need more of pulumi; anything else imported first could hide what the
        # program would resolve differently under the host.
        extra = sorted(m for m in set(run.preloaded) - host if not m.startswith("pulumi."))
        assert extra == [], f"{stack}: imported before run_path, but not by the language host: {extra}"


def test_a_module_shadowing_an_installed_one_fails_the_host_run(tmp_path):
    """The check can fail: a program module named like an installed one (once infra/redis.py, which shadowed
    redis-py; the program no longer imports redis-py since infra reads the contract, not the scheduler) stops
    the host run where `pulumi up` would, although this test process has long imported the real one."""
    program = tmp_path / "infra"
    program.mkdir()
    (program / "__main__.py").write_text((INFRA_DIR / "__main__.py").read_text())
    (program / "pulumi_random.py").write_text('"""Named like the installed pulumi_random."""\n')
    import pulumi_random  # noqa: F401  (in-process, the real one is already loaded: why plan runs a fresh interpreter)

    with pytest.raises(ProgramError) as err:
        run_program_as_host(load_stack("dev"), program=program)
    assert "module 'pulumi_random' has no attribute 'RandomPassword'" in str(err.value)
    assert program_shadowing(program) == [
        "infra/pulumi_random.py: `pulumi_random` is also a module of the installed distribution pulumi_random; the "
        "language host puts infra/ first on sys.path, so this one replaces it for every import: rename it"]


def test_no_program_module_shadows_an_installed_one():
    names = program_module_names(INFRA_DIR)
    assert {"queue_redis", "langhost", "plan"} <= set(names)  # modules and subpackages are both seen
    assert program_shadowing(INFRA_DIR) == []


def test_shadowing_check_lists_modules_and_packages(tmp_path):
    (tmp_path / "redis.py").write_text("")
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "__init__.py").write_text("")
    (tmp_path / "json.py").write_text("")  # the standard library counts too
    (tmp_path / "ragpool_only_name.py").write_text("")
    (tmp_path / "data").mkdir()  # no Python inside: not a module
    found = program_shadowing(tmp_path)
    assert [line.split(":")[0] for line in found] == [f"{tmp_path.name}/json.py", f"{tmp_path.name}/redis.py",
                                                      f"{tmp_path.name}/yaml"]


def test_plan_runs_the_program_as_the_host(monkeypatch):
    """`ragpool plan` and `policy.offline --stack` (both call plan()) take the language host's path."""
    seen = []
    monkeypatch.setattr(plan_module, "run_program_as_host", lambda settings: seen.append(settings.stack)
                        or HostRun(recorded=[], preloaded=()))
    assert plan_module.plan("prod")["resources"] == [] and seen == ["prod"]
