"""A bad setting as one line naming the variable, never a pydantic traceback, and never echoing a
secret's value: what the CLI prints, what a tick fails with, what a server refuses to start with."""

from __future__ import annotations

import re

from pydantic import ValidationError


class SettingsError(ValueError):
    """A setting has a value it cannot take; the message is one line naming the variable."""


SECRET_NAME = re.compile(r"(_KEY|_TOKEN|PASSWORD|SECRET)$")


def describe_errors(exc: ValidationError) -> str:
    """`CHUNK_MAX_TOKENS='10': Input should be greater than or equal to 32` (every bad variable)."""
    parts = []
    for error in exc.errors():
        if not error["loc"]:   # a rule across several variables: its message names them
            parts.append(error["msg"].removeprefix("Value error, "))
            continue
        name = ".".join(str(part) for part in error["loc"])
        shown = "'***'" if SECRET_NAME.search(name) else repr(error.get("input"))   # never echo a secret
        parts.append(f"{name}={shown}: {error['msg'].removeprefix('Value error, ')}")
    return "bad setting " + "; ".join(parts)
