"""The ``local`` launcher: runs the driver in this process."""

from __future__ import annotations

from rlcore.interfaces import BuildContext, LaunchRequest


class LocalLauncher:
    def launch(self, request: LaunchRequest) -> int:
        if request.dry_run:
            print(f"would train {request.manifest_path} in this process; run directory {request.run_dir}")
            return 0
        from rlcore.launching import run_driver_here

        return run_driver_here(request)


def build(options, context: BuildContext | None = None) -> LocalLauncher:
    return LocalLauncher()
