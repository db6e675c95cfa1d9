"""Fixtures every test directory may use; helpers live in ``tests/support`` (imported as ``tests.support``)."""

pytest_plugins = ["tests.support.redis_fixtures", "tests.support.ci_skips"]
