"""training/api/settings.py: the run API's environment, read once; a bad variable named."""

from __future__ import annotations

import json


def test_the_team_queues_variable_is_read_once_and_a_bad_one_named(tmp_path):
    import pytest

    from contract.env import API_CLUSTER_ID_ENV, API_STS_ENDPOINT_ENV, API_TEAM_QUEUES_ENV, API_TEAMS_FILE_ENV
    from training.api.settings import ApiConfigError, settings_from_env
    from tests.support.run_api import TEAMS

    teams = tmp_path / "teams.json"
    teams.write_text(json.dumps(TEAMS))
    env = {API_CLUSTER_ID_ENV: "c", API_STS_ENDPOINT_ENV: "https://sts.us-west-2.amazonaws.com",
           API_TEAMS_FILE_ENV: str(teams)}
    assert settings_from_env(env).team_queues == {}
    good = {"search": {"namespace": "ragpool-team-search", "queue": "search", "facts": {}}}
    assert settings_from_env({**env, API_TEAM_QUEUES_ENV: json.dumps(good)}).team_queues["search"].queue_namespace \
        == "search"
    rooted = {"search": {**good["search"], "shared_root": "/mnt/teams/search"}}
    assert settings_from_env({**env, API_TEAM_QUEUES_ENV: json.dumps(rooted)}).team_queues["search"].shared_root \
        == "/mnt/teams/search", "where the API reads the team's runs"
    with pytest.raises(ApiConfigError, match=f"{API_TEAM_QUEUES_ENV}"):
        settings_from_env({**env, API_TEAM_QUEUES_ENV: "{not json"})
