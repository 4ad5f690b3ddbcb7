"""One way to name code in a manifest or a plugin record: ``FILE.py:NAME`` or ``package.module:NAME``.

Used for component factories, sub-command runners, ``python:`` rewards, function tools and the
Ray launcher's worker targets, so that every such string resolves, and fails, alike: the error
names what was asked for, where it was looked up, and the names that do exist there.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from hashlib import sha1
from pathlib import Path
from typing import Any

from rlcore.errors import RlcoreError, did_you_mean, suggest


def load_target(
    target: str, *, what: str = "function", source: str | None = None, base_dir: str | Path | None = None
) -> tuple[Any, str]:
    """Import ``FILE.py:NAME`` (relative to ``base_dir``) or ``package.module:NAME`` (``NAME`` may be
    dotted); return the object and a description of where it came from. ``what`` names the object
    in errors ("function", "factory"), ``source`` the file or module ("reward"; default ``what``)."""
    source = source or what
    where, sep, name = target.rpartition(":")
    if not sep or not where or not name:
        raise RlcoreError(
            f"expected 'FILE.py:{what.upper()}' or 'package.module:{what.upper()}', got {target!r}"
        )
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if base_dir is not None and not path.is_absolute():
            path = Path(base_dir) / path
        module = import_file(path, source)
        origin = str(path)
    else:
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            raise RlcoreError(f"{source} module {where!r} cannot be imported: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - the module failed while importing
            raise RlcoreError(
                f"importing {source} module {where!r} failed: {type(exc).__name__}: {exc}"
            ) from None
        origin = f"module {where}"
    obj: Any = module
    for part in name.split("."):
        parent, obj = obj, getattr(obj, part, None)
        if obj is None:
            available = sorted(
                n for n, v in vars(parent).items() if not n.startswith("_") and not inspect.ismodule(v)
            )
            hint = did_you_mean(part, available)
            raise RlcoreError(
                f"{origin} has no {what} {name!r}"
                + suggest(hint)
                + "; defined there: "
                + (", ".join(available[:20]) or "(nothing)")
            )
    return obj, origin


def import_file(path: Path, what: str = "code") -> Any:
    """Import a Python file as a module of a stable, unique name (registered in ``sys.modules``, so
    its classes pickle by reference and a second import is the same module)."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise RlcoreError(f"{what} file {str(path)!r} does not exist")
    module_name = f"rlcore_user_{path.stem}_{sha1(str(path).encode()).hexdigest()[:8]}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Helpers next to the file are importable from it, as when running it as a script.
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[module_name]
        raise RlcoreError(
            f"syntax error in {what} file {str(path)!r}, line {exc.lineno}: {exc.msg}"
        ) from None
    except BaseException as exc:  # noqa: BLE001 - anything the user's file raises at import
        del sys.modules[module_name]
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise RlcoreError(
            f"importing {what} file {str(path)!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    return module
