"""contract/ray_auth.py: where a Ray client's token comes from, and what a refusal says (never the token)."""

from __future__ import annotations

import pytest

from contract.ray_auth import (
    SECRET_ENV, TOKEN_ENV, TOKEN_PATH_ENV, RayAuthError, auth_headers, client_env, load_token, refusal,
)

SECRET = "ragpool-team-search/ragpool-ray-auth"


def test_the_token_file_is_read_and_sent_as_a_bearer_header(tmp_path):
    path = tmp_path / "auth_token"
    path.write_text("abc123\n")  # a Secret file may end in a newline
    env = {TOKEN_PATH_ENV: str(path)}
    assert load_token(env) == "abc123"
    assert auth_headers(env) == {"Authorization": "Bearer abc123"}
    assert client_env(path) == {"RAY_AUTH_MODE": "token", TOKEN_PATH_ENV: str(path)}


def test_the_variable_wins_over_the_file_as_in_ray(tmp_path):
    path = tmp_path / "auth_token"
    path.write_text("from-file")
    assert load_token({TOKEN_ENV: "from-env", TOKEN_PATH_ENV: str(path)}) == "from-env"


def test_no_token_configured_sends_no_header():
    assert load_token({}) is None and auth_headers({}) == {}


@pytest.mark.parametrize("content", [None, "  \n"])
def test_a_missing_or_empty_token_file_names_the_secret(tmp_path, content):
    path = tmp_path / "auth_token"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RayAuthError) as err:
        load_token({TOKEN_PATH_ENV: str(path), SECRET_ENV: SECRET})
    assert f"Secret {SECRET} (key auth_token)" in str(err.value) and str(path) in str(err.value)


def test_a_refusal_says_whether_a_token_was_sent_and_never_shows_it(tmp_path):
    path = tmp_path / "auth_token"
    path.write_text("s3cr3t")
    wrong = refusal("http://head:8265", {TOKEN_PATH_ENV: str(path), SECRET_ENV: SECRET})
    assert wrong.startswith("the Ray cluster at http://head:8265 refused this client's token: ")
    assert f"Secret {SECRET}" in wrong and "s3cr3t" not in wrong
    assert "s3cr3t" not in refusal("http://head:8265", {TOKEN_ENV: "s3cr3t"})
    missing = refusal("http://head:8265", {SECRET_ENV: SECRET})
    assert "requires a token and none was sent" in missing
    assert "neither RAY_AUTH_TOKEN nor RAY_AUTH_TOKEN_PATH is set" in missing
