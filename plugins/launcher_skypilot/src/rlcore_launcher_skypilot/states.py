"""A SkyPilot job's final state as rlcore's exit code and one line that says what happened. No sky
import: the names are SkyPilot's JobStatus / ManagedJobStatus values and JobExitCode names."""

from __future__ import annotations

# state -> (exit code, what it means)
OUTCOMES: dict[str, tuple[int, str]] = {
    "SUCCEEDED": (0, "the job succeeded"),
    "FAILED": (1, "a rank failed (see the log above: the run script names it)"),
    "FAILED_SETUP": (
        1,
        "setup failed: installing rlcore or the plugins on the nodes ([launcher] install, pip_extra, setup_extra)",
    ),
    "FAILED_DRIVER": (1, "SkyPilot's job driver failed on the cluster"),
    "FAILED_PRECHECKS": (1, "the managed job failed SkyPilot's checks before it started"),
    "FAILED_NO_RESOURCE": (1, "no cloud had the resources the task asks for"),
    "FAILED_CONTROLLER": (1, "the managed jobs controller failed"),
    "CANCELLED": (1, "the job was cancelled"),
}
# tail_logs' return value (sky.exceptions.JobExitCode) by name
EXIT_CODE_NAMES = {0: "SUCCEEDED", 100: "FAILED", 101: "NOT_FINISHED", 102: "NOT_FOUND", 103: "CANCELLED"}


def outcome(state: object) -> tuple[int, str] | None:
    """(exit code, description) of a final state (an enum or its name); None for a state that is
    not final (the job is still pending or running, or was not found)."""
    name = str(getattr(state, "value", state) or "").upper()
    return OUTCOMES.get(name)


def state_of_exit_code(code: int | None) -> str:
    """The name of the state a ``sky.tail_logs`` return value stands for."""
    return EXIT_CODE_NAMES.get(code if isinstance(code, int) else -1, f"EXIT_{code}")
