"""`rlcore serve` over the real ``hf`` engine and a tiny random Llama (context: 2048 tokens), run
by uvicorn in a thread and driven over HTTP with one keep-alive connection: client errors are 400s
(404 for an unknown model) in OpenAI's error shape, a server bug is a 500 in the same shape, the
connection survives both, ``top_logprobs`` are real, and concurrent requests share engine calls.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest

from rlcore.testing import require_plugins

require_plugins("rlcore_rollout_hf")  # the real engine these tests serve
torch = pytest.importorskip("torch")
uvicorn = pytest.importorskip("uvicorn")

from rlcore_serve.app import create_app  # noqa: E402

from rlcore.interfaces import BuildContext, SamplingParams  # noqa: E402
from rlcore.testing.runs import discover_registry  # noqa: E402

pytestmark = pytest.mark.slow  # loads a tiny model and starts a server thread: ~15 s

CONTEXT = 2048  # the tiny model's max_position_embeddings
LIMIT = 100  # the server's --max-tokens-limit in these tests
BUG_TOKEN = 1234  # a prompt starting with it makes the engine raise, standing in for a server bug


class Instrumented:
    """The hf engine, recording each generate call's prompts and per-prompt budgets; a call can be
    held at ``gate`` until the test opens it, and a prompt starting with ``BUG_TOKEN`` raises."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.calls: list[dict[str, Any]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def generate(self, prompts, params: SamplingParams, max_new_tokens=None):
        self.calls.append(
            {
                "prompts": len(prompts),
                "budgets": list(max_new_tokens or [params.max_new_tokens] * len(prompts)),
            }
        )
        self.entered.set()
        self.gate.wait(60)
        if any(p and p[0] == BUG_TOKEN for p in prompts):
            raise RuntimeError("simulated engine bug")
        return self.engine.generate(prompts, params, max_new_tokens=max_new_tokens)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    hf = discover_registry().get(
        "rollout_engine", "hf"
    )  # the engine, through the registry as a run builds it
    engine = Instrumented(hf.build(None, BuildContext(actor=model, tokenizer=tokenizer, device="cpu")))
    assert engine.max_positions == CONTEXT
    app = create_app(engine, tokenizer, model_name="tiny", max_tokens=8, max_tokens_limit=LIMIT)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    yield {
        "url": f"http://127.0.0.1:{port}",
        "engine": engine,
        "app": app,
        "tokenizer": tokenizer,
        "model": model,
    }
    server.should_exit = True
    thread.join(10)
    torch.set_num_threads(threads)


@pytest.fixture
def client(served):
    with httpx.Client(base_url=served["url"], timeout=120) as c:
        yield c


def _wait_until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _local_port(response: httpx.Response) -> int:
    return response.extensions["network_stream"].get_extra_info("client_addr")[1]


GOOD = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0}


def _assert_error(response: httpx.Response, status: int, *words: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    for word in words:
        assert word in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param
    return error


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]

