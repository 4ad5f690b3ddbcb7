"""Several SGLang servers as one: least-busy balancing, whole-request retries, named failures.

A request that fails with a connection error, a timeout, a 5xx answer or an SGLang abort marks
its server down and is sent again, whole, to another live server, so a prompt never loses
samples. A 4xx answer is SGLang refusing the request itself: retrying elsewhere would not help,
so it is reported at once. A server marked down rejoins when it answers ``/health`` again
(checked at the start of each batch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from loguru import logger

from rlcore.errors import RlcoreError
from rlcore_rollout_sglang.translate import AbortedError

T = TypeVar("T")
R = TypeVar("R")


class ServerError(RlcoreError):
    """A server could not be reached, died, answered 5xx, or aborted the request."""


class RejectedError(ServerError):
    """A server answered 4xx: the request (or update) itself was refused."""


def _why(exc: BaseException) -> str:
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
        timeout_s: float,
        connect_timeout_s: float,
        max_retries: int,
        max_concurrency: int,
        api_key: str | None = None,
        health_path: str = "/health",
    ):
        if not urls:
            raise RlcoreError("sglang engine: no servers given")
        self.urls = list(urls)
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.health_path = health_path
        self.client = httpx.Client(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._lock = threading.Lock()
        self._busy = dict.fromkeys(self.urls, 0)
        self.down: dict[str, str] = {}  # url -> why it was marked down

    # ------------------------------------------------------------------ single calls

    def request(self, url: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One HTTP call; any failure becomes a :class:`ServerError` naming the server."""
        try:
            response = self.client.request(method, url + path, **kwargs)
            response.raise_for_status()
            return response
        except httpx.HTTPStatusError as exc:
            kind = RejectedError if exc.response.status_code < 500 else ServerError
            raise kind(f"SGLang server {url} {method} {path}: {_why(exc)}") from None
        except httpx.HTTPError as exc:
            raise ServerError(f"SGLang server {url} {method} {path}: {_why(exc)}") from None

    def check_health(self) -> None:
        """Every server must answer the health path; the error lists each one that does not."""
        problems = []
        for url in self.urls:
            try:
                self.request(url, "GET", self.health_path)
            except ServerError as exc:
                problems.append(str(exc))
        if problems:
            raise ServerError("unreachable SGLang servers:\n  " + "\n  ".join(problems))

    def revive(self) -> None:
        """Bring back servers marked down that answer the health path again."""
        for url in list(self.down):
            try:
                self.request(url, "GET", self.health_path)
            except ServerError:
                continue
            logger.info("SGLang server {} is healthy again", url)
            with self._lock:
                self.down.pop(url, None)

    def broadcast(self, method: str, path: str, what: str, **kwargs: Any) -> list[httpx.Response]:
        """The same call on every live server (weight updates, memory release); the first failure
        is raised naming the server, because servers must not drift apart silently."""
        live = [u for u in self.urls if u not in self.down]
        if not live:
            raise ServerError(f"{what} failed: every SGLang server is down: " + "; ".join(f"{u}: {w}" for u, w in self.down.items()))
        if len(live) < len(self.urls):
            logger.warning("{}: skipping SGLang servers marked down: {}", what, ", ".join(sorted(self.down)))
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
            except (ServerError, AbortedError) as exc:
                errors.append(str(exc))
                with self._lock:
                    self.down[url] = str(exc)
                logger.warning("{}: {}; sending it to another server", what, exc)
            finally:
                self._give(url)
        elsewhere = "; ".join(f"{u}: {why}" for u, why in self.down.items() if u not in tried)
        raise ServerError(
            f"{what} failed on every SGLang server tried ({', '.join(tried) or 'none live'}):\n  "
            + "\n  ".join(errors or ["no live server"])
            + (f"\n  already down: {elsewhere}" if elsewhere else "")
        )

    def map(self, fn: Callable[[str, T], R], items: Sequence[T], what: str) -> list[R]:
        """``fn(url, item)`` for every item, concurrently across servers; results in item order."""
        if not items:
            return []
        self.revive()
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(items))) as pool:
            futures = [
                pool.submit(self.call, lambda url, item=item: fn(url, item), f"{what} (prompt {i})")
                for i, item in enumerate(items)
            ]
            return [f.result() for f in futures]

    def close(self) -> None:
        self.client.close()
