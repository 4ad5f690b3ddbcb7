"""The ``rlcore`` command line. Importing it stays light: torch loads only when a run starts.

Exit codes: 0 success, 2 invalid manifest or usage, 1 a failed run. Expected errors
(:class:`rlcore.errors.RlcoreError`) print one message without a traceback; unexpected ones print
the traceback and suggest retrying without external plugins.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlcore import __version__
from rlcore.errors import RlcoreError, UsageError

_console = None


def console():
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=False, highlight=False, soft_wrap=True)
        if not _console.is_terminal:  # piped: tables at their natural width, nothing cut or wrapped
            _console = Console(stderr=False, highlight=False, soft_wrap=True, width=_UNBOUNDED)
        _console.on_broken_pipe = _raise_broken_pipe  # rich's own exits 1; main ends such a run with 0
    return _console


def _raise_broken_pipe() -> None:
    raise BrokenPipeError


_UNBOUNDED = 100_000  # columns: wider than any table rlcore prints


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(str(text))


def _registry(args: argparse.Namespace):
    from rlcore.registry import Registry

    if getattr(args, "no_plugins", False):
        return Registry.discover(external=False)
    return Registry.discover()


def _load(args: argparse.Namespace, registry=None):
    from rlcore.manifest.loader import load_manifest

    return load_manifest(args.manifest, args.set or [], registry=registry or _registry(args))


# ----------------------------------------------------------------------------- commands


def cmd_validate(args: argparse.Namespace) -> int:
    """Validate each manifest named, reporting every one; the exit code is the worst of them."""
    registry = _registry(args)
    paths = list(args.manifest)
    failures: list[tuple[str, RlcoreError]] = []
    for path in paths:
        try:
            _validate_one(args, path, registry)
        except RlcoreError as exc:
            if len(paths) == 1:
                raise
            console().print(f"[bold red]error:[/] {_escape(exc)}", highlight=False)
            failures.append((path, exc))
    if failures:
        console().print(
            f"[bold red]{len(failures)} of {len(paths)} manifests are invalid:[/] "
            + _escape(", ".join(path for path, _ in failures))
        )
        return max(exc.exit_code for _, exc in failures)
    return 0


def _validate_one(args: argparse.Namespace, path: str, registry) -> None:
    from rlcore.manifest.checks import check_resolved
    from rlcore.manifest.loader import load_manifest

    manifest = load_manifest(path, args.set or [], registry=registry)
    for warning in check_resolved(manifest):
        console().print(f"[yellow]warning:[/] {_escape(warning)}")
    if args.print:
        import tomli_w

        console().print(tomli_w.dumps(manifest.resolved_dict()), markup=False)
    used = ", ".join(
        f"{role}={s.component.name} ({s.component.provider})"
        for role, s in {**manifest.data_sources, **manifest.selected}.items()
    )
    console().print(f"[green]ok[/] {_escape(path)}: {_escape(used)}")


def cmd_run(args: argparse.Namespace) -> int:
    registry = _registry(args)
    manifest = _load(args, registry)
    from rlcore.manifest.checks import check_resolved

    for warning in check_resolved(manifest):
        console().print(f"[yellow]warning:[/] {_escape(warning)}")
    from rlcore.interfaces import LaunchRequest

    run_dir = (
        Path(args.run_dir) if args.run_dir else Path(manifest.core.run.output_dir) / manifest.core.run.name
    )
    request = LaunchRequest(
        manifest_path=str(manifest.path),
        resolved_manifest=_driver_document(manifest),
        run_dir=str(run_dir.resolve()),
        resume=args.resume,
        dry_run=args.dry_run,
        argv=list(sys.argv[1:]),
        validated=manifest,
    )
    from rlcore.interfaces import BuildContext

    selected = manifest.component("launcher.name")
    context = BuildContext.from_manifest(manifest, run_dir=request.run_dir)
    launcher = selected.component.build(selected.options, context)
    code = int(launcher.launch(request) or 0)
    if args.dry_run:  # what the launcher would do, then whether the run directory would refuse it
        from rlcore.launching import run_dir_problems

        problems = run_dir_problems(run_dir, args.resume)
        if problems:
            raise UsageError("\n  ".join(["the run would be refused:", *problems]))
    return code


def _driver_document(manifest) -> dict[str, Any]:
    """The manifest a remote driver runs: overrides applied, paths absolute, launcher local."""
    import copy

    doc = copy.deepcopy(manifest.raw)
    core = manifest.core
    doc.setdefault("model", {})["path"] = core.model.path
    if core.model.tokenizer:
        doc["model"]["tokenizer"] = core.model.tokenizer
    doc.setdefault("data", {})["train"] = core.data.train
    if core.data.val:
        doc["data"]["val"] = core.data.val
    doc.setdefault("run", {})["output_dir"] = core.run.output_dir
    if core.critic.path:
        doc.setdefault("critic", {})["path"] = core.critic.path
    for role, chosen in manifest.selected.items():  # NAME:TARGET names, with the target made absolute
        table, _, field = role.partition(".")
        option = chosen.component.target_option
        written = doc.get(table, {}).get(field) if isinstance(doc.get(table), dict) else None
        if option and isinstance(written, str) and written.startswith(f"{chosen.component.name}:"):
            doc[table][field] = f"{chosen.component.name}:{getattr(chosen.options, option)}"
        elif table == "tools" or field.startswith("routes."):
            # Their validated options hold the paths made absolute (python: targets, classes, files).
            options = chosen.options.model_dump(mode="json", exclude_none=True)
            if table == "tools":
                doc["tools"][field] = options
            else:
                name = chosen.component.name
                target = getattr(chosen.options, option) if option else None
                function = f"{name}:{target}" if target else name
                doc["reward"]["routes"][field[len("routes.") :]] = {**options, "function": function}
                if option:
                    doc["reward"]["routes"][field[len("routes.") :]].pop(option, None)
        elif isinstance(doc.get(table), dict) and table != "launcher":
            # Options the component's validation rewrote (a relative path made absolute): as validated.
            for key, given in list(doc.get(table, {}).items()):
                validated = getattr(chosen.options, key, None)
                if isinstance(given, str) and isinstance(validated, str) and validated != given:
                    doc[table][key] = validated
    doc["launcher"] = {"name": "local"}
    return doc


def cmd_plugins(args: argparse.Namespace) -> int:
    from rlcore.registry import target_path

    registry = _registry(args)
    commands: dict[str, list] = {}
    if args.verbose:  # asking plugins for their commands may import their CLI modules
        for command in registry.commands():
            commands.setdefault(command.plugin, []).append(command)
    infos = registry.plugin_infos()
    conflicts = registry.conflicts()
    if args.json:
        plugins = []
        for info in infos:
            entry = info.as_dict(verbose=args.verbose)
            if args.verbose:
                entry["commands"] = {c.name: target_path(c.run) for c in commands.get(info.name, [])}
            plugins.append(entry)
        payload = {
            "plugins": plugins,
            "conflicts": [{"kind": k, "name": n, "providers": p} for (k, n), p in conflicts.items()],
        }
        print(json.dumps(payload, indent=2))
        return 0
    from rich.table import Table

    table = Table(title="rlcore plugins", show_lines=False)
    for column in ("plugin", "distribution", "version", "status", "provides"):
        table.add_column(column)
    for info in infos:
        provides = "\n".join(f"{kind}: {', '.join(names)}" for kind, names in info.components.items())
        status = {"ok": "[green]ok[/]", "broken": "[red]broken[/]", "disabled": "[dim]disabled[/]"}[
            info.status
        ]
        table.add_row(info.name, info.distribution, info.version, status, _escape(provides or info.error))
    console().print(table)
    if args.verbose:  # each name with the code behind it
        code = Table(title="components and commands", show_lines=False)
        for column in ("kind", "name", "factory / command function", "plugin"):
            code.add_column(column, overflow="fold")
        for info in infos:
            for kind, names in info.components.items():
                for name in names:
                    code.add_row(kind, name, _escape(info.factories.get(kind, {}).get(name, "?")), info.name)
            for command in commands.get(info.name, []):
                code.add_row("command", command.name, _escape(target_path(command.run)), info.name)
        console().print(code)
    for info in infos:
        if info.status == "broken":
            console().print(
                f"[red]broken:[/] {info.name} ({info.distribution} {info.version}): {_escape(info.error)}"
            )
    for (kind, name), providers in conflicts.items():
        console().print(f"[red]conflict:[/] {kind} {name!r} is provided by {' and '.join(providers)}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from rlcore.manifest.jsonschema import manifest_json_schema

    print(json.dumps(manifest_json_schema(_registry(args)), indent=2))
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from rlcore.manifest.starter import starter_text

    target = Path(args.path)
    if target.exists() and not args.force:
        raise UsageError(f"{target} exists; pass --force to overwrite it")
    target.write_text(starter_text(str(target), _registry(args)), encoding="utf-8")
    console().print(f"wrote {target}; check it with: rlcore validate {target}")
    return 0


# ----------------------------------------------------------------------------- parser


def _add_manifest_args(parser: argparse.ArgumentParser, several: bool = False) -> None:
    if several:
        parser.add_argument("manifest", nargs="+", help="the runs' TOML manifests, each checked and reported")
    else:
        parser.add_argument("manifest", help="the run's TOML manifest")
    parser.add_argument(
        "--set",
        action="append",
        metavar="TABLE.KEY=VALUE",
        help="override a manifest value (repeatable); VALUE is TOML",
    )


def build_parser(registry=None, command_name: str | None = None) -> argparse.ArgumentParser:
    """The parser: the core commands, and those of ``registry`` (hook ``rlcore_commands``; rlcore's
    own ``data`` and ``eval`` among them) when one is given. ``command_name`` names the one
    registered command whose arguments to add (and whose configure to import); None adds all."""
    parser = argparse.ArgumentParser(
        prog="rlcore", description="RL post-training for LLMs from one TOML manifest."
    )
    parser.add_argument("--version", action="version", version=f"rlcore {__version__}")
    parser.add_argument(
        "--no-plugins", action="store_true", help="ignore external plugins (also RLCORE_NO_PLUGINS=1)"
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks for expected errors too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="run a manifest")
    _add_manifest_args(p)
    p.add_argument(
        "--resume", action="store_true", help="continue from the run directory's latest checkpoint"
    )
    p.add_argument("--dry-run", action="store_true", help="show what the launcher would do, without running")
    p.add_argument("--run-dir", help="the run directory (default: run.output_dir/run.name)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="validate manifests without importing torch or starting anything")
    _add_manifest_args(p, several=True)
    p.add_argument("--print", action="store_true", help="print the resolved manifest")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("plugins", help="list installed plugins and their components")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also show where each component's factory (and each command) lives",
    )
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("schema", help="print a JSON Schema of the manifest, installed plugins included")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("init", help="write a commented starter manifest")
    p.add_argument("path", nargs="?", default="rlcore.toml")
    p.add_argument("--force", action="store_true")
    p.set_defaults(func=cmd_init)

    if registry is not None:
        for command in registry.commands():
            if command.name in sub.choices:
                continue  # core commands, then the first registration (builtins come first), win
            _add_command(sub, command, configure=command_name is None or command_name == command.name)
    return parser


def _add_command(sub, command, *, configure: bool) -> None:
    """A sub-parser for a :class:`~rlcore.components.Command`. Its arguments are added only when
    ``configure`` (the command is the one being run): a ``"module:function"`` configure is
    imported then. If that import fails, the command takes any arguments (see main) and reports
    the failure when run; the rest of the command line keeps working."""
    parser = sub.add_parser(command.name, help=command.help)
    parser.set_defaults(func=_command_runner(command))
    if not configure:
        return
    try:
        configure_fn = command.load_configure()
    except RlcoreError as exc:
        parser.set_defaults(func=lambda args, _e=exc: _unavailable(command, _e), any_arguments=True)
        return
    if configure_fn is not None:
        configure_fn(parser)


def _unavailable(command, exc: Exception) -> int:
    where = (
        f" (from {command.distribution})" if command.distribution and command.distribution != "rlcore" else ""
    )
    raise RlcoreError(f"the {command.name!r} command{where} is unavailable: {exc}")


def _command_runner(command):
    def run(args: argparse.Namespace) -> int:
        try:
            function = command.load_run()
        except RlcoreError as exc:
            _unavailable(command, exc)
        return int(function(args) or 0)

    return run


# Commands that rlcore's own plugin distributions add: asked for while the plugin is absent, they
# get a one-line "pip install" hint instead of argparse's "invalid choice".
PLUGIN_COMMANDS: dict[str, str] = {
    "serve": "rlcore-serve",
    "jobs": "rlcore-launcher-slurm",
    "from-verl": "rlcore-verl",
    "sandbox": "rlcore-agent",
}


def _check_plugin_command(registry, name: str) -> None:
    """Raise a :class:`UsageError` naming the distribution to install (or to turn back on) when
    ``name`` is a first-party plugin's command that ``registry`` does not hold."""
    distribution = PLUGIN_COMMANDS.get(name)
    if distribution is None or any(command.name == name for command in registry.commands()):
        return
    broken = [
        info
        for info in registry.plugin_infos()
        if info.distribution == distribution and info.status == "broken"
    ]
    if broken:
        raise UsageError(
            f"rlcore {name}: the {distribution} plugin that provides it failed to load: {broken[0].error}"
        )
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(distribution)
    except PackageNotFoundError:
        raise UsageError(
            f"rlcore {name}: the command comes with the {distribution} plugin, which is not "
            f"installed: pip install {distribution}"
        ) from None
    raise UsageError(
        f"rlcore {name}: the command comes with the {distribution} plugin, which is installed "
        "but turned off (--no-plugins, RLCORE_NO_PLUGINS or RLCORE_DISABLE_PLUGINS)"
    )


