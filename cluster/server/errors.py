"""Errors a client of the control server can cause (SPEC §6), each with its HTTP status.

The message says what was wrong and what is allowed; app.py returns it as {"detail": ...}.
"""

from __future__ import annotations


class ApiError(Exception):
    """A request the server refuses; `status` is the HTTP status, the message says why."""

    status = 400


class NotFoundError(ApiError):
    status = 404


class ConflictError(ApiError):
    status = 409


class InvalidRequestError(ApiError):
    status = 422


class UnavailableError(ApiError):
    status = 503


def clip(text: str, max_chars: int = 80) -> str:
    """`text` cut to `max_chars` characters (an ellipsis marks the cut): input quoted back in
    a message stays short whatever a client sent."""
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"
