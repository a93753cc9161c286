"""A ModelStatusSource with no workers, for gateway tests whose subject is not model or worker state."""

from __future__ import annotations


class NoWorkers:
    """Every model available, no worker known."""

    def status(self, model_id: str) -> tuple[str, None]:
        return "available", None

    def workers(self) -> list:
        return []
