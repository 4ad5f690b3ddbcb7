"""Refused: a reward that needs a sandbox runtime, and an interception hook."""

import verifiers.v1 as vf


class PlainData(vf.TaskData):
    answer: str = ""


class PlainTask(vf.Task[PlainData]):
    @vf.reward
    async def any_reply(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class SandboxTask(vf.Task[PlainData]):
    @vf.reward
    async def file_written(self, trace: vf.Trace, runtime) -> float:
        return 1.0

    @vf.intercept
    async def rewrite(self, request: vf.Request) -> vf.Request | None:
        return None


class SandboxTaskset(vf.Taskset[SandboxTask, vf.TasksetConfig]):
    def load(self):
        yield SandboxTask(PlainData(prompt="Write a file."), self.config.task)


__all__ = ["SandboxTaskset"]
