"""Single-turn: a capital city per country, from a local list; scored by the task's own reward."""

import verifiers.v1 as vf

CAPITALS = [("France", "Paris"), ("Japan", "Tokyo"), ("Peru", "Lima"), ("Kenya", "Nairobi")]


class CapitalData(vf.TaskData):
    answer: str


class CapitalTask(vf.Task[CapitalData]):
    @vf.reward(weight=2.0)
    async def correct(self, task: CapitalData, trace: vf.Trace) -> float:
        return float(task.answer.lower() in trace.last_reply.lower())

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 20)

    @vf.metric
    async def words(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply.split()))


class CapitalsConfig(vf.TasksetConfig):
    countries: int = 4


class CapitalsTaskset(vf.Taskset[CapitalTask, CapitalsConfig]):
    def load(self):
        for country, capital in CAPITALS[: self.config.countries]:
            yield CapitalTask(
                CapitalData(
                    prompt=f"What is the capital of {country}?", system_prompt="Be brief.", answer=capital
                ),
                self.config.task,
            )


__all__ = ["CapitalsTaskset"]
