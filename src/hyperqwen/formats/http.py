"""The one small HTTP helper of the synchronous callers (verify, the bench's environment fetch, prepare).

Standard library only (urllib), so a base install has it. Every call has a timeout; the API key goes into an
`Authorization: Bearer` header and nowhere else: it is never part of an error message, a log line or a
repr (`HttpError` carries the URL and status only).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT_S = 30.0


class HttpError(OSError):
    """The server could not be reached (connection refused, DNS, timeout). Names the URL, never the key."""

    def __init__(self, method: str, url: str, reason: str):
        super().__init__(f"{method} {url}: {reason}")
        self.url = url
        self.reason = reason


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)

    def brief(self, limit: int = 200) -> str:
        """The body on one line, cut to `limit` characters, for error messages."""
        text = self.text().strip().replace("\n", " ")
        return text if len(text) <= limit else text[: limit - 3] + "..."


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def request(
    method: str,
    url: str,
    *,
    api_key: str | None = None,
    payload: Any = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    headers: dict[str, str] | None = None,
) -> Response:
    """One HTTP request. Any HTTP status is a Response (4xx/5xx included); no answer at all is HttpError."""
    sent = {"Accept": "application/json", **auth_headers(api_key), **(headers or {})}
    data = None
    if payload is not None:
        data = json.dumps(payload).encode()
        sent["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, method=method, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read())
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read())
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise HttpError(method, url, str(reason)) from None


def get(url: str, **kwargs: Any) -> Response:
    return request("GET", url, **kwargs)


def post(url: str, payload: Any, **kwargs: Any) -> Response:
    return request("POST", url, payload=payload, **kwargs)
