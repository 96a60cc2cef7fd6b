"""What the daemon tests share: the pages they deliver and how they wait for them (the daemon stack
itself is the `stack` fixture of conftest.py)."""

from __future__ import annotations

def url(n: int) -> str:
    return f"https://docs.example.com/daemon/{n}"


def page(n: int, extra: str = "") -> str:
    return (f"# Page {n}\n\nPage {n} explains the heron gate number {n}.{extra}\n\n"
            f"## Setup\n\nGate {n} opens at {n % 12} o'clock and closes at dusk.")


def applied(conn, n: int) -> bool:
    return conn.execute("SELECT count(*) FROM deliveries WHERE outcome = 'embedded'").fetchone()[0] >= n


def sources_taken(conn) -> int:
    """Pages whose run took their delivery as source (its `pages` step committed), not switched yet."""
    return conn.execute("SELECT count(*) FROM pages WHERE source_delivery_id IS NOT NULL"
                        " AND indexed_hash IS DISTINCT FROM source_hash").fetchone()[0]


def long_page(n: int, extra: str = "") -> str:
    """A page of several paragraphs: a smaller chunk budget cuts it into new texts."""
    paragraphs = [f"Paragraph {i} of page {n} tells how the heron gate {n} works on day {i}, "
                  f"which lever opens it and why the keeper logs it.{extra if i == 3 else ''}"
                  for i in range(6)]
    return f"# Page {n}\n\n" + "\n\n".join(paragraphs)
