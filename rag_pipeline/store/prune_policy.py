"""What a prune keeps and for how long (`Policy`, from the *_RETENTION_DAYS settings), and what it did
(`PruneResult`): the walks themselves are in `store/retention.py` and `store/growth.py`."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rag_pipeline.settings import Settings


class PruneBusy(RuntimeError):
    """Another prune holds the lock: two walks would only trip over each other."""


@dataclass(frozen=True)
class Policy:
    """Days each kind of row is kept once no longer needed; 0 keeps it forever."""

    delivery_days: int = 14
    push_days: int = 30
    vector_days: int = 30
    batch_size: int = 2000
    ledger_days: int = 90           # ledger rows older roll up into daily totals
    retired_space_days: int = 14    # a retired space's table is dropped after
    # Crawl observations kept per page (the newest): the change-rate estimate reads CADENCE_HISTORY.
    observations_kept: int = 64

    def __post_init__(self) -> None:
        for name in ("delivery_days", "push_days", "vector_days", "ledger_days", "retired_space_days"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 keeps forever), not {getattr(self, name)}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")
        if self.observations_kept < 1:
            raise ValueError(f"observations_kept must be >= 1, not {self.observations_kept}")

    def days(self) -> dict[str, int]:
        return {"deliveries": self.delivery_days, "pushes": self.push_days, "vectors": self.vector_days}

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        return cls(settings.delivery_retention_days, settings.push_retention_days,
                   settings.vector_retention_days, settings.prune_batch_size,
                   ledger_days=settings.ledger_retention_days,
                   retired_space_days=settings.retired_space_retention_days,
                   observations_kept=2 * settings.cadence_history)   # room to raise CADENCE_HISTORY


@dataclass
class PruneResult:
    dry_run: bool
    deliveries: int = 0          # deleted (or, in a dry run, that would be)
    pushes: int = 0
    vectors: int = 0
    vectors_unused: int = 0      # unused vectors still kept for reuse after this prune
    ended_batches: int = 0       # batch records (`batches`), ended over delivery_days ago
    observations: int = 0        # crawl observations beyond the newest `observations_kept` of a page
    ledger_rolled_up: int = 0    # ledger rows summed into daily totals
    retired_tables: list[int] = field(default_factory=list)   # spaces whose retired table was dropped
    batches: dict[str, int] = field(default_factory=dict)   # transactions per table
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self, policy: Policy) -> list[str]:
        """One line per table, for a person."""
        verb = "would delete" if self.dry_run else "deleted"
        out = []
        for name, days, count, what in (
            ("deliveries", policy.delivery_days, self.deliveries, "settled, received over {} d ago"),
            ("pushes", policy.push_days, self.pushes, "finished, pushed over {} d ago"),
            ("vectors", policy.vector_days, self.vectors, "unused for over {} d"),
        ):
            line = f"{name}: kept forever" if days == 0 else f"{name}: {verb} {count} ({what.format(days)})"
            if name == "deliveries" and days:
                line += f"; {self.ended_batches} ended batch record(s)"
            if name == "vectors" and days:
                line += f"; {self.vectors_unused} unused kept for reuse"
            out.append(line)
        out.append(f"crawl observations: {verb} {self.observations} (beyond the newest "
                   f"{policy.observations_kept} of each page)")
        if policy.ledger_days:
            out.append(f"ledger: {'would roll up' if self.dry_run else 'rolled up'} {self.ledger_rolled_up} row(s) "
                       f"older than {policy.ledger_days} d into daily totals")
        if policy.retired_space_days:
            spaces = ", ".join(map(str, self.retired_tables)) or "none"
            out.append(f"retired spaces' tables: {'would drop' if self.dry_run else 'dropped'} {spaces} "
                       f"(retired over {policy.retired_space_days} d ago, not kept)")
        return out
