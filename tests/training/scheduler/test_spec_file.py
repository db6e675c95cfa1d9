"""Reading a run spec from a file or text (training/scheduler/spec_file.py): syntax errors named with their
position, YAML alias bombs refused at once, nesting and bytes read bounded, UTF-8 only (the fields themselves:
test_spec.py)."""

from __future__ import annotations

import json

import pytest

from training.scheduler.spec import SpecError
from training.scheduler.spec_file import load_spec, parse_spec_text

ROOT = "/mnt/shared"


def test_bad_json_names_the_file_and_the_position(tmp_path):
    # Unreadable, bad YAML and non-mapping files: tests/training/test_config.py, for the spec and the config.
    bad_json = tmp_path / "run.json"
    bad_json.write_text('{"run_id": }')
    with pytest.raises(SpecError, match=r"(?s)run\.json.*invalid JSON at line 1"):
        load_spec(bad_json)


def test_a_yaml_alias_bomb_is_refused_at_once():
    import time

    lines = ["run_id: bomb", "stages: [retriever]", 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    text = "\n".join(lines) + "\n"
    assert len(text) < 700  # 9^9 ~ 4e8 strings once expanded
    started = time.monotonic()
    with pytest.raises(SpecError, match="aliases"):
        parse_spec_text(text, shared_root=ROOT)
    assert time.monotonic() - started < 1.0
    with pytest.raises(SpecError, match="anchors"):
        parse_spec_text("run_id: &x ok\nstages: [retriever]\n", shared_root=ROOT)


def test_nesting_and_bytes_read_are_bounded(tmp_path):
    for text in ("[" * 5000, '{"a":' * 5000, "x: " + "[" * 40 + "]" * 40 + "\n",
                 json.dumps({"run_id": "a", "stages": ["retriever"], "data": {"corpus": [[[[[[[[[[[[[[[[[[[[[[[[[[
                     [[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}})):
        with pytest.raises(SpecError, match="nested deeper|syntax"):
            parse_spec_text(text, shared_root=ROOT)
    with pytest.raises(SpecError, match="limit is"):
        load_spec("/dev/zero", shared_root=ROOT)
    junk = tmp_path / "junk.yaml"
    junk.write_bytes(b"run_id: \xff\xfe\x00ok\n")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(junk, shared_root=ROOT)
