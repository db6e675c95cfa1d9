from tests.support.run_api import local_api, local_sts, team_api  # noqa: F401 (fixtures of this directory)
