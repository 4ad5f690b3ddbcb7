"""``rlcore sandbox serve``: the local sandbox behind HTTP (FastAPI), for rollouts on other machines.

``POST /run_code`` runs one program (sandbox-fusion's request/response shape); ``GET /health``
answers ``{"status": "ok"}``. A request may lower the time and memory limits, never raise them.
"""

from __future__ import annotations

import base64
import binascii
import socket

from fastapi import FastAPI

from rlcore_agent.sandbox.local import Limits, LocalSandbox, RunResult
from rlcore_agent.sandbox.protocol import CommandRunResult, RunCodeRequest, RunCodeResponse

LANGUAGES = {"python", "python3"}


def to_response(result: RunResult) -> RunCodeResponse:
    if result.status == "Error" and result.return_code is None:
        return RunCodeResponse(status="SandboxError", message=result.message)
    stderr = result.stderr + (f"\n[{result.message}]" if result.message else "")
    run = CommandRunResult(
        status=result.status,
        execution_time=round(result.execution_time, 4),
        return_code=result.return_code,
        stdout=result.stdout,
        stderr=stderr,
    )
    ok = result.status == "Finished" and result.return_code == 0 and not result.output_truncated
    files = {k: base64.b64encode(v).decode() for k, v in (result.files or {}).items()}
    return RunCodeResponse(
        status="Success" if ok else "Failed", message=result.message, run_result=run, files=files
    )


def create_app(sandbox: LocalSandbox) -> FastAPI:
    app = FastAPI(title="rlcore sandbox", version="1")
    host = socket.gethostname()

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "isolation": sandbox.isolation}

    @app.post("/run_code", response_model=RunCodeResponse)
    async def run_code(request: RunCodeRequest) -> RunCodeResponse:
        if request.language not in LANGUAGES:
            return RunCodeResponse(
                status="SandboxError", message=f"unsupported language {request.language!r}; supported: python"
            )
        base = sandbox.limits
        memory = (
            base.memory_mb if request.memory_limit_MB <= 0 else min(base.memory_mb, request.memory_limit_MB)
        )
        limits = Limits(
            wall_s=min(base.wall_s, request.run_timeout),
            cpu_s=base.cpu_s,
            memory_mb=memory,
            max_processes=base.max_processes,
            max_output_bytes=base.max_output_bytes,
            max_file_mb=base.max_file_mb,
        )
        try:
            files = {path: base64.b64decode(data, validate=True) for path, data in request.files.items()}
        except (binascii.Error, ValueError) as exc:
            return RunCodeResponse(status="SandboxError", message=f"files must be base64: {exc}")
        try:
            result = await sandbox.run(request.code, request.stdin or "", limits, files, request.fetch_files)
        except ValueError as exc:  # a file path leaving the sandbox directory
            return RunCodeResponse(status="SandboxError", message=str(exc))
        response = to_response(result)
        response.executor_pod_name = host
        return response

    return app
