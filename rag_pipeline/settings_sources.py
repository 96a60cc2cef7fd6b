"""Where the settings are read from, besides the environment: the checkout this code runs from,
its `.env` (or the one file RAG_ENV_FILE names), what `make run` set for its processes
(`$RAG_HOME/run.env`, the lowest source), and the token files `make run` generates.

Kept apart from the fields (settings.py) because every process needs these paths before it has
settings: the default RAG_HOME is found here, and so is the file of each source."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# The checkout that holds this code (an editable install, as `make run` makes), if it is one.
CHECKOUT = Path(__file__).resolve().parents[1]


def checkout_dir() -> Path | None:
    return CHECKOUT if (CHECKOUT / "workspace.yaml").is_file() and (CHECKOUT / "pyproject.toml").is_file() else None


def default_rag_home() -> Path:
    """The checkout's `.rag` wherever the shell is; installed elsewhere, a per-user directory.

    Never the current directory: a command run from elsewhere must find the same index, not
    start an empty one beside the user.
    """
    checkout = checkout_dir()
    if checkout is not None:
        return checkout / ".rag"
    import platformdirs

    return Path(platformdirs.user_data_dir("rag-pipeline"))


def env_files() -> tuple[Path, ...]:
    """The checkout's `.env`, or the one file RAG_ENV_FILE names. Never the working directory's:
    a `.env` in whatever directory a command runs from could send OPENAI_API_KEY to a host of its
    choosing."""
    named = os.environ.get("RAG_ENV_FILE")
    if named:
        return (Path(named).expanduser(),)
    return (checkout_dir() / ".env",) if checkout_dir() else ()


def token_file(path: Path) -> str | None:
    """A token `make run` generated (0600, one line), or None where there is none."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return token or None


RUN_ENV = "run.env"


def run_env_file() -> Path:
    """`$RAG_HOME/run.env`: what `make run` set for its processes (scripts/setup.sh writes it at start).

    RAG_HOME as the environment, else the `.env`, else the default says: found before the settings,
    whose lowest source this file is."""
    home = os.environ.get("RAG_HOME") or _dotenv(env_files()).get("RAG_HOME")
    return (Path(home).expanduser().absolute() if home else default_rag_home()) / RUN_ENV


def deployment_values() -> dict[str, str]:
    """What the running deployment was given besides the shell's environment: `.env` winning over
    run.env (the same order as the settings' sources)."""
    return {**_dotenv((run_env_file(),)), **_dotenv(env_files())}


@contextmanager
def deployment_environment() -> Iterator[None]:
    """For the time of a CLI command, os.environ as the deployment's processes see it: a variable of
    `.env` or run.env that the shell lacks is set (the shell's own always wins). A site's defs.yaml
    reads `env('SAMPLE_SITE_URL')` from os.environ, not from the settings; restored after, so that a
    test invoking commands in its own process keeps its environment."""
    added = {name: value for name, value in deployment_values().items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _dotenv(files) -> dict[str, str]:
    from dotenv import dotenv_values

    values: dict[str, str] = {}
    for path in files:
        if path.is_file():
            values.update({k: v for k, v in dotenv_values(path).items() if v is not None})
    return values
