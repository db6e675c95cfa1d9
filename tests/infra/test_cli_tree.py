"""The ``ragpool`` command tree (infra/cli_tree.py): ``--output json`` wherever a command prints JSON, ``--version``
from the package metadata, and the completion script generated from the parser."""

from __future__ import annotations

import json
import shutil
import subprocess
from importlib.metadata import version

import pytest

from infra import cli
from infra.cli_tree import apply_output, bash_script, zsh_script
from tests.support.redis_fixtures import SPEC_DATA_YAML, write_spec_data

PRINTING = (("status",), ("list",), ("show", "r"), ("submit", "f"), ("cancel", "r"), ("retry", "r"), ("logs", "r"),
            ("report", "r"), ("data", "status", "d"), ("context", "list"))


@pytest.mark.parametrize("argv", PRINTING, ids=" ".join)
def test_output_json_is_the_commands_json(argv):
    parser = cli.build_parser()
    for flags, expected in (([], False), (["--output", "json"], True), (["-o", "json"], True),
                            (["--output", "text"], False), (["--json"], True)):
        args = parser.parse_args([*argv, *flags])
        apply_output(args)
        assert args.json is expected, (argv, flags)


def test_version_is_the_packages(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"ragpool {version('ragpool')}"


def test_output_json_end_to_end_on_the_direct_path(redis_server, namespace, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("RAGPOOL_QUEUE_NAMESPACE", namespace)
    monkeypatch.setenv("RAGPOOL_SHARED_ROOT", str(write_spec_data(tmp_path / "shared")))
    spec = tmp_path / "run.yaml"
    spec.write_text("run_id: out-json\nstages: [retriever]\n" + SPEC_DATA_YAML)
    assert cli.main(["submit", str(spec), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["created"] is True
    assert cli.main(["list", "--output", "json"]) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == ["out-json"]
    assert cli.main(["cancel", "out-json", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"run_id": "out-json", "result": "cancelled"}


def _complete(script: str, *words: str) -> list[str]:
    """What the bash script completes after ``ragpool <words>`` (the last word being typed)."""
    line = " ".join(f"'{w}'" for w in ("ragpool", *words))
    probe = f'{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _ragpool_complete; echo "${{COMPREPLY[@]}}"'
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_the_completion_script_completes_commands_subcommands_and_options(capsys):
    assert cli.main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert script == bash_script(cli.build_parser())
    assert _complete(script, "su") == ["submit"]
    assert _complete(script, "data", "st") == ["status"]
    assert _complete(script, "status", "my-run", "--o") == ["--output"]
    assert "--wait" in _complete(script, "submit", "run.yaml", "--")
    assert _complete(script, "nonsense", "x") == []
    zsh = zsh_script(cli.build_parser())
    assert zsh.startswith("#compdef ragpool\n") and "bashcompinit" in zsh and zsh.endswith(script)
