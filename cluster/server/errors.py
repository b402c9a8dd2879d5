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
