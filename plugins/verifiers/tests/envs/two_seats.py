"""Refused: two seats (a second one would need a second model)."""

import verifiers.v1 as vf


class PlainData(vf.TaskData):
    answer: str = ""


class PlainTask(vf.Task[PlainData]):
    @vf.reward
    async def any_reply(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


class PlainTaskset(vf.Taskset[PlainTask, vf.TasksetConfig]):
    def load(self):
        yield PlainTask(PlainData(prompt="Say hi."), self.config.task)


class TwoSeatsConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    critic: vf.AgentConfig = vf.AgentConfig()


class TwoSeats(vf.Env[TwoSeatsConfig]):
    async def run(self, task, agents):
        await agents.solver.run(task)
        await agents.critic.run(task)


__all__ = ["PlainTaskset", "TwoSeats"]
