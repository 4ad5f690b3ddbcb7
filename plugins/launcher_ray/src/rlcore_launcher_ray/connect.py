"""Importing Ray and reaching a cluster, with errors that say what to do instead of hanging."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

from rlcore.errors import RlcoreError

INSTALL_HINT = 'pip install "ray[default]"'
# Ports Ray listens on when an address names none.
DEFAULT_PORTS = {"": 6379, "ray": 10001, "http": 8265, "https": 443}


def import_ray(jobs: bool = False):
    """Import ray (and its job-submission client when ``jobs``), or say how to install it."""
    # Every rank's lines matter (they are prefixed with the rank); Ray would fold repeats.
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray

        if jobs:
            import ray.job_submission  # noqa: F401  (needs ray[default]: aiohttp and friends)
    except ImportError as exc:
        what = "the Ray Jobs client" if jobs else "Ray"
        raise RlcoreError(
            f"the ray launcher needs {what}, which is not installed ({exc}): {INSTALL_HINT}"
        ) from None
    if os.environ.get("RAY_DEDUP_LOGS") == "0":
        # Ray reads the variable once, when first imported; a process that imported Ray before
        # (a notebook, a test session) would still fold rank 1's lines into rank 0's.
        try:
            from ray._private import ray_logging

            ray_logging.RAY_DEDUP_LOGS = False
        except (ImportError, AttributeError):  # a Ray without that module: the variable did its job
            pass
    return ray


def host_port(address: str) -> tuple[str, int]:
    """``"host:6379"``, ``"ray://host"``, ``"http://host:8265"`` -> (host, port)."""
    scheme = ""
    if "://" in address:
        scheme = address.split("://", 1)[0].lower()
        parts = urlsplit(address)
    else:
        parts = urlsplit("//" + address)
    try:
        port = parts.port
    except ValueError:
        raise RlcoreError(f"the Ray address {address!r} has an invalid port") from None
    if not parts.hostname:
        raise RlcoreError(
            f'the Ray address {address!r} names no host; expected e.g. "10.0.0.1:6379" or "http://10.0.0.1:8265"'
        )
    return parts.hostname, port or DEFAULT_PORTS.get(scheme, 6379)


def check_reachable(address: str, timeout: float, what: str = "Ray cluster") -> None:
    """Fail fast, naming the address, when nothing answers there (Ray itself would retry for minutes)."""
    if address == "auto":
        return
    host, port = host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except TimeoutError:
        why = f"no answer within {timeout:g} s"
    except OSError as exc:
        why = exc.strerror or str(exc)
    raise RlcoreError(
        f"cannot reach the {what} at {address} ({host}:{port}: {why}). Check the address "
        "([launcher] address or RAY_ADDRESS) and that the cluster is running (ray status)"
    )


def resolve_address(configured: str | None) -> str | None:
    """The manifest's address, else $RAY_ADDRESS; None means: start a local Ray instance."""
    return configured or os.environ.get("RAY_ADDRESS") or None
