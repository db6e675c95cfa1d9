"""contract.messages.shown: how every error message of ragpool quotes a value someone wrote."""

from __future__ import annotations

import time

from contract.messages import MAX_SHOWN, shown


def test_values_are_quoted_as_a_yaml_user_wrote_them():
    assert shown("abc") == '"abc"'
    assert shown(None) == "null" and shown(True) == "true" and shown(1.5) == "1.5" and shown(7) == "7"
    assert shown({"a": [1, "b"]}) == '{"a": [1, "b"]}'


def test_control_characters_are_escaped():
    text = shown("a\nb\x1b[31m")
    assert "\n" not in text and "\x1b" not in text
    assert text == '"a\\nb\\u001b[31m"'


def test_a_long_value_is_cut_at_the_limit_and_says_so():
    assert shown("x" * (MAX_SHOWN - 2)) == '"' + "x" * (MAX_SHOWN - 2) + '"'  # exactly the limit: whole
    long = shown("x" * 10_000)
    assert long == ('"' + "x" * 10_000)[:MAX_SHOWN] + "...(truncated)"
    assert shown("x" * 100, 40) == ('"' + "x" * 100)[:40] + "...(truncated)"


def test_shared_sub_lists_and_huge_integers_are_bounded_in_time():
    bomb: list = ["lol"] * 10
    for _ in range(30):  # 10**30 leaves if expanded
        bomb = [bomb] * 10
    start = time.monotonic()
    assert shown(bomb).endswith("...(truncated)")
    assert shown(10 ** 5000) == "<16610-bit integer>"
    assert time.monotonic() - start < 1.0
