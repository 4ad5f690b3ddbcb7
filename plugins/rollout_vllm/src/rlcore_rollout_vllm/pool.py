"""A pool of engine servers: least-busy load balancing, and retries on another server.

A request that fails with a connection error, a timeout or a 5xx answer marks its server
down and is sent again, whole, to another one, so no prompt loses samples. A 4xx answer is
the engine rejecting the request: it is not retried and its message is reported.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

import httpx
from loguru import logger

from rlcore.errors import RlcoreError

T = TypeVar("T")


class ServerError(RlcoreError):
    """A server could not be reached, died, or refused a request."""


class RejectedError(ServerError):
    """The engine answered with a 4xx error: retrying elsewhere would not help."""


def describe_http_error(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        text = exc.response.text.strip().replace("\n", " ")
        return f"HTTP {exc.response.status_code}: {text[:500]}"
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({exc})"
    if isinstance(exc, httpx.TimeoutException):
        return f"timed out ({type(exc).__name__})"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the connection broke off ({exc})"
    return f"{type(exc).__name__}: {exc}"


class ServerPool:
    def __init__(
        self,
        urls: Sequence[str],
        *,
        engine: str,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 2,
        max_concurrency: int = 64,
        api_key: str | None = None,
    ):
        if not urls:
            raise RlcoreError(f"{engine}: no servers given")
        self.urls = list(urls)
        self.engine = engine
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers=headers,
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._lock = threading.Lock()
        self._busy = {u: 0 for u in self.urls}
        self.down: dict[str, str] = {}  # url -> why

    # ------------------------------------------------------------------ plain calls

    def request(self, url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One HTTP call; failures become a :class:`ServerError` naming the server."""
        try:
            response = self.client.request(method, url + path, **kwargs)
            response.raise_for_status()
            return response
        except httpx.HTTPStatusError as exc:
            kind = RejectedError if exc.response.status_code < 500 else ServerError
            raise kind(f"{self.engine} server {url} {method} {path}: {describe_http_error(exc)}") from None
        except httpx.HTTPError as exc:
            raise ServerError(f"{self.engine} server {url} {method} {path}: {describe_http_error(exc)}") from None

    def check_health(self, path: str = "/health") -> None:
        """Every server must answer ``path``; the error lists each one that does not."""
        problems = []
        for url in self.urls:
            try:
                self.request(url, "GET", path)
            except ServerError as exc:
                problems.append(str(exc))
        if problems:
            raise ServerError("unreachable servers:\n  " + "\n  ".join(problems))

    def broadcast(self, method: str, path: str, what: str, **kwargs: Any) -> list[httpx.Response]:
        """Send one call to every server (weight updates, sleep); any failure names the server."""
        live = [u for u in self.urls if u not in self.down]
        if not live:
            raise ServerError(f"{what} failed: every server is down: " + "; ".join(f"{u}: {w}" for u, w in self.down.items()))
        if len(live) < len(self.urls):
            logger.warning("{}: skipping servers marked down: {}", what, ", ".join(sorted(self.down)))
        out = []
        for url in live:
            try:
                out.append(self.request(url, method, path, **kwargs))
            except ServerError as exc:
                raise type(exc)(f"{what} failed: {exc}") from None
        return out

    # ------------------------------------------------------------------ balanced, retried calls

    def _pick(self, exclude: set[str]) -> str | None:
        with self._lock:
            live = [u for u in self.urls if u not in exclude and u not in self.down]
            if not live:
                return None
            url = min(live, key=lambda u: self._busy[u])
            self._busy[url] += 1
            return url

    def _release(self, url: str) -> None:
        with self._lock:
            self._busy[url] -= 1

    def call(self, fn: Callable[[str], T], what: str) -> T:
        """Run ``fn(url)`` on the least busy live server, retrying on others when one fails."""
        tried: list[str] = []
        errors: list[str] = []
        for _ in range(self.max_retries + 1):
            url = self._pick(set(tried))
            if url is None:
                break
            tried.append(url)
            try:
                return fn(url)
            except RejectedError:
                raise
            except ServerError as exc:
                errors.append(str(exc))
                with self._lock:
                    self.down[url] = str(exc)
                logger.warning("{}: {}; retrying on another server", what, exc)
            finally:
                self._release(url)
        down = "; ".join(f"{u}: {why}" for u, why in self.down.items() if u not in tried)
        raise ServerError(
            f"{what} failed on every server tried ({', '.join(tried) or 'none left'}):\n  "
            + "\n  ".join(errors or ["no live server"])
            + (f"\n  already down: {down}" if down else "")
        )

    def map(self, fn: Callable[[str, T], Any], items: Sequence[T], what: str) -> list[Any]:
        """``fn(url, item)`` for every item, concurrently, results in item order."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
            futures = [pool.submit(self.call, lambda url, it=item: fn(url, it), f"{what} (request {i})") for i, item in enumerate(items)]
            return [f.result() for f in futures]

    def close(self) -> None:
        self.client.close()
