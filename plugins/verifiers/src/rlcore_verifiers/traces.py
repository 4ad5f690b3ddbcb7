"""verifiers traces from rlcore's side: built while an episode plays, written into the row as a
JSON record, and rebuilt in the reward's worker process to score.

A record is ``{"nodes": [{"message": {...}, "sampled": bool}, ...], "stop": str | None,
"state": {...}}``: the seat's conversation in order (prompt messages, model turns, tool results,
the env's user turns), why it stopped, and the task's state (what toolsets wrote to it).
"""

from __future__ import annotations

import math
from typing import Any

KEY = "verifiers"  # extra_info key of everything this plugin puts in a row


def new_trace(task: Any, seat: str, seat_config: Any) -> Any:
    """An empty trace of ``task`` for ``seat``, as a verifiers rollout mints one."""
    import verifiers.v1 as vf
    from verifiers.v1.state import state_cls

    return vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        state=state_cls(type(task))(),
        agent=vf.AgentInfo(config=seat_config, name=seat),
    )


def append(trace: Any, message: Any, sampled: bool) -> None:
    """Append one message to the trace's (single) branch."""
    from verifiers.v1.graph import MessageNode

    parent = len(trace.nodes) - 1 if trace.nodes else None
    trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))


def message(data: dict[str, Any]) -> Any:
    """A typed verifiers message from an OpenAI-style dict."""
    import verifiers.v1 as vf
    from pydantic import TypeAdapter

    return TypeAdapter(vf.Message).validate_python(data)


def record(trace: Any) -> dict[str, Any]:
    return {
        "nodes": [
            {"message": n.message.model_dump(mode="json", exclude_none=True), "sampled": n.sampled}
            for n in trace.nodes
        ],
        "stop": trace.stop_condition,
        "state": trace.state.model_dump(mode="json"),
    }


def from_record(task: Any, seat: str, seat_config: Any, rec: dict[str, Any]) -> Any:
    trace = new_trace(task, seat, seat_config)
    for node in rec.get("nodes", []):
        append(trace, message(node["message"]), bool(node.get("sampled")))
    if rec.get("state"):
        trace.state = type(trace.state).model_validate(rec["state"])
    if rec.get("stop"):
        trace.stop(rec["stop"])
    return trace


def from_response(
    task: Any, seat: str, seat_config: Any, prompt_messages: list[dict[str, Any]], response: str
) -> Any:
    """A one-turn trace: the row's prompt and the model's reply (rows played by another agent loop)."""
    import verifiers.v1 as vf

    trace = new_trace(task, seat, seat_config)
    for m in prompt_messages:
        append(trace, message(m), False)
    append(trace, vf.AssistantMessage(content=response), True)
    return trace


async def score(task: Any, trace: Any) -> tuple[float, dict[str, float]]:
    """The task's ``@vf.reward`` functions (weighted sum) and ``@vf.metric`` functions over the
    trace, run by the task's own ``score`` (so plugged functions and priorities apply)."""
    await task.score(trace, runtime=None)
    metrics: dict[str, float] = {}
    for name, reward in trace.rewards.items():
        if reward is None:
            raise ValueError(f"reward {name!r} was not scored")
        metrics[name] = float(reward.score)
    for name, value in trace.metrics.items():
        if value is not None and math.isfinite(float(value)):
            metrics[f"metric/{name}"] = float(value)
    return float(trace.reward), metrics
