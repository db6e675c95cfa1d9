"""contract/api.py: the teams mapping both the stack and the run API parse, and the status <-> exit code maps."""

from __future__ import annotations

import pytest

from contract import exit_codes
from contract.api import ERROR_STATUS, EXIT_OF_STATUS, STATUS_OF_EXIT, TeamsError, parse_api_teams
from contract.env import API_TEAM_QUEUES_ENV as QUEUES


def test_teams_match_arns_and_admins():
    teams = parse_api_teams({"teams": {"b": ["arn:aws:iam::123456789012:role/ml-*"],
                                       "a": ["arn:aws:iam::123456789012:user/alice"]},
                             "admins": ["arn:aws:iam::123456789012:role/admin"]})
    assert teams.team_of("arn:aws:iam::123456789012:role/ml-x") == "b"
    assert teams.team_of("arn:aws:iam::123456789012:user/alice") == "a"
    assert teams.team_of("arn:aws:iam::999999999999:role/ml-x") is None, "another account"
    assert teams.is_admin("x", "arn:aws:iam::123456789012:role/admin")
    assert not teams.is_admin("arn:aws:iam::123456789012:role/admin2")


@pytest.mark.parametrize("raw, key", [
    ([], "apiTeams"),
    ({"teams": {"a": []}}, "apiTeams.teams.a"),
    ({"teams": {"a": ["*"]}}, "apiTeams.teams.a[0]"),
    ({"teams": {"a": ["arn:aws:iam::*:role/x"]}}, "apiTeams.teams.a[0]"),
    ({"teams": {"a": ["arn:aws:iam::123456789012:role/x\n"]}}, "apiTeams.teams.a[0]"),
    ({"teams": {"A_b": ["arn:aws:iam::123456789012:role/x"]}}, "apiTeams.teams"),
    ({"teams": [], "admins": []}, "apiTeams.teams"),
    ({"admins": "arn:aws:iam::123456789012:role/x"}, "apiTeams.admins"),
    ({"team": {}}, "apiTeams.team"),
])
def test_bad_teams_name_the_key(raw, key):
    with pytest.raises(TeamsError) as err:
        parse_api_teams(raw)
    assert key in [k for k, _ in err.value.problems], err.value.problems


def test_every_exit_code_has_a_status_and_back():
    for code, status in STATUS_OF_EXIT.items():
        assert EXIT_OF_STATUS[status] == code
    assert set(ERROR_STATUS.values()) - {500} <= set(EXIT_OF_STATUS)
    assert EXIT_OF_STATUS[401] == exit_codes.BAD_INPUT, "a refused token is never retried"


@pytest.mark.parametrize("raw, key", [
    ([], QUEUES),
    ({"Bad": {"namespace": "ragpool-team-a", "queue": "a", "facts": {}}}, QUEUES),
    ({"a": {"namespace": "ragpool-team-a", "queue": "a"}}, f"{QUEUES}.a"),
    ({"a": {"namespace": "ragpool-team-a", "queue": "A:", "facts": {}}}, f"{QUEUES}.a.queue"),
    ({"a": {"namespace": "ragpool-team-a", "queue": "a", "facts": {"HOME": "/"}}}, f"{QUEUES}.a.facts.HOME"),
])
def test_bad_team_queues_name_the_key(raw, key):
    from contract.api import parse_team_queues

    with pytest.raises(TeamsError) as err:
        parse_team_queues(raw, QUEUES)
    assert err.value.problems[0][0] == key


def test_team_queues_round_trip():
    from contract.api import TeamQueue, fact_keys, parse_team_queues

    q = TeamQueue("a", "ragpool-team-a", "a", {fact_keys()[1]: "torchrun"})
    assert parse_team_queues({"a": q.to_json()}, "k") == {"a": q}
    rooted = TeamQueue("a", "ragpool-team-a", "a", {}, "/mnt/teams/a")
    assert parse_team_queues({"a": rooted.to_json()}, "k") == {"a": rooted}
    with pytest.raises(TeamsError) as err:
        parse_team_queues({"a": {**rooted.to_json(), "shared_root": "relative/a"}}, "k")
    assert err.value.problems[0][0] == "k.a.shared_root"
