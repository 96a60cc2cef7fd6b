"""Loopback fakes of the external services, so tests exercise real HTTP with no network."""

from rag_pipeline_tests.fakes.openai_server import FakeCall, FakeOpenAI

__all__ = ["FakeCall", "FakeOpenAI"]
