"""ASGI entry point for uvicorn: `query_api.main:app`."""

from query_api.app import create_app

app = create_app()
