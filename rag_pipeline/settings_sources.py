"""Where the settings are read from, besides the environment: the checkout this code runs from,
its `.env` (or the one file RAG_ENV_FILE names), and the token files `make run` generates.

Kept apart from the fields (settings.py) because every process needs these paths before it has
settings: the default RAG_HOME is found here, and so is the file of each source."""

from __future__ import annotations

import os
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
