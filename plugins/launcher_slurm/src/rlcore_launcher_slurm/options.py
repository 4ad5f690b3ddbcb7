"""The ``[launcher]`` options of ``name = "slurm"``. Imports nothing heavy: ``rlcore validate`` uses it."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlcore.components import Options

# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED / INFINITE.
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)$")
_MEM = re.compile(r"^\d+[KMGT]?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SBATCH_LONG = re.compile(r"^--[a-z][a-z0-9-]*(=.*)?$|^-[A-Za-z]( .*)?$")


def time_limit_seconds(value: str | None) -> int | None:
    """An sbatch --time value in seconds; None when unlimited or not given (the partition's)."""
    if value is None or value in ("UNLIMITED", "INFINITE"):
        return None
    days, _, clock = value.rpartition("-")
    parts = [int(x) for x in clock.split(":")]
    if days:  # days-hours[:minutes[:seconds]]
        hours, minutes, seconds = (parts + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(parts) == 1:  # minutes
        return parts[0] * 60
    if len(parts) == 2:  # minutes:seconds
        return parts[0] * 60 + parts[1]
    return (parts[0] * 60 + parts[1]) * 60 + parts[2]


class SlurmOptions(Options):
    """How to ask SLURM for resources and what to run inside the allocation."""

    nodes: int = Field(1, ge=1, le=4096, description="nodes in the allocation; more than 1 starts a Ray cluster")
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs per node (--gpus-per-node); 0 asks for none")
    cpus_per_task: int | None = Field(
        None, ge=1, le=4096, description="CPUs for the one task per node (--cpus-per-task); default: SLURM's"
    )
    mem: str | None = Field(None, description='memory per node, e.g. "64G" or "0" for all of it (--mem)')
    partition: str | None = Field(None, description="the partition (default: the cluster's default partition)")
    account: str | None = Field(None, description="the account to charge (--account)")
    time: str | None = Field(
        None, description='time limit, SLURM syntax: "30", "4:00:00", "1-12:00:00" (default: the partition\'s)'
    )
    container: str | None = Field(
        None, description="an Apptainer/Singularity image: every command of the job runs inside it"
    )
    container_binds: list[str] = Field(
        default_factory=list, description="extra paths bound into the container (the run directory always is)"
    )
    network_interface: str | None = Field(
        None, description='the interface whose IPv4 address Ray binds on each node, e.g. "ib0" (default: the first address of `hostname -I`)'
    )
    ray: Literal["auto", "on", "off"] = Field(
        "auto",
        description="start a Ray cluster in the allocation: auto = always with several nodes, "
        "with one node only when Ray is installed; off is only allowed with one node",
    )
    ray_port: int | None = Field(
        None, ge=1024, le=65535, description="the Ray head's GCS port (default: derived from the job id, to avoid clashes)"
    )
    ray_join_timeout: float = Field(300.0, gt=0, le=7200, description="seconds to wait for every node to join Ray")
    stop_signal_s: int = Field(
        120, ge=0, le=86400,
        description="seconds before the time limit when SLURM sends the job SIGUSR1 (sbatch --signal=B:USR1@N), "
        "so the driver finishes its step and writes a checkpoint; 0 leaves only SLURM's SIGTERM at the limit",
    )
    sbatch_extra: list[str] = Field(
        default_factory=list, description='extra sbatch options, one per item: "--qos=high" or "#SBATCH --qos=high"'
    )
    env: dict[str, str] = Field(default_factory=dict, description="environment variables set in the job")
    python: str | None = Field(
        None, description="the Python interpreter on the nodes (default: the one running rlcore now)"
    )
    poll_interval: float = Field(2.0, gt=0, le=300, description="seconds between job state checks while following")
    job_name: str | None = Field(
        None, min_length=1, max_length=100, description='the job name after the "rlcore-" prefix (default: the run name)'
    )

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None and not _MEM.match(value.strip()):
            raise ValueError(f'expected a size like "64G", "512M" or "0" (all of the node\'s memory), got {value!r}')
        return None if value is None else value.strip()

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _TIME.match(value.strip()):
            raise ValueError(
                f'expected a SLURM time limit ("minutes", "minutes:seconds", "hours:minutes:seconds", '
                f'"days-hours[:minutes[:seconds]]" or "UNLIMITED"), got {value!r}'
            )
        return None if value is None else value.strip()

    @field_validator("partition", "account", "network_interface", "job_name")
    @classmethod
    def _word(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9_.:@+-]+", value):
            raise ValueError(f"expected one word of letters, digits and _.:@+- (no spaces), got {value!r}")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [name for name in value if not _ENV_NAME.match(name)]
        if bad:
            raise ValueError(f"environment variable names must match [A-Za-z_][A-Za-z0-9_]*, got {bad}")
        return value

    @field_validator("sbatch_extra")
    @classmethod
    def _extra(cls, value: list[str]) -> list[str]:
        lines = []
        for item in value:
            if "\n" in item or "\r" in item:
                raise ValueError(f"one sbatch option per item, without newlines, got {item!r}")
            option = item.strip()
            if option.startswith("#SBATCH"):
                option = option[len("#SBATCH") :].strip()
            if not _SBATCH_LONG.match(option):
                raise ValueError(f'expected an sbatch option such as "--qos=high" or "#SBATCH --qos=high", got {item!r}')
            lines.append(option)
        return lines

    @model_validator(mode="after")
    def _ray_needs_it(self) -> "SlurmOptions":
        if self.ray == "off" and self.nodes > 1:
            raise ValueError(f"ray = \"off\" needs nodes = 1 (got nodes = {self.nodes}): several nodes work together through Ray")
        return self

    def uses_ray(self) -> bool | None:
        """True: start Ray; False: don't; None: start it when Ray imports on the node (``auto`` with one node)."""
        if self.ray == "on" or self.nodes > 1:
            return True
        if self.ray == "off":
            return False
        return None
