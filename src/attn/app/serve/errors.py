"""The server's errors: one JSON shape for every failure, whatever raised it.

Every error body is `{"error": {"message", "type", "param", "code"}}` with the HTTP status in `code`. Routes
raise `ApiError`; `install_error_handlers` turns validation errors, 404/405, a full queue and anything
unexpected into the same shape, so a client never sees a traceback or `{"detail": ...}`.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from attn.app.serve.engine import QueueFull
from attn.core.errors import AttnError

log = logging.getLogger("attn.serve")

_TYPES = {429: "rate_limit_error"}


class ApiError(Exception):
    """A request the server answers with an error.

    Args:
        message: what was wrong and what to do.
        param: the request field at fault, if one is.
    """

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_body(status: int, message: str, param: str | None = None) -> dict[str, dict[str, object]]:
    """The JSON body of an error with HTTP status `status`."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status, headers=headers)


def _validation_message(error: dict) -> tuple[str, str | None]:
    """(message, param) of pydantic's first complaint about a request body."""
    if error.get("type") == "json_invalid":
        reason = error.get("ctx", {}).get("error", "parse error")
        return f"the body is not valid JSON ({reason}); send a JSON object", None
    # The path after "body", without the names pydantic gives the alternatives of a union (`str`, `list[str]`).
    location = [str(part) for part in error.get("loc", ())[1:] if isinstance(part, int) or part not in _UNION_TAGS]
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, AttnError) and cause.field is not None:  # our check, which names the field at fault
        location += [] if location[-1:] == [cause.field] else [cause.field]
        message = cause.detail
    if error.get("type") == "extra_forbidden":
        message = ("is not supported by this server; leave it out (docs/serve-api.md lists the fields each route "
                   "reads)")
    param = ".".join(location) or None
    return (f"{param}: {message}" if param else message), param


_UNION_TAGS = {"str", "int", "float", "bool", "list[str]", "list[int]", "list[TextPart]"}


def install_error_handlers(app: FastAPI) -> None:
    """Answers every failure with the contract's JSON error."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error.status, error.message, error.param)

    @app.exception_handler(QueueFull)
    async def queue_full(request: Request, error: QueueFull) -> JSONResponse:
        seconds = max(1, round(error.retry_after_s))
        return error_response(429, f"the model's queue is full; retry after {seconds} s", None,
                              {"Retry-After": str(seconds)})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        # The deepest complaint: of a union's alternatives, the one whose shape the body took.
        errors = sorted(error.errors(), key=lambda e: -len(e.get("loc", ())))
        message, param = _validation_message(errors[0]) if errors else ("invalid request", None)
        return error_response(422, message, param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        message = {404: f"no route {request.url.path}; see /docs for the routes",
                   405: f"{request.method} is not allowed on {request.url.path}; see /docs"}.get(
            error.status_code, str(error.detail))
        if isinstance(bad := error.__cause__, UnicodeDecodeError):  # FastAPI's 400 for a body it cannot decode
            message = (f"the body is not valid UTF-8 (byte 0x{bad.object[bad.start]:02x} at offset {bad.start}); "
                       "send JSON encoded as UTF-8")
        return error_response(error.status_code, message, None, getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def internal(request: Request, error: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        return error_response(500, f"internal error ({type(error).__name__}); the server log has the details")
