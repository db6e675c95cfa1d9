from tests.support.run_api import local_api, local_sts  # noqa: F401 (fixtures of this directory)
