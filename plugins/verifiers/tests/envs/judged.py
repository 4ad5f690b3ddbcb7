"""Refused: an Env judging the finished episode itself (finalize), as multi-seat envs do."""

import verifiers.v1 as vf


class PlainTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(prompt="Say hi."), self.config.task)


class JudgedEnv(vf.Env[vf.SingleAgentEnvConfig]):
    async def run(self, task, agents):
        await agents.agent.run(task)

    async def finalize(self, task, episode):
        for trace in episode.traces:
            trace.record_reward("polite", float("hi" in trace.last_reply.lower()))


__all__ = ["PlainTaskset", "JudgedEnv"]
