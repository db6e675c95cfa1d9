"""Talking to the CrossGuard pack as the Pulumi engine does: resource URNs, properties as a protobuf Struct,
one Analyze call. The served pack itself is the module fixture ``analyzer`` (tests/policy/conftest.py)."""

from __future__ import annotations


def urn(stack: str, entry: dict) -> str:
    return f"urn:pulumi:{stack}::ragpool::{entry['type']}::{entry['name']}"


def to_struct(value: dict):
    from google.protobuf import struct_pb2

    s = struct_pb2.Struct()
    s.update(value)  # like the engine, this turns every number into a float
    return s


def analyze(analyzer, stack: str, entry: dict):
    """The served pack's diagnostics for one plan resource (an AnalyzeResponse)."""
    from pulumi.runtime.proto import analyzer_pb2

    return analyzer.Analyze(analyzer_pb2.AnalyzeRequest(
        type=entry["type"], name=entry["name"], urn=urn(stack, entry), properties=to_struct(entry["inputs"]),
        options=analyzer_pb2.AnalyzerResourceOptions(protect=bool(entry.get("protect")))), timeout=30)
