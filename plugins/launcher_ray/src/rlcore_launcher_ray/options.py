"""The ``[launcher]`` options of ``name = "ray"``. Imports nothing heavy: ``rlcore validate`` uses it."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from rlcore.components import Options

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the launcher for every rank; a user value would break the process group.
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


class RuntimeEnvOptions(Options):
    """Extras of the Ray runtime environment every worker (and, in job mode, the driver) starts in."""

    env_vars: dict[str, str] = Field(
        default_factory=dict, description="environment variables set in every worker"
    )
    pip: list[str] = Field(
        default_factory=list,
        description='pip requirements installed into the workers\' environment, e.g. ["rlcore-algo-grpo"]',
    )

    @field_validator("env_vars")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [name for name in value if not _ENV_NAME.match(name)]
        if bad:
            raise ValueError(f"environment variable names must match [A-Za-z_][A-Za-z0-9_]*, got {bad}")
        reserved = [name for name in value if name in RESERVED_ENV]
        if reserved:
            raise ValueError(
                f"{', '.join(reserved)} are set by the launcher for each rank; remove them from env_vars"
            )
        return value

    def as_ray(self) -> dict:
        """The ``runtime_env`` dict Ray takes (empty parts left out)."""
        env: dict = {}
        if self.env_vars:
            env["env_vars"] = dict(self.env_vars)
        if self.pip:
            env["pip"] = list(self.pip)
        return env


class RayOptions(Options):
    """Where the ranks run and what each one gets."""

    address: str | None = Field(
        None,
        description='the Ray cluster: "host:6379" (GCS), "ray://host:10001" (Ray client), "auto", or with job = true '
        'the Jobs API "http://host:8265". Default: $RAY_ADDRESS, else a local Ray instance started for the run',
    )
    job: bool = Field(
        False,
        description="submit the run as a Ray job through the Jobs API (address http://host:8265) and follow its logs",
    )
    workers: int = Field(
        1, ge=1, le=4096, description="trainer ranks, one Ray actor each (torch.distributed world size)"
    )
    cpus_per_worker: float = Field(1.0, gt=0, le=1024, description="CPUs reserved for each rank")
    gpus_per_worker: int = Field(
        0,
        ge=0,
        le=1,
        description="GPUs reserved for each rank: 0 or 1 (one rank drives one GPU; use more workers for more GPUs)",
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="how the ranks' bundles spread over nodes (Ray placement group strategy)"
    )
    colocate: bool = Field(
        True,
        description="rollout, reward and training share each rank's resources and take turns; "
        "split placement (rollout on bundles of its own) is not available yet",
    )
    runtime_env: RuntimeEnvOptions = Field(
        default_factory=RuntimeEnvOptions, description="Ray runtime environment extras (env_vars, pip)"
    )
    connect_timeout: float = Field(
        10.0, gt=0, le=600, description="seconds to wait for the Ray address to answer"
    )
    placement_timeout: float = Field(
        120.0, gt=0, le=86400, description="seconds to wait for the cluster to reserve every rank's bundle"
    )
    failure_grace: float = Field(
        10.0,
        ge=0,
        le=3600,
        description="after one rank fails, seconds the others get to stop on their own before they are killed",
    )
    include_dashboard: bool = Field(
        False, description="start Ray's dashboard with a local Ray instance (127.0.0.1 only)"
    )
    python: str = Field(
        "python", min_length=1, description="job mode: the interpreter that runs the driver on the cluster"
    )

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not value or any(c.isspace() for c in value):
            raise ValueError(
                f'expected an address such as "10.0.0.1:6379", "ray://host:10001" or "http://host:8265", got {value!r}'
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> RayOptions:
        if not self.colocate:
            raise ValueError(
                "colocate = false (rollout and reward on bundles of their own) is not available in the ray launcher yet; "
                "leave colocate = true: every rank runs rollout, reward and training on its own bundle"
            )
        if self.address and self.address.startswith(("http://", "https://")) and not self.job:
            raise ValueError(
                f"{self.address!r} is a Jobs API (dashboard) address: set job = true to submit the run as a Ray job, "
                'or give the cluster\'s GCS address ("host:6379") to run the ranks from this process'
            )
        if self.job and self.address and not self.address.startswith(("http://", "https://")):
            raise ValueError(
                f'job = true submits through the Jobs API: expected an address like "http://host:8265", got {self.address!r}'
            )
        return self

    def driver_options(self) -> dict:
        """The options the driver on the cluster runs with in job mode: the same ranks, on the job's
        own cluster (Ray sets RAY_ADDRESS for the job), without submitting again."""
        data = self.model_dump(exclude={"address", "job", "runtime_env", "python"}, exclude_defaults=True)
        return {"name": "ray", **data}
