"""scripts/vendor_schemas.py: the vendored upstream data is what the script makes from its pinned sources."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import jsonschema
import pytest

from scripts import vendor_schemas as vs


def test_the_script_reproduces_every_vendored_json_schema_byte_for_byte():
    built = vs.built_schemas()
    vendored = {p.relative_to(vs.VENDOR_DIR) for p in (vs.VENDOR_DIR / "crds").rglob("*.json")}
    assert vendored == set(built), "a JSON schema here is not made by the script, or one is missing"
    for rel, text in built.items():
        assert (vs.VENDOR_DIR / rel).read_text(encoding="utf-8") == text, f"{rel} is stale: run the script"


def test_every_vendored_file_has_a_pinned_upstream_source():
    made = set(vs.built_schemas())
    copied = {Path(rel) for _, _, rel in vs.FILES}
    present = {p.relative_to(vs.VENDOR_DIR) for p in vs.VENDOR_DIR.rglob("*") if p.is_file()}
    assert present - made - {Path("README.md")} == copied
    assert {key for key, _, _ in vs.FILES} <= set(vs.SOURCES)


def test_the_readme_states_each_sources_tag_and_commit():
    readme = (vs.VENDOR_DIR / "README.md").read_text()
    for key, src in vs.SOURCES.items():
        row = next((line for line in readme.splitlines() if line.startswith(f"| {key} |")), None)
        assert row is not None, f"no row for {key} in the README's Sources table"
        assert src.repo in row and src.tag in row and src.commit in row, row


def _fake_checkouts(tmp_path: Path) -> dict[str, Path]:
    """Upstream checkouts holding the vendored files at their upstream paths (chart archive included)."""
    checkouts: dict[str, Path] = {}
    archives: dict[Path, dict[str, bytes]] = {}
    for key, upstream_path, rel in vs.FILES:
        root = checkouts.setdefault(key, tmp_path / key)
        archive, _, member = upstream_path.partition("!")
        data = (vs.VENDOR_DIR / rel).read_bytes()
        if member:
            archives.setdefault(root / archive, {})[member] = data
        else:
            (root / archive).parent.mkdir(parents=True, exist_ok=True)
            (root / archive).write_bytes(data)
    for path, members in archives.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(path, "w:gz") as tgz:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tgz.addfile(info, io.BytesIO(data))
    return checkouts


def test_copying_from_checkouts_writes_each_file_at_its_vendored_path(tmp_path):
    out = tmp_path / "out"
    written = vs.copy_from_checkouts(_fake_checkouts(tmp_path / "src"), out)
    assert len(written) == len(vs.FILES)
    for _, _, rel in vs.FILES:
        assert (out / rel).read_bytes() == (vs.VENDOR_DIR / rel).read_bytes(), rel


def test_check_fails_on_a_stale_schema_and_a_rebuild_fixes_it(tmp_path, monkeypatch, capsys):
    copy = tmp_path / "upstream"
    shutil.copytree(vs.VENDOR_DIR / "crds", copy / "crds")
    monkeypatch.setattr(vs, "VENDOR_DIR", copy)
    monkeypatch.setattr(vs, "REPO_ROOT", tmp_path)  # only for the printed paths
    stale = copy / "crds" / "monitoring.coreos.com" / "prometheusrule_v1.json"
    stale.write_text(stale.read_text().replace('"additionalProperties": false', '"additionalProperties": true', 1))
    assert vs.main(["--check"]) == 1
    assert "monitoring.coreos.com/prometheusrule_v1.json" in capsys.readouterr().err
    assert vs.main([]) == 0
    assert vs.main(["--check"]) == 0
    assert json.loads(stale.read_text())["additionalProperties"] is False


def test_strict_schema_refuses_unknown_fields_except_where_upstream_keeps_them():
    schema = {"$schema": vs.DRAFT4, **vs.strict_schema({
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "string"}}},
            "free": {"type": "object", "properties": {"x": {"type": "string"}},
                     "x-kubernetes-preserve-unknown-fields": True},
            "either": {"anyOf": [{"properties": {"x": {"type": "string"}}}]},
            "when": {"type": "string", "format": "date-time", "nullable": True},
            "mode": {"type": "string", "pattern": "^(?i)(abort|warn)?$"},
        },
    })}
    ok = {"a": {"x": "1"}, "free": {"y": 1}, "either": {"y": 1}, "when": None, "mode": "WARN"}
    jsonschema.validate(ok, schema)
    for bad in ({"b": 1}, {"a": {"y": 1}}, {"mode": "retry"}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_a_checkout_that_is_not_a_directory_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        vs.main(["--checkout", f"K={tmp_path / 'missing'}"])
    assert exit_info.value.code == 2
    assert "is not a directory (a checkout of kubernetes-sigs/karpenter at v1.14.1)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        vs.main(["--checkout", f"NOPE={tmp_path}"])
    assert "KEY one of K, KA" in capsys.readouterr().err
