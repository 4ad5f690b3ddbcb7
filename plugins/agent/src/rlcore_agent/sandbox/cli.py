"""``rlcore sandbox serve``: configure/run functions for the ``sandbox`` sub-command."""

from __future__ import annotations

import argparse

from rlcore.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", metavar="ACTION")
    serve = sub.add_parser("serve", help="serve /run_code (sandbox-fusion's shape) over HTTP")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--timeout-s", type=float, default=10.0, help="wall-clock limit (requests may lower it)"
    )
    serve.add_argument("--cpu-time-s", type=int, default=10)
    serve.add_argument(
        "--memory-mb", type=int, default=1024, help="address-space limit (requests may lower it)"
    )
    serve.add_argument("--max-processes", type=int, default=16)
    serve.add_argument("--max-output-bytes", type=int, default=1_000_000)
    serve.add_argument(
        "--max-concurrency", type=int, default=None, help="default: 2 per available CPU core, at most 32"
    )
    serve.add_argument(
        "--isolation",
        choices=["bubblewrap", "process"],
        default="bubblewrap",
        help="bubblewrap (default; refuses to start without it) or process: no namespaces, explicit opt-in; "
        "see the agent plugin's README for what it leaves open",
    )
    serve.add_argument("--python", default=None, help="interpreter that runs the code (default: this one)")


def run(args: argparse.Namespace) -> int:
    if getattr(args, "sandbox_command", None) != "serve":
        raise UsageError("usage: rlcore sandbox serve [--host H] [--port P] [limits...]")
    import uvicorn

    from rlcore_agent.sandbox.local import Limits, LocalSandbox
    from rlcore_agent.sandbox.server import create_app

    limits = Limits(
        wall_s=args.timeout_s,
        cpu_s=args.cpu_time_s,
        memory_mb=args.memory_mb,
        max_processes=args.max_processes,
        max_output_bytes=args.max_output_bytes,
    )
    sandbox = LocalSandbox(
        limits,
        python=args.python,
        isolation=args.isolation,
        max_concurrency=args.max_concurrency,
        where="rlcore sandbox serve (--isolation, --python):",
    )
    try:
        uvicorn.run(create_app(sandbox), host=args.host, port=args.port, log_level="warning")
    finally:
        sandbox.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m rlcore_agent.sandbox.cli serve ...`` works without the rlcore CLI."""
    parser = argparse.ArgumentParser(prog="rlcore sandbox")
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
