"""The ``[launcher]`` options of ``name = "slurm"``. Imports nothing heavy: ``rlcore validate`` uses it."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from rlcore.components import Options

# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED / INFINITE.
_TIME = re.compile(
    r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)$"
)
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

    nodes: int = Field(
        1, ge=1, le=4096, description="nodes in the allocation; every node runs ranks_per_node training ranks"
    )
    gpus_per_node: int = Field(0, ge=0, le=64, description="GPUs per node (--gpus-per-node); 0 asks for none")
    ranks_per_node: int | None = Field(
        None,
        ge=1,
        le=256,
        description="training ranks (SLURM tasks) per node: default one per GPU, or 1 without GPUs; "
        "on CPU each rank is a process with its own share of the node's cores (cpus_per_task)",
    )
    cpus_per_task: int | None = Field(
        None, ge=1, le=4096, description="CPUs for each rank (--cpus-per-task); default: SLURM's"
    )
    mem: str | None = Field(None, description='memory per node, e.g. "64G" or "0" for all of it (--mem)')
    partition: str | None = Field(
        None, description="the partition (default: the cluster's default partition)"
    )
    account: str | None = Field(None, description="the account to charge (--account)")
    time: str | None = Field(
        None,
        description='time limit, SLURM syntax: "30", "4:00:00", "1-12:00:00" (default: the partition\'s)',
    )
    container: str | None = Field(
        None, description="an Apptainer/Singularity image: every command of the job runs inside it"
    )
    container_binds: list[str] = Field(
        default_factory=list, description="extra paths bound into the container (the run directory always is)"
    )
    network_interface: str | None = Field(
        None,
        description='the interface the ranks talk over, e.g. "ib0": MASTER_ADDR is the first node\'s IPv4 address on it, '
        "and GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name it (default: the first node's address toward the default route)",
    )
    master_port: int | None = Field(
        None,
        ge=1024,
        le=65535,
        description="the rendezvous port on the first node (MASTER_PORT; default: a port free there when the job starts)",
    )
    stop_signal_s: int = Field(
        120,
        ge=0,
        le=86400,
        description="seconds before the time limit when SLURM sends the job SIGUSR1 (sbatch --signal=B:USR1@N), "
        "so the driver finishes its step and writes a checkpoint; 0 leaves only SLURM's SIGTERM at the limit",
    )
    sbatch_extra: list[str] = Field(
        default_factory=list,
        description='extra sbatch options, one per item: "--qos=high" or "#SBATCH --qos=high"',
    )
    env: dict[str, str] = Field(default_factory=dict, description="environment variables set in the job")
    python: str | None = Field(
        None, description="the Python interpreter on the nodes (default: the one running rlcore now)"
    )
    poll_interval: float = Field(
        2.0, gt=0, le=300, description="seconds between job state checks while following"
    )
    job_name: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description='the job name after the "rlcore-" prefix (default: the run name)',
    )

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None and not _MEM.match(value.strip()):
            raise ValueError(
                f'expected a size like "64G", "512M" or "0" (all of the node\'s memory), got {value!r}'
            )
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
                raise ValueError(
                    f'expected an sbatch option such as "--qos=high" or "#SBATCH --qos=high", got {item!r}'
                )
            lines.append(option)
        return lines

    @model_validator(mode="after")
    def _ranks_fit_the_gpus(self) -> SlurmOptions:
        if self.gpus_per_node and self.ranks_per_node and self.ranks_per_node > self.gpus_per_node:
            raise ValueError(
                f"ranks_per_node = {self.ranks_per_node} is more than gpus_per_node = {self.gpus_per_node}: "
                "each rank needs a GPU of its own (NCCL cannot put two ranks on one GPU)"
            )
        return self

    def ranks(self) -> int:
        """Training ranks per node: ``ranks_per_node``, else one per GPU, else 1."""
        return self.ranks_per_node or self.gpus_per_node or 1