# (path, raw JSON body, status, words the message must hold, param)
BAD_REQUESTS = [
    (COMPLETIONS, {"prompt": [5, 6], "seed": 2**70}, 400, ["less than or equal to"], "seed"),
    (CHAT, {"messages": MESSAGES, "seed": -(2**64)}, 400, ["greater than or equal to"], "seed"),
    (
        COMPLETIONS,
        {"prompt": [5] * 3000, "max_tokens": 1},
        400,
        ["3000 tokens", "max_tokens is 1", f"{CONTEXT}"],
        "prompt",
    ),
    (COMPLETIONS, {"prompt": [5] * CONTEXT}, 400, [f"{CONTEXT} tokens", "no room"], "prompt"),
    (
        COMPLETIONS,
        {"prompt": [5] * 2000, "max_tokens": 60},
        400,
        ["2000 tokens", "60", "2060", f"{CONTEXT}", "at most 48"],
        "max_tokens",
    ),
    (
        COMPLETIONS,
        {"prompt": [5, 6], "max_tokens": LIMIT + 1},
        400,
        [f"{LIMIT + 1}", f"at most {LIMIT}", "--max-tokens-limit"],
        "max_tokens",
    ),
    (
        CHAT,
        {"messages": MESSAGES, "max_completion_tokens": 10**6},
        400,
        [f"at most {LIMIT}"],
        "max_completion_tokens",
    ),
    (COMPLETIONS, {"prompt": ""}, 400, ["no tokens"], "prompt"),
    (COMPLETIONS, {"prompt": ["a", ""]}, 400, ["prompt 1 has no tokens"], "prompt"),
    (COMPLETIONS, {"prompt": []}, 400, ["empty"], "prompt"),
    (COMPLETIONS, {"prompt": [[5], []]}, 400, ["no tokens"], "prompt"),
    (COMPLETIONS, {"prompt": [-1]}, 400, ["out of range"], "prompt"),
    (
        COMPLETIONS,
        {"prompt": [5], "stop_token_ids": [10**9]},
        400,
        ["stop_token_ids out of range"],
        "stop_token_ids",
    ),
    (COMPLETIONS, {"prompt": [5], "temperature": -0.5}, 400, ["greater than or equal to 0"], "temperature"),
    (COMPLETIONS, {"prompt": [5], "temperature": 2.5}, 400, ["less than or equal to 2"], "temperature"),
    (CHAT, {"messages": MESSAGES, "top_p": 0}, 400, ["greater than 0"], "top_p"),
    (CHAT, {"messages": MESSAGES, "n": 0}, 400, [], "n"),
    (CHAT, {"messages": MESSAGES, "top_logprobs": 21, "logprobs": True}, 400, ["20"], "top_logprobs"),
    (CHAT, {"messages": MESSAGES, "top_logprobs": 3}, 400, ["logprobs=true"], "top_logprobs"),
    (COMPLETIONS, {"prompt": [5], "echo": True}, 400, ["echo"], "echo"),
    (CHAT, {"messages": MESSAGES, "stop": [""]}, 400, ["empty"], "stop"),
    (CHAT, {"messages": [{"role": "user", "content": "x"}], "stream": True}, 400, ["stream"], "stream"),
]


@pytest.mark.parametrize(
    "path, body, status, words, param",
    BAD_REQUESTS,
    ids=[f"{p}:{json.dumps(b)[:40]}" for p, b, *_ in BAD_REQUESTS],
)
def test_client_errors_are_400s_and_the_connection_stays_open(
    served, client, path, body, status, words, param
):
    calls = len(served["engine"].calls)
    bad = client.post(path, json=body)
    _assert_error(bad, status, *words, param=param)
    assert len(served["engine"].calls) == calls  # refused before the engine
    good = client.post(COMPLETIONS, json=GOOD)
    assert good.status_code == 200, good.text
    assert _local_port(good) == _local_port(bad)  # the same keep-alive connection


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_non_finite_floats_are_refused(client, field, value):
    """Python's JSON parser (FastAPI's) reads NaN and Infinity; they must not reach the engine."""
    body = f'{{"prompt": [5, 6], "max_tokens": 2, "{field}": {value}}}'
    bad = client.post(COMPLETIONS, content=body, headers={"content-type": "application/json"})
    _assert_error(bad, 400, "finite", param=field)


def test_malformed_bodies_are_400s(client):
    _assert_error(
        client.post(COMPLETIONS, content=b"{not json", headers={"content-type": "application/json"}), 400
    )
    _assert_error(client.post(COMPLETIONS, json=[1, 2]), 400)
    _assert_error(client.post(CHAT, json={"messages": [1]}), 400, param="messages.0")
    _assert_error(client.get("/v1/nothing"), 404, "Not Found")


