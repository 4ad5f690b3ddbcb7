"""The ``local`` launcher: runs the driver in this process."""

from __future__ import annotations

from rlcore.interfaces import LaunchRequest


class LocalLauncher:
    def __init__(self, manifest) -> None:
        self.manifest = manifest

    def launch(self, request: LaunchRequest) -> int:
        if request.dry_run:
            print(f"would train {request.manifest_path} in this process; run directory {request.run_dir}")
            return 0
        from rlcore.trainer.driver import run_driver

        return run_driver(self.manifest, request.run_dir, resume=request.resume)


def build(options, context) -> LocalLauncher:
    """``context`` is the ResolvedManifest the CLI validated."""
    return LocalLauncher(context)
