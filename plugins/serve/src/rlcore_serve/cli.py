"""``rlcore serve MANIFEST``: build the manifest's tokenizer and rollout engine (:mod:`rlcore.serving`)
and serve them with uvicorn.

Imports nothing heavy at module level (the CLI imports this module to build its parser).
"""

from __future__ import annotations

import argparse
from typing import Any

from rlcore.errors import RlcoreError, UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", help="the run's TOML manifest ([model] and [rollout] are used)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="TABLE.KEY=VALUE")
    parser.add_argument("--model-name", default=None, help="the model id clients use (default: [run] name)")
    parser.add_argument(
        "--max-tokens-limit",
        type=int,
        default=None,
        metavar="N",
        help="the largest max_tokens a request may ask for; larger is a 400 (default: only the model's context "
        "bounds it; the default max_tokens is [data] max_response_tokens)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        metavar="N",
        help="the most sequences (prompts x n) of waiting requests generated together in one engine call (default: 64)",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )


def build_server(
    manifest_path: str,
    overrides: list[str] | None = None,
    model_name: str | None = None,
    max_tokens_limit: int | None = None,
    batch_size: int = 64,
) -> Any:
    """The FastAPI app for a manifest: tokenizer from ``[model]``, engine from ``[rollout]``."""
    if max_tokens_limit is not None and max_tokens_limit < 1:
        raise UsageError(f"--max-tokens-limit must be at least 1, got {max_tokens_limit}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}")
    from rlcore.serving import build_served_engine
    from rlcore_serve.app import create_app

    served = build_served_engine(manifest_path, list(overrides or []))
    app = create_app(
        served.engine,
        served.tokenizer,
        model_name=model_name or served.model_name,
        max_tokens=served.max_tokens,
        stop=served.stop,
        max_tokens_limit=max_tokens_limit,
        max_batch_size=batch_size,
    )
    app.state.served = served  # closed when the server stops (run)
    return app


def run(args: argparse.Namespace) -> int:
    app = build_server(args.manifest, args.overrides, args.model_name, args.max_tokens_limit, args.batch_size)
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - uvicorn is a dependency of rlcore-serve
        raise RlcoreError(f"rlcore serve needs uvicorn: pip install rlcore-serve ({exc})") from None
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        app.state.served.close()
    return 0
