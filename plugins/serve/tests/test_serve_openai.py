"""`rlcore serve` as a real subprocess, driven by the official `openai` client.

The engine is a scripted one (it answers with a tool call whenever tools are offered), provided by
a tiny test distribution that this test writes to a directory on PYTHONPATH: a module plus a
``.dist-info`` whose ``entry_points.txt`` registers it in the ``rlcore`` group. So `rlcore serve`
discovers and builds it exactly as it would a pip-installed engine plugin, and the test controls
the output without a trained model. The tokenizer is the tiny tool-aware one from
:mod:`rlcore.testing.tools`, saved as a Hugging Face tokenizer directory the manifest points at.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from rlcore.testing.tools import make_chat_tokenizer

pytestmark = pytest.mark.slow  # starts a server process (imports torch): ~30 s

ENGINE_MODULE = """
import json
import rlcore
from rlcore.components import Component, Options
from rlcore.testing.tools import ScriptedEngine


def script(text, i):
    if "<tools>" in text and "<|im_start|>tool" not in text:
        return '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    return f"Plain answer {i}."


def build(options, context):
    return ScriptedEngine(context.tokenizer, script, logprob=-0.125)


@rlcore.hookimpl
def rlcore_rollout_engines():
    return [Component(name="scripted", factory=build, options=Options, description="test engine", needs={"tokenizer"})]


def never_built(options, context):
    raise AssertionError("serving builds no advantage estimator")


# A manifest names one, and rlcore-serve alone installs none (the algorithm plugins are not its dependencies).
@rlcore.hookimpl
def rlcore_advantage_estimators():
    return [Component(name="scripted_outcome", factory=never_built, options=Options, description="test estimator")]
"""

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    site = root / "site"
    (site / "rlcore_test_scripted_engine-0.0.1.dist-info").mkdir(parents=True)
    (site / "rlcore_test_scripted_engine.py").write_text(ENGINE_MODULE)
    info = site / "rlcore_test_scripted_engine-0.0.1.dist-info"
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: rlcore-test-scripted-engine\nVersion: 0.0.1\n"
    )
    (info / "entry_points.txt").write_text("[rlcore]\nscripted = rlcore_test_scripted_engine\n")
    tok_dir = root / "tokenizer"
    make_chat_tokenizer().save_pretrained(tok_dir)
    reward = root / "reward.py"  # a builtin reward: the served manifest must validate with rlcore-serve alone
    reward.write_text("def score(item):\n    return 0.0\n")
    manifest = root / "serve.toml"
    manifest.write_text(
        textwrap.dedent(
            f"""
            [run]
            name = "tiny-scripted"
            device = "cpu"
            [model]
            path = "{tok_dir}"
            [data]
            train = "synthetic:arithmetic"
            max_response_tokens = 64
            [rollout]
            engine = "scripted"
            [reward]
            function = "python:{reward}:score"
            [algorithm]
            advantage = "scripted_outcome"
            [trainer]
            steps = 1
            """
        )
    )
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlcore",
            "serve",
            str(manifest),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-tokens-limit",
            "64",
            "--batch-size",
            "4",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("rlcore serve exited: " + proc.stdout.read().decode())
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.3)
    else:
        proc.kill()
        pytest.fail("rlcore serve did not become healthy")
    yield url
    proc.terminate()
    proc.wait(15)


def test_openai_client_gets_a_tool_call(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["tiny-scripted"]
    response = client.chat.completions.create(
        model="tiny-scripted",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER],
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")
    extra = response.model_extra
    assert extra["prompt_token_ids"] and choice.model_extra["token_ids"]
    assert len(choice.logprobs.content) == len(choice.model_extra["token_ids"])
    assert all(item.logprob == -0.125 for item in choice.logprobs.content)
    assert response.usage.completion_tokens == len(choice.model_extra["token_ids"])

    # The tool result goes back; the template renders it and the model answers in plain text.
    follow = client.chat.completions.create(
        model="tiny-scripted",
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ],
        tools=[WEATHER],
        n=2,
    )
    assert [c.message.content for c in follow.choices] == ["Plain answer 0.", "Plain answer 1."]
    assert all(c.finish_reason == "stop" and not c.message.tool_calls for c in follow.choices)


def test_token_in_token_out_completions(server):
    from openai import OpenAI

    client = OpenAI(base_url=server + "/v1", api_key="unused")
    chat = client.chat.completions.create(
        model="tiny-scripted",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"return_token_ids": True},
    )
    prompt_ids = chat.model_extra["prompt_token_ids"]
    completion = client.completions.create(
        model="tiny-scripted",
        prompt=prompt_ids,
        max_tokens=3,
        logprobs=0,
        extra_body={"return_token_ids": True},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.model_extra["prompt_token_ids"] == prompt_ids
    assert choice.model_extra["token_ids"] == chat.choices[0].model_extra["token_ids"][:3]
    assert choice.logprobs.token_logprobs == [-0.125] * 3
    assert "".join(choice.logprobs.tokens) == choice.text
    assert choice.logprobs.top_logprobs is None

    # The scripted engine knows only the sampled token's log-prob: top log-probs are refused, not faked.
    top = httpx.post(server + "/v1/completions", json={"prompt": prompt_ids, "max_tokens": 3, "logprobs": 1})
    assert top.status_code == 400 and "only the sampled token's log-prob" in top.json()["error"]["message"]


def test_errors_use_the_openai_shape(server):
    bad = httpx.post(server + "/v1/completions", json={"prompt": [10**9], "max_tokens": 2})
    assert bad.status_code == 400 and "out of range" in bad.json()["error"]["message"]
    stream = httpx.post(
        server + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True}
    )
    assert stream.status_code == 400 and "stream" in stream.json()["error"]["message"]
    missing = httpx.post(server + "/v1/chat/completions", json={"messages": []})
    assert missing.status_code == 400 and "messages" in missing.json()["error"]["message"]
    limit = httpx.post(server + "/v1/completions", json={"prompt": [10], "max_tokens": 65})
    assert limit.status_code == 400 and "at most 64" in limit.json()["error"]["message"]
    assert limit.json()["error"]["param"] == "max_tokens"
    unknown = httpx.post(server + "/v1/completions", json={"prompt": [10], "model": "other"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert httpx.get(server + "/health").json() == {"status": "ok"}
