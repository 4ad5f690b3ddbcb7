"""Multi-turn: the env answers each guess with "higher" or "lower" until the model finds the number
(an Env whose run() drives the seat turn by turn); a @vf.stop ends the episode on "I give up"."""

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward
    async def found(self, task: GuessData, trace: vf.Trace) -> float:
        return float(any(m.content.strip() == str(task.secret) for m in trace.assistant_messages))

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(len(trace.assistant_messages))

    @vf.stop
    async def gave_up(self, trace: vf.Trace) -> bool:
        return "give up" in trace.last_reply.lower()


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for secret in (3, 7):
            yield GuessTask(
                GuessData(prompt="Guess my number between 1 and 9. Reply with a number.", secret=secret),
                self.config.task,
            )


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(max_turns=4)


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as game:
            reply = await game.turn()
            while not reply.terminated:
                text = reply.last_reply
                if text == str(task.data.secret):
                    break
                hint = "higher" if text.isdigit() and int(text) < task.data.secret else "lower"
                reply = await game.turn(f"No, {hint}.")


__all__ = ["GuessTaskset", "GuessEnv"]
