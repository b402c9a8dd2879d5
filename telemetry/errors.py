"""The telemetry error (SPEC §3: bad rows are rejected with an error naming table, row, column)."""

from __future__ import annotations


class TelemetryError(ValueError):
    """Telemetry input or storage failed; the message says what was wrong and what is allowed.

    Validation errors also carry `table`, `row` (0-based within the rejected batch) and
    `column` so callers can point at the offending value programmatically.
    """

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        row: int | None = None,
        column: str | None = None,
    ) -> None:
        super().__init__(message)
        self.table = table
        self.row = row
        self.column = column
