"""Conformance kit for launchers (``rlcore_launchers``, :class:`rlcore.interfaces.Launcher`).

The contract (``rlcore/hookspecs.py``): a launcher is built from its options and the run's
:class:`~rlcore.interfaces.BuildContext` (the resolved manifest as a dict, ``manifest_dir``,
``run_dir``, the seed; nothing that needs torch), and ``launch(request)`` runs the driver
somewhere and returns its exit code, an int. ``rlcore run --dry-run`` asks it what it would do:
then it prints that, returns 0, and starts, submits and writes nothing. ::

    from rlcore.testing.launchers import check_launcher

    def test_my_launcher(rlcore_registry, tmp_path):
        check_launcher(rlcore_registry.get("launcher", "my_launcher"), {"nodes": 2}, directory=tmp_path)

The kit checks the dry run of a request the way ``rlcore run`` makes one. A real launch needs what
the launcher launches on (a cluster, a GPU): :func:`check_launch` checks one, given a request
whose manifest trains a step (see :func:`rlcore.testing.runs.write_run_manifest`).
"""

from __future__ import annotations

import contextlib
import copy
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

import tomli_w

from rlcore.components import Component
from rlcore.interfaces import BuildContext, LaunchRequest
from rlcore.testing import build_subject

# Modules a dry run must not import (it only describes; the launch itself may need them).
HEAVY = ("torch", "transformers", "ray", "sky", "vllm", "sglang")


def kit_manifest() -> dict[str, Any]:
    """A resolved manifest as ``rlcore run`` hands a launcher one (launcher table set to local)."""
    return {
        "run": {"name": "kit-run", "seed": 3, "output_dir": "runs"},
        "model": {"path": "org/tiny-model"},
        "data": {"train": "synthetic:addition", "prompts_per_step": 2, "max_response_tokens": 8},
        "rollout": {"samples_per_prompt": 2},
        "reward": {"function": "python:reward.py:score"},
        "trainer": {"steps": 1},
        "launcher": {"name": "local"},
    }


def kit_request(
    directory: str | Path,
    manifest: dict[str, Any] | None = None,
    *,
    dry_run: bool = True,
    resume: bool = False,
) -> LaunchRequest:
    """A :class:`LaunchRequest` for ``manifest`` (default :func:`kit_manifest`) written to
    ``directory/manifest.toml``, with the run directory ``directory/run`` (not created)."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    document = copy.deepcopy(manifest if manifest is not None else kit_manifest())
    path = directory / "manifest.toml"
    path.write_text(tomli_w.dumps(document), encoding="utf-8")
    argv = ["run", str(path)] + (["--dry-run"] if dry_run else []) + (["--resume"] if resume else [])
    return LaunchRequest(
        manifest_path=str(path),
        resolved_manifest=document,
        run_dir=str(directory / "run"),
        resume=resume,
        dry_run=dry_run,
        argv=argv,
    )


def kit_context(request: LaunchRequest) -> BuildContext:
    """The context ``rlcore run`` builds a launcher with: no tokenizer, no actor, nothing of torch."""
    manifest = request.resolved_manifest
    return BuildContext(
        manifest=copy.deepcopy(manifest),
        manifest_dir=str(Path(request.manifest_path).parent),
        run_dir=request.run_dir,
        model_path=manifest.get("model", {}).get("path"),
        seed=int(manifest.get("run", {}).get("seed", 0)),
    )


def _tree(path: Path) -> dict[str, int] | None:
    """Every file under ``path`` with its size, or None where ``path`` does not exist."""
    if not path.exists():
        return None
    return {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*"))}


def check_launcher(
    component: Component | Any,
    options: Any = None,
    *,
    directory: str | Path | None = None,
    manifest: dict[str, Any] | None = None,
) -> str:
    """Build the launcher (a registered :class:`~rlcore.components.Component` with ``options``, or
    a built launcher) as ``rlcore run`` does and dry-run a request for ``manifest`` (default
    :func:`kit_manifest`) in ``directory`` (a temporary one by default). Checks: it has
    ``launch``; the dry run returns the int 0 and prints what it would do; it creates or writes
    nothing in the run directory or beside the manifest; it leaves the request (and its manifest)
    as it was; it imports none of :data:`HEAVY` that was not imported before; the same dry run
    twice says the same. Returns what the dry run printed."""
    holder = None
    if directory is None:
        holder = tempfile.TemporaryDirectory(prefix="rlcore-launcher-kit-")
        directory = holder.name
    try:
        request = kit_request(directory, manifest, dry_run=True)
        launcher = build_subject(component, options, kit_context(request))
        name = type(launcher).__name__
        assert callable(getattr(launcher, "launch", None)), (
            f"a launcher needs launch(request); {name} has none"
        )
        before_request = copy.deepcopy(request)
        before_files = _tree(Path(directory))
        loaded = {m for m in HEAVY if m in sys.modules}
        code, printed = _dry_run(launcher, request, name)
        assert type(code) is int, f"{name}.launch must return an exit code (int), got {code!r}"
        assert code == 0, f"{name}.launch returned {code} for a dry run (expected 0)"
        assert printed.strip(), f"{name}.launch printed nothing for a dry run: it must say what it would do"
        assert not Path(request.run_dir).exists(), (
            f"{name}.launch created the run directory {request.run_dir} in a dry run (it must start and write nothing)"
        )
        assert _tree(Path(directory)) == before_files, (
            f"{name}.launch wrote files in a dry run: {_tree(Path(directory))}"
        )
        assert request == before_request and request.resolved_manifest == before_request.resolved_manifest, (
            f"{name}.launch changed the request it was given"
        )
        newly = sorted(m for m in HEAVY if m in sys.modules and m not in loaded)
        assert not newly, (
            f"{name}.launch imported {', '.join(newly)} for a dry run (a dry run must stay light)"
        )
        again, printed_again = _dry_run(launcher, copy.deepcopy(before_request), name)
        assert (again, printed_again) == (code, printed), (
            f"{name}: the same dry run twice said different things"
        )
        return printed
    finally:
        if holder is not None:
            holder.cleanup()


def _dry_run(launcher: Any, request: LaunchRequest, name: str) -> tuple[Any, str]:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = launcher.launch(request)
    except Exception as exc:  # noqa: BLE001 - the kit reports what the launcher could not do
        raise AssertionError(f"{name}.launch raised on a dry run: {type(exc).__name__}: {exc}") from exc
    return code, out.getvalue()


def check_launch(component: Component | Any, request: LaunchRequest, options: Any = None) -> int:
    """Launch ``request`` (not a dry run; its manifest trains something small) for real with the
    launcher and check it returns the int 0 and the run directory holds the run's metrics
    (``metrics.jsonl``) and resolved manifest. Returns the exit code."""
    assert not request.dry_run, "check_launch launches for real: give a request with dry_run=False"
    launcher = build_subject(component, options, kit_context(request))
    name = type(launcher).__name__
    code = launcher.launch(request)
    assert type(code) is int, f"{name}.launch must return an exit code (int), got {code!r}"
    assert code == 0, f"{name}.launch returned {code} for a run that should succeed"
    run_dir = Path(request.run_dir)
    for file in ("metrics.jsonl", "manifest.resolved.toml"):
        assert (run_dir / file).is_file(), (
            f"{name}.launch returned 0 but the run directory has no {file}: {_tree(run_dir)}"
        )
    return code
