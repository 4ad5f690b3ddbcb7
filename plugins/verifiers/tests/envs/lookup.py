"""A tool: a key-value toolset (MCP, per episode) the model must query; the toolset writes the keys
it was asked into the rollout's state, which the task's reward reads."""

import verifiers.v1 as vf
from pydantic import Field


class LookupState(vf.State):
    asked: list[str] = Field(default_factory=list)


class LookupToolsetConfig(vf.ToolsetConfig):
    table: dict[str, str] = Field(default_factory=lambda: {"alpha": "17", "beta": "25"})


class Lookup(vf.Toolset[LookupToolsetConfig, LookupState]):
    @vf.tool
    async def get(self, key: str) -> str:
        """The value stored under key."""
        self.state.asked.append(key)
        if key not in self.config.table:
            raise KeyError(f"no key {key!r}")
        return self.config.table[key]


class LookupTaskConfig(vf.TaskConfig):
    tools: LookupToolsetConfig = LookupToolsetConfig()


class LookupData(vf.TaskData):
    key: str
    answer: str


class LookupTask(vf.Task[LookupData, LookupState, LookupTaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [Lookup(config.tools)]

    @vf.reward
    async def correct(self, task: LookupData, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip() == task.answer)

    @vf.reward(weight=0.1)
    async def looked_up(self, task: LookupData, trace: vf.Trace) -> float:
        return float(task.key in trace.state.asked)


class LookupTasksetConfig(vf.TasksetConfig):
    task: LookupTaskConfig = LookupTaskConfig()


class LookupTaskset(vf.Taskset[LookupTask, LookupTasksetConfig]):
    def load(self):
        table = self.config.task.tools.table
        for key in sorted(table):
            yield LookupTask(
                LookupData(
                    prompt=f"Look up {key} with the tool and reply with its value only.",
                    key=key,
                    answer=table[key],
                ),
                self.config.task,
            )


__all__ = ["LookupTaskset"]
