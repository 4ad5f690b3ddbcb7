"""A pool of inference servers seen as one: least-busy balancing, whole-request retries on
another server, failures that name the server, and rejoining once ``/health`` answers again.

A request that fails with a connection error, a timeout or a 5xx answer (or one of the
engine's own ``retry_on`` errors) marks its server down and is sent again, whole, to another
live server, so no prompt loses samples. A 4xx answer is the engine refusing the request
itself: retrying elsewhere would not help, so it is raised at once as :class:`RejectedError`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from loguru import logger

from rlcore.errors import RlcoreError

T = TypeVar("T")
R = TypeVar("R")


class ServerError(RlcoreError):
    """A server could not be reached, died, answered 5xx, or failed the request otherwise."""


class RejectedError(ServerError):
    """A server answered 4xx: the request (or update) itself was refused."""


def describe_http_error(exc: BaseException) -> str:
    """One line saying what went wrong with an HTTP call, for error messages."""
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
    """Servers of one engine. ``engine`` names them in messages ("vLLM", "SGLang");
    ``retry_on`` adds engine errors that mean "this server failed, try another";
    ``rejoin`` lets servers marked down come back at the next :meth:`map` when their health
    path answers."""

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
        health_path: str = "/health",
        retry_on: tuple[type[BaseException], ...] = (),
        rejoin: bool = True,
    ):
        if not urls:
            raise RlcoreError(f"{engine}: no servers given")
        self.urls = list(urls)
        self.engine = engine
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.health_path = health_path
        self.retry_on = (ServerError, *retry_on)
        self.rejoin = rejoin
        self.client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._lock = threading.Lock()
        self._busy = dict.fromkeys(self.urls, 0)
        self.down: dict[str, str] = {}  # url -> why it was marked down

    @classmethod
    def from_options(cls, options: Any, *, engine: str, **extra: Any) -> ServerPool:
        """A pool from an engine's server options (``servers``, ``request_timeout_s``,
        ``connect_timeout_s``, ``max_retries``, ``max_concurrency``, ``api_key``), which every
        server-mode engine names alike."""
        return cls(
            options.servers,
            engine=engine,
            timeout_s=options.request_timeout_s,
            connect_timeout_s=options.connect_timeout_s,
            max_retries=options.max_retries,
            max_concurrency=options.max_concurrency,
            api_key=options.api_key,
            **extra,
        )

    # ------------------------------------------------------------------ single calls

    def request(self, url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One HTTP call; any failure becomes a :class:`ServerError` naming the server."""
        try:
            response = self.client.request(method, url + path, **kwargs)
            response.raise_for_status()
            return response
        except httpx.HTTPStatusError as exc:
            kind = RejectedError if exc.response.status_code < 500 else ServerError
            raise kind(f"{self.engine} server {url} {method} {path}: {describe_http_error(exc)}") from None
        except httpx.HTTPError as exc:
            raise ServerError(
                f"{self.engine} server {url} {method} {path}: {describe_http_error(exc)}"
            ) from None

    def check_health(self) -> None:
        """Every server must answer the health path; the error lists each one that does not."""
        problems = []
        for url in self.urls:
            try:
                self.request(url, "GET", self.health_path)
            except ServerError as exc:
                problems.append(str(exc))
        if problems:
            raise ServerError(f"unreachable {self.engine} servers:\n  " + "\n  ".join(problems))

    def revive(self) -> None:
        """Bring back servers marked down that answer the health path again."""
        for url in list(self.down):
            try:
                self.request(url, "GET", self.health_path)
            except ServerError:
                continue
            logger.info("{} server {} is healthy again", self.engine, url)
            with self._lock:
                self.down.pop(url, None)

    def broadcast(self, method: str, path: str, what: str, **kwargs: Any) -> list[httpx.Response]:
        """The same call on every live server (weight updates, sleep); the first failure is
        raised naming the server, because servers must not drift apart silently."""
        live = [u for u in self.urls if u not in self.down]
        if not live:
            down = "; ".join(f"{u}: {w}" for u, w in self.down.items())
            raise ServerError(f"{what} failed: every {self.engine} server is down: {down}")
        if len(live) < len(self.urls):
            logger.warning(
                "{}: skipping {} servers marked down: {}", what, self.engine, ", ".join(sorted(self.down))
            )
        out = []
        for url in live:
            try:
                out.append(self.request(url, method, path, **kwargs))
            except ServerError as exc:
                raise type(exc)(f"{what} failed: {exc}") from None
        return out

    # ------------------------------------------------------------------ balanced, retried calls

    def _take(self, tried: set[str]) -> str | None:
        with self._lock:
            live = [u for u in self.urls if u not in tried and u not in self.down]
            if not live:
                return None
            url = min(live, key=self._busy.__getitem__)
            self._busy[url] += 1
            return url

    def _give(self, url: str) -> None:
        with self._lock:
            self._busy[url] -= 1

    def call(self, fn: Callable[[str], R], what: str) -> R:
        """``fn(url)`` on the least busy live server; on a server failure, again on another."""
        tried: list[str] = []
        errors: list[str] = []
        for _ in range(self.max_retries + 1):
            url = self._take(set(tried))
            if url is None:
                break
            tried.append(url)
            try:
                return fn(url)
            except RejectedError:
                raise
            except self.retry_on as exc:
                errors.append(str(exc))
                with self._lock:
                    self.down[url] = str(exc)
                logger.warning("{}: {}; sending it to another server", what, exc)
            finally:
                self._give(url)
        elsewhere = "; ".join(f"{u}: {why}" for u, why in self.down.items() if u not in tried)
        raise ServerError(
            f"{what} failed on every {self.engine} server tried ({', '.join(tried) or 'none live'}):\n  "
            + "\n  ".join(errors or ["no live server"])
            + (f"\n  already down: {elsewhere}" if elsewhere else "")
        )

    def map(self, fn: Callable[[str, T], R], items: Sequence[T], what: str) -> list[R]:
        """``fn(url, item)`` for every item (one prompt each), concurrently across servers;
        results in item order."""
        if not items:
            return []
        if self.rejoin:
            self.revive()
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
            futures = [
                pool.submit(self.call, lambda url, item=item: fn(url, item), f"{what} (prompt {i})")
                for i, item in enumerate(items)
            ]
            return [f.result() for f in futures]

    def close(self) -> None:
        self.client.close()
