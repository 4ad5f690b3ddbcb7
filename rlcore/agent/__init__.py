"""Agent loops (how prompts become trajectories) and what loops and the server share:
tool-call parsing (:mod:`rlcore.agent.tool_calls`)."""