@pytest.mark.parametrize(
    "path, body, param",
    [
        (CHAT, '{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages.0.content"),
        (CHAT, '{"messages": [{"role": "\\udfff", "content": "hi"}]}', "messages.0.role"),
        (
            CHAT,
            '{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", '
            '"function": {"name": "f\\ud83d", "parameters": {}}}]}',
            "tools.0.function.name",
        ),
        (COMPLETIONS, '{"prompt": ["ok", "\\ud800"], "max_tokens": 2}', "prompt.1"),
        (COMPLETIONS, '{"prompt": "\\udc00", "max_tokens": 2}', "prompt"),
    ],
)
def test_lone_surrogates_are_400s_naming_the_field(client, path, body, param):
    """JSON may spell half of a UTF-16 pair; no tokenizer can take it (it was a 500)."""
    bad = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
    _assert_error(bad, 400, "lone UTF-16 surrogate", param=param)
    paired = body.replace("\\ud800", "\\ud83d\\ude00")  # a whole pair is fine
    if paired != body:
        assert (
            client.post(
                path, content=paired.encode(), headers={"content-type": "application/json"}
            ).status_code
            == 200
        )


def test_a_json_decode_error_names_the_position_not_a_parameter(client):
    bad = client.post(
        COMPLETIONS,
        content=b'{"prompt": [5, 6], "max_tokens": 2,, }',
        headers={"content-type": "application/json"},
    )
    error = _assert_error(bad, 400, "not valid JSON", "at character 35")
    assert error["param"] is None, error


def test_unknown_model_is_a_404(client):
    for path, body in [(CHAT, {"messages": MESSAGES}), (COMPLETIONS, {"prompt": [5]})]:
        error = _assert_error(
            client.post(path, json={**body, "model": "gpt-4o"}), 404, "gpt-4o", "tiny", param="model"
        )
        assert error["code"] == "model_not_found"
    assert client.post(COMPLETIONS, json={**GOOD, "model": "tiny"}).status_code == 200


def test_a_server_bug_is_a_500_with_a_body_and_the_connection_survives(client):
    bad = client.post(COMPLETIONS, json={"prompt": [BUG_TOKEN, 5], "max_tokens": 2})
    error = _assert_error(bad, 500, "RuntimeError", "simulated engine bug")
    assert error["param"] is None
    good = client.post(COMPLETIONS, json=GOOD)
    assert good.status_code == 200 and _local_port(good) == _local_port(bad)
    chat = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 2})
    assert chat.status_code == 200 and _local_port(chat) == _local_port(bad)


def test_max_tokens_default_is_cut_to_the_room_the_context_leaves(client):
    """Without max_tokens, a prompt near the context end gets what is left, not an error."""
    answer = client.post(
        COMPLETIONS, json={"prompt": [5] * (CONTEXT - 3), "temperature": 0, "return_token_ids": True}
    )
    assert answer.status_code == 200, answer.text
    assert 1 <= len(answer.json()["choices"][0]["token_ids"]) <= 3
    exact = client.post(COMPLETIONS, json={"prompt": [5] * (CONTEXT - 3), "max_tokens": 3, "temperature": 0})
    assert exact.status_code == 200, exact.text


def test_seed_bounds_are_the_generators(client):
    for seed in [2**63 - 1, -(2**63), 0]:
        answer = client.post(COMPLETIONS, json={"prompt": [5, 6], "max_tokens": 2, "seed": seed})
        assert answer.status_code == 200, answer.text


def test_tiny_temperatures_sample_greedily(client):
    greedy = client.post(
        COMPLETIONS, json={"prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0, "return_token_ids": True}
    )
    tiny = client.post(
        COMPLETIONS,
        json={
            "prompt": [5, 6, 7],
            "max_tokens": 4,
            "temperature": 1e-300,
            "return_token_ids": True,
            "logprobs": 0,
        },
    )
    assert tiny.status_code == 200, tiny.text
    assert tiny.json()["choices"][0]["token_ids"] == greedy.json()["choices"][0]["token_ids"]


def test_chat_top_logprobs_are_as_many_as_asked(served, client):
    answer = client.post(
        CHAT,
        json={"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 20},
    )
    assert answer.status_code == 200, answer.text
    content = answer.json()["choices"][0]["logprobs"]["content"]
    assert len(content) >= 1
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == 20
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True) and len({t["token"] for t in top}) > 1
        # greedy: the sampled token is the most likely one, with the same log-prob
        assert top[0]["token"] == entry["token"] and top[0]["logprob"] == pytest.approx(
            entry["logprob"], abs=1e-4
        )
        assert all(set(t) == {"token", "logprob", "bytes"} for t in top)
    none = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 2, "logprobs": True})
    assert all(e["top_logprobs"] == [] for e in none.json()["choices"][0]["logprobs"]["content"])


