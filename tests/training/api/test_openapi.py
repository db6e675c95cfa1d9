"""``/openapi.json`` is the server's routes: every route documented, every documented operation routed."""

from __future__ import annotations

from training.api.openapi import openapi


def test_the_document_matches_the_routes(local_api):
    from tests.training.api.test_server import raw

    routed = set()
    for resource in local_api.api.app().router.resources():
        for route in resource:
            if route.method != "HEAD":
                routed.add((route.method.lower(), resource.canonical))
    status, served = raw(local_api, "GET", "/openapi.json", user=None)
    assert status == 200 and served == openapi()
    documented = {(method, path) for path, ops in served["paths"].items() for method in ops}
    assert routed == documented


def test_the_document_is_valid_openapi():
    import schemathesis

    schema = schemathesis.openapi.from_dict(openapi())
    assert all(result.ok() for result in schema.get_all_operations())
