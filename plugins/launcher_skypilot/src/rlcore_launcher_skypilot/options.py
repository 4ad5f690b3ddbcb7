"""The ``[launcher]`` options of ``name = "skypilot"``. Imports nothing heavy (no sky): ``rlcore
validate`` uses it. The resource fields take SkyPilot's own syntax and go to the task's
``resources`` as they are; SkyPilot checks them again when the task is launched."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlcore.components import Options

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# NAME or NAME:COUNT (SkyPilot's "H100:8", "A100-80GB:4", "L4", "tpu-v5e-8"); a fractional count is
# SkyPilot's way of sharing a GPU between tasks, which training ranks cannot do.
_ACCELERATORS = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*)(?::(\d+))?$")
_AMOUNT = re.compile(r"^\d+(\.\d+)?\+?$")  # SkyPilot's cpus / memory: "8", "8+", "32.5+"
_WORD = re.compile(r"^[A-Za-z0-9_.:/@+-]+$")
# SkyPilot's cluster names: a letter first, then letters, digits, - _ . ending in a letter or digit.
_CLUSTER = re.compile(r"^[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$")
# Set by the run script for each rank; a user value would break the process group.
RESERVED_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


class SkyPilotOptions(Options):
    """What to ask SkyPilot for, how the nodes get rlcore, and where the run lives on them."""

    accelerators: str | None = Field(
        None,
        description='GPUs per node, SkyPilot syntax: "H100:8", "A100-80GB:4", "L4" (one); default: none (CPU nodes)',
    )
    nodes: int = Field(
        1,
        ge=1,
        le=1024,
        description="nodes of the cluster (the task's num_nodes); every node runs ranks_per_node ranks",
    )
    ranks_per_node: int | None = Field(
        None,
        ge=1,
        le=256,
        description="training ranks per node: default one per GPU (SKYPILOT_NUM_GPUS_PER_NODE on the node), or 1 without GPUs",
    )
    cloud: str | None = Field(
        None,
        description='the cloud ("aws", "gcp", "azure", "kubernetes", "lambda", ...); default: the cheapest enabled one',
    )
    region: str | None = Field(None, description="the region; default: any")
    zone: str | None = Field(None, description="the zone; default: any")
    instance_type: str | None = Field(
        None, description="an instance type; default: SkyPilot picks one that has the accelerators"
    )
    cpus: str | None = Field(None, description='vCPUs per node, SkyPilot syntax: "32" or "32+" (at least)')
    memory: str | None = Field(
        None, description='memory per node in GB, SkyPilot syntax: "256" or "256+" (at least)'
    )
    disk_size: int | None = Field(None, ge=1, le=65536, description="the OS disk of each node, in GB")
    use_spot: bool = Field(
        False,
        description="spot (preemptible) instances; with managed = true SkyPilot recovers a preempted job",
    )
    image_id: str | None = Field(
        None, description='a machine or container image, e.g. "docker:nvcr.io/nvidia/pytorch:24.10-py3"'
    )
    cluster_name: str | None = Field(
        None, description='the cluster (cluster mode) or managed job name; default: "rlcore-<run name>"'
    )
    managed: bool = Field(
        False,
        description="run as a SkyPilot managed job (sky.jobs.launch): its own cluster, torn down at the end, "
        "recovered after a preemption; default: a cluster that stays up (sky.launch)",
    )
    down: bool = Field(
        False, description="cluster mode: tear the cluster down once the job is done and it is idle"
    )
    idle_minutes_to_autostop: int | None = Field(
        None,
        ge=0,
        le=525600,
        description="cluster mode: stop (or, with down, tear down) the cluster after this many idle minutes",
    )
    workdir: str | None = Field(
        None,
        description="a local directory SkyPilot syncs to ~/sky_workdir on every node (the commands run there); "
        "manifest paths under it are rewritten to the nodes' copy",
    )
    file_mounts: dict[str, str | dict] = Field(
        default_factory=dict,
        description="SkyPilot file_mounts, node path -> local path, bucket URL or storage table, e.g. "
        '{ "/checkpoints" = { name = "my-bucket", mode = "MOUNT_CACHED" } }; manifest paths under a local source are rewritten',
    )
    remote_run_dir: str | None = Field(
        None,
        description='the run directory on the nodes; default "~/rlcore-runs/<run name>". With several nodes it must be '
        "shared by them (a bucket in file_mounts): every rank writes its part of each checkpoint there",
    )
    install: Literal["pip", "workdir", "none"] = Field(
        "pip",
        description='how setup installs rlcore and the plugins the run uses: "pip" (the versions this machine has, from '
        'the package index), "workdir" (from their source directories in workdir) or "none" (the image has them)',
    )
    pip_extra: list[str] = Field(
        default_factory=list,
        description='more pip requirements for setup, e.g. ["torch==2.6.0", "flash-attn"]',
    )
    setup_extra: list[str] = Field(
        default_factory=list, description="shell commands setup runs after the installs, one per item"
    )
    python: str = Field("python3", min_length=1, description="the Python interpreter on the nodes")
    master_port: int = Field(
        29500, ge=1024, le=65535, description="the rendezvous port on the first node (MASTER_PORT)"
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="environment variables of the task (its envs), on every node"
    )

    @field_validator("accelerators")
    @classmethod
    def _accelerators(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = _ACCELERATORS.match(value.strip())
        if not match:
            raise ValueError(
                f'expected "NAME" or "NAME:COUNT" such as "H100:8" (one accelerator type), got {value!r}'
            )
        if match.group(2) is not None and int(match.group(2)) < 1:
            raise ValueError(f"the accelerator count must be at least 1, got {value!r}")
        return value.strip()

    @field_validator("cpus", "memory")
    @classmethod
    def _amount(cls, value: str | None) -> str | None:
        if value is not None and not _AMOUNT.match(value.strip()):
            raise ValueError(
                f'expected a number, or a number and "+" for "at least" ("32", "32+"), got {value!r}'
            )
        return None if value is None else value.strip()

    @field_validator("cloud", "region", "zone", "instance_type")
    @classmethod
    def _word(cls, value: str | None) -> str | None:
        if value is not None and not _WORD.match(value):
            raise ValueError(f"expected one word (no spaces), got {value!r}")
        return value

    @field_validator("cluster_name")
    @classmethod
    def _cluster(cls, value: str | None) -> str | None:
        if value is not None and (len(value) > 63 or not _CLUSTER.match(value)):
            raise ValueError(
                "expected a SkyPilot cluster name: a letter first, then letters, digits, '-', '_' or '.', ending in a "
                f"letter or digit, at most 63 characters; got {value!r}"
            )
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [name for name in value if not _ENV_NAME.match(name)]
        if bad:
            raise ValueError(f"environment variable names must match [A-Za-z_][A-Za-z0-9_]*, got {bad}")
        reserved = [name for name in value if name in RESERVED_ENV or name.startswith("SKYPILOT_")]
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)} are set for each rank by the run script (or SkyPilot); remove them"
            )
        return value

    @field_validator("setup_extra", "pip_extra")
    @classmethod
    def _one_line(cls, value: list[str]) -> list[str]:
        for item in value:
            if not item.strip() or "\n" in item:
                raise ValueError(f"one non-empty line per item, got {item!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SkyPilotOptions:
        gpus = self.gpus_per_node()
        if gpus and self.ranks_per_node and self.ranks_per_node > gpus:
            raise ValueError(
                f"ranks_per_node = {self.ranks_per_node} is more than the {gpus} GPU(s) of accelerators = "
                f"{self.accelerators!r}: each rank needs a GPU of its own (NCCL cannot put two ranks on one GPU)"
            )
        if self.install == "workdir" and not self.workdir:
            raise ValueError(
                'install = "workdir" installs rlcore and the plugins from workdir: set workdir too'
            )
        if self.managed and (self.down or self.idle_minutes_to_autostop is not None):
            raise ValueError(
                "down and idle_minutes_to_autostop are for cluster mode: a managed job's cluster is "
                "always torn down when the job ends"
            )
        return self

    def gpus_per_node(self) -> int:
        """The accelerator count of ``accelerators`` (0 without any)."""
        if not self.accelerators:
            return 0
        count = _ACCELERATORS.match(self.accelerators).group(2)
        return int(count) if count else 1