def test_completion_top_logprobs_match_a_forward_pass(served, client):
    prompt = [5, 6, 7, 8]
    answer = client.post(
        COMPLETIONS,
        json={
            "prompt": prompt,
            "max_tokens": 3,
            "temperature": 0.8,
            "seed": 4,
            "logprobs": 5,
            "return_token_ids": True,
        },
    )
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    ids, logprobs = choice["token_ids"], choice["logprobs"]
    with torch.no_grad():
        logits = (
            served["model"](input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
        )
    want = torch.topk(torch.log_softmax(logits / 0.8, -1), 5, dim=-1)
    decode = served["tokenizer"].decode
    for position, top in enumerate(logprobs["top_logprobs"]):
        for token_id, value in zip(want.indices[position].tolist(), want.values[position].tolist()):
            text = decode([token_id], skip_special_tokens=False)
            assert (
                top[text] == pytest.approx(value, abs=1e-4) or top[text] > value
            )  # a same-text token may win
        assert logprobs["tokens"][position] in top and 5 <= len(top) <= 6


def test_concurrent_requests_share_one_engine_call(served, client):
    """A long and a short request that wait while the engine is busy go into ONE engine call, each
    with its own budget: the short one does not wait for a separate long generation."""
    engine, batcher = served["engine"], served["app"].state.batcher
    engine.gate.clear()
    engine.entered.clear()
    answers: dict[str, httpx.Response] = {}

    def post(name: str, body: dict) -> None:
        with httpx.Client(base_url=served["url"], timeout=120) as own:
            answers[name] = own.post(COMPLETIONS, json=body)

    first = threading.Thread(target=post, args=("first", {"prompt": [5, 6], "max_tokens": 2}))
    first.start()
    try:
        assert engine.entered.wait(30)  # the engine is busy with "first"
        calls = len(engine.calls)
        common = {"temperature": 0.9, "return_token_ids": True, "stop_token_ids": []}
        waiting = [
            threading.Thread(target=post, args=("long", {"prompt": [9, 10, 11], "max_tokens": 40, **common})),
            threading.Thread(target=post, args=("short", {"prompt": [12, 13], "max_tokens": 2, **common})),
        ]
        for count, t in enumerate(waiting, 1):  # one after the other: the queue's order is known
            t.start()
            _wait_until(lambda count=count: batcher.waiting() == count)
    finally:
        engine.gate.set()
    for t in [first, *waiting]:
        t.join(120)
    assert {name: r.status_code for name, r in answers.items()} == {"first": 200, "long": 200, "short": 200}
    assert engine.calls[calls:] == [{"prompts": 2, "budgets": [40, 2]}]
    assert len(answers["short"].json()["choices"][0]["token_ids"]) <= 2
    assert answers["long"].json()["choices"][0]["finish_reason"] in ("stop", "length")


def test_a_failing_shared_call_fails_only_the_bad_request(served):
    """One request's engine error does not take the requests batched with it down."""
    engine, batcher = served["engine"], served["app"].state.batcher
    engine.gate.clear()
    engine.entered.clear()
    answers: dict[str, httpx.Response] = {}

    def post(name: str, body: dict) -> None:
        with httpx.Client(base_url=served["url"], timeout=120) as own:
            answers[name] = own.post(COMPLETIONS, json=body)

    threads = [threading.Thread(target=post, args=("first", GOOD))]
    threads[0].start()
    try:
        assert engine.entered.wait(30)
        threads += [
            threading.Thread(target=post, args=("bug", {**GOOD, "prompt": [BUG_TOKEN, 5]})),
            threading.Thread(target=post, args=("fine", GOOD)),
        ]
        for count, t in enumerate(threads[1:], 1):
            t.start()
            _wait_until(lambda count=count: batcher.waiting() == count)
    finally:
        engine.gate.set()
    for t in threads:
        t.join(120)
    assert answers["first"].status_code == 200 and answers["fine"].status_code == 200
    _assert_error(answers["bug"], 500, "simulated engine bug")
