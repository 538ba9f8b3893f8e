"""Index and download requests that outlast a brief network fault.

CI once failed 53 s in on a single `Temporary failure in name resolution` from
PyPI (lock-wheels). pip and uv retry such faults; our own requests do the same:
a refused or reset connection, a failed name lookup, a timeout, or HTTP 408, 429,
500, 502, 503 or 504 is tried again after 2, 4, 8, 16 and 30 s (one minute in all),
saying so on stderr. Anything else (404, a bad certificate, a local path) fails at once.
"""

from __future__ import annotations

import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from http.client import HTTPResponse

DELAYS: tuple[float, ...] = (2, 4, 8, 16, 30)
TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})


def transient(exc: BaseException) -> bool:
    """Whether trying the same request again later may succeed."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in TRANSIENT_HTTP
    if isinstance(exc, urllib.error.URLError):  # its reason: gaierror, refused, timeout…
        return isinstance(exc.reason, OSError) and transient(exc.reason)
    permanent = ssl.SSLCertVerificationError, FileNotFoundError, PermissionError
    return isinstance(exc, OSError) and not isinstance(exc, permanent)


def urlopen(
    request: urllib.request.Request | str,
    *,
    context: ssl.SSLContext | None,
    timeout: float,
    delays: Sequence[float] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> HTTPResponse:
    """urllib's urlopen, tried again on a transient fault (see the module's text)."""
    url = request.full_url if isinstance(request, urllib.request.Request) else request
    local = url.startswith("file:")
    delays = DELAYS if delays is None else delays
    for attempt, delay in enumerate([*delays, None], start=1):
        try:
            return urllib.request.urlopen(request, context=context, timeout=timeout)
        except OSError as exc:  # URLError and HTTPError are OSErrors
            if local or delay is None or not transient(exc):
                raise
            reason = getattr(exc, "reason", None) or exc
            print(
                f"network: {url}: {reason}; try {attempt + 1} of {len(delays) + 1} in {delay:g} s",
                file=sys.stderr,
                flush=True,
            )
            sleep(delay)
    raise AssertionError("unreachable")
