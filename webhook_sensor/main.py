"""ASGI entry point for uvicorn: `webhook_sensor.main:app`."""

from webhook_sensor.app import create_app

app = create_app()
