"""What every fuzzed answer must satisfy: never a 5xx, and a row exactly when the answer says stored."""

from __future__ import annotations


def newest_id(conn) -> int:
    return conn.execute("SELECT coalesce(max(id), 0) FROM deliveries").fetchone()[0]


def check_answer(conn, before: int, status: int, answer: dict, good_token: bool | None) -> int:
    """Returns the newest id after the answer: the next request's `before`."""
    assert status < 500, answer
    if good_token is False:
        assert status == 401
    if good_token is True:
        assert status != 401
    after = newest_id(conn)
    if status == 200 and answer.get("status") == "stored":
        assert after > before  # ids have gaps: a duplicate's INSERT still draws from the sequence
        assert conn.execute("SELECT rid FROM deliveries WHERE id = %s", (after,)).fetchone()[0] == answer["rid"]
    else:
        assert after == before, (status, answer)  # refused, duplicate or probe: no row
    return after
