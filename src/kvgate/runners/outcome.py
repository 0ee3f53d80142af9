"""What one stage of one cell came to: the status written to status.json and the line printed for it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class StageOutcome:
    cell_id: str
    stage: str  # kernels | accuracy | probe | throughput
    status: str  # ok | error | timeout | skipped
    elapsed: float = 0.0
    headline: str = ""  # e.g. "gsm8k strict 0.652 flexible 0.660 (n=1319)", "394.8 output tok/s"
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def failed(self) -> bool:
        """error or timeout; a skipped stage (e.g. GPU kernel tests on a CPU machine) is no failure."""
        return self.status in ("error", "timeout")
