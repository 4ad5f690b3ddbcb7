"""The `function` tool: a plain typed function from a manifest's [tools.NAME] table."""

from __future__ import annotations

import asyncio
import textwrap

from rlcore.interfaces import BuildContext
from rlcore.manifest.loader import load_manifest
from rlcore.testing import require_plugins
from rlcore.testing.tools import assert_tool_conforms

USER_TOOLS = '''
from typing import Literal


def convert(value: float, unit: Literal["km", "mi"] = "km", digits: int = 2) -> dict:
    """Convert a distance between kilometres and miles.

    Args:
        value: the distance to convert
        unit: the unit of `value`
        digits: decimals to keep
    """
    factor = 0.621371 if unit == "km" else 1 / 0.621371
    return {"result": round(value * factor, digits), "unit": "mi" if unit == "km" else "km"}


async def shout(text: str) -> str:
    """Upper-case a text."""
    return text.upper()
'''


def test_function_tool_from_a_manifest(tmp_path):
    # The manifest must be valid: the hf engine (default), the math reward, grpo (default).
    require_plugins("rlcore_rollout_hf", "rlcore_reward_rule", "rlcore_algo_grpo")
    (tmp_path / "user_tools.py").write_text(USER_TOOLS)
    manifest = tmp_path / "m.toml"
    manifest.write_text(
        textwrap.dedent(
            """
            [model]
            path = "x"
            [data]
            train = "synthetic:arithmetic"
            [reward]
            function = "math"
            [trainer]
            steps = 1
            [agent]
            loop = "tool"
            [tools.distance]
            function = "python:user_tools.py:convert"
            [tools.loud]
            function = "python:user_tools.py:shout"
            name = "shout_it"
            """
        )
    )
    resolved = load_manifest(manifest)
    selected = {s.role: s for s in resolved.roles("tools")}
    assert {s.component.name for s in selected.values()} == {"function"}
    context = BuildContext(manifest_dir=str(tmp_path))
    tools = {role.split(".")[1]: s.component.build(s.options, context) for role, s in selected.items()}

    from rlcore.registry import Registry
    from rlcore.testing.tools import make_chat_tokenizer

    loop = (
        Registry.discover()
        .get("agent_loop", "tool")
        .build({}, BuildContext(tokenizer=make_chat_tokenizer(), tools=tools))
    )
    assert sorted(loop.tools) == ["distance", "shout_it"]  # the table name, unless `name` is given

    distance = loop.tools["distance"]
    fn = distance.schema()["function"]
    assert fn["description"] == "Convert a distance between kilometres and miles."
    props = fn["parameters"]["properties"]
    assert props["value"] == {"type": "number", "description": "the distance to convert"}
    assert props["unit"]["enum"] == ["km", "mi"] and props["unit"]["default"] == "km"
    assert fn["parameters"]["required"] == ["value"]
    result = assert_tool_conforms(distance, {"value": 10})
    assert result.text == '{"result": 6.21, "unit": "mi"}' and not result.error

    bad = asyncio.run(distance.execute("t", {"value": "far", "colour": 1}))
    assert bad.error and "value" in bad.text and "colour" in bad.text
    assert assert_tool_conforms(loop.tools["shout_it"], {"text": "hi"}).text == "HI"
