"""Running code through a ``/run_code`` service (``rlcore sandbox serve`` or sandbox-fusion)."""

from __future__ import annotations

from typing import Any

import httpx

from rlcore_agent.sandbox.local import Limits, RunResult


class HttpSandbox:
    def __init__(self, url: str, limits: Limits, retries: int = 2):
        self.url = url.rstrip("/")
        if not self.url.endswith("/run_code"):
            self.url += "/run_code"
        self.limits = limits
        self.retries = retries
        self._clients: dict[int, httpx.AsyncClient] = {}

    def _client(self) -> httpx.AsyncClient:
        import asyncio

        key = id(asyncio.get_running_loop())
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = httpx.AsyncClient(timeout=self.limits.wall_s + 30)
        return client

    async def run(self, code: str, stdin: str = "", limits: Limits | None = None) -> RunResult:
        limits = limits or self.limits
        payload: dict[str, Any] = {
            "code": code,
            "language": "python",
            "run_timeout": limits.wall_s,
            "memory_limit_MB": limits.memory_mb,
            "stdin": stdin,
        }
        last: Exception | None = None
        for _ in range(self.retries + 1):
            try:
                response = await self._client().post(self.url, json=payload)
                response.raise_for_status()
                body = response.json()
                break
            except (httpx.HTTPError, ValueError) as exc:
                last = exc
        else:
            return RunResult(
                "Error", None, "", "", 0.0, message=f"the sandbox service at {self.url} failed: {last}"
            )
        run = body.get("run_result") or {}
        if body.get("status") == "SandboxError" or not run:
            return RunResult("Error", None, "", "", 0.0, message=body.get("message") or "sandbox error")
        return RunResult(
            status=run.get("status", "Error"),
            return_code=run.get("return_code"),
            stdout=run.get("stdout") or "",
            stderr=run.get("stderr") or "",
            execution_time=float(run.get("execution_time") or 0.0),
            message=body.get("message") or "",
        )