def _command_name(argv: Sequence[str]) -> str:
    """The sub-command in ``argv`` ("" if none): the first word that is not an option (rlcore's own
    options take no values)."""
    return next((arg for arg in argv if not arg.startswith("-")), "")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    _configure_logging(debug)
    try:
        registry = None
        if not argv or argv[0] not in ("run", "validate", "plugins", "schema", "init", "--version"):
            from rlcore.registry import Registry

            registry = Registry.discover(external="--no-plugins" not in argv)
        if registry is not None:
            _check_plugin_command(registry, _command_name(argv))
        parser = build_parser(registry, _command_name(argv))
        args, extra = parser.parse_known_args(argv)
        if extra and not getattr(args, "any_arguments", False):
            parser.error("unrecognized arguments: " + " ".join(extra))  # as parse_args does
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        if args.no_plugins:
            os.environ["RLCORE_NO_PLUGINS"] = "1"
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, while it can still be handled
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except RlcoreError as exc:
        if debug:
            raise
        from rich.markup import escape

        console().print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False)
        return exc.exit_code
    except KeyboardInterrupt:
        console().print("[yellow]interrupted[/]")
        return 130
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except Exception:
        import traceback

        traceback.print_exc()
        console().print(
            "[bold red]unexpected error[/] (a bug in rlcore or a plugin). "
            "If a plugin may be the cause, retry with --no-plugins or RLCORE_DISABLE_PLUGINS=name."
        )
        return 1


def _stdout_closed() -> int:
    """The reader of stdout went away (``rlcore schema | head``): end quietly with 0, as ``head``
    took what it wanted (so ``set -o pipefail`` scripts go on), pointing stdout at devnull so that
    the flush at exit cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in-process)
        pass
    return 0


def _configure_logging(debug: bool) -> None:
    from loguru import logger

    logger.remove()
    level = "DEBUG" if debug else os.environ.get("RLCORE_LOG_LEVEL", "INFO")
    # Written to whatever sys.stderr is at the time: under a live progress bar that is rich's proxy,
    # which prints the line above the bar instead of gluing it onto the bar's line.
    logger.add(
        lambda message: sys.stderr.write(message),
        level=level,
        colorize=_is_tty(sys.stderr),
        format="<dim>{time:HH:mm:ss}</dim> <level>{level: <7}</level> {message}",
        filter=lambda record: not record["extra"].get("file_only"),
    )


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
