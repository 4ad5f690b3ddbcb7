"""Fixtures: tiny random sequence classifiers (SmolLM2's tokenizer, from rlcore's ``tiny_model``)
and a scripted OpenAI-compatible judge server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


def make_classifier(
    target: Path, tokenizer_dir: Path, num_labels: int = 1, id2label: dict | None = None, seed: int = 0
) -> Path:
    """A random 2-layer LlamaForSequenceClassification (hidden 32) saved with the tiny model's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **({"id2label": id2label, "label2id": {v: k for k, v in id2label.items()}} if id2label else {}),
    )
    torch.manual_seed(seed)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():  # a visible spread of scores
        model.score.weight.normal_(0.0, 1.0)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def tiny_rm(tiny_model, tmp_path_factory):
    """One output (a reward model as TRL saves it)."""
    return make_classifier(tmp_path_factory.mktemp("tiny-rm"), tiny_model)


@pytest.fixture(scope="session")
def tiny_rm2(tiny_model, tmp_path_factory):
    """Two outputs, named bad and good."""
    return make_classifier(
        tmp_path_factory.mktemp("tiny-rm2"), tiny_model, num_labels=2, id2label={0: "bad", 1: "good"}
    )


class JudgeServer:
    """Answers POST /v1/chat/completions with ``script(body, n) -> (status, reply_text, delay_s)``,
    n counting requests from 1. Records every body, and the most requests it held at once."""

    def __init__(self, script):
        self.script, self.bodies, self.headers = script, [], []
        self.lock = threading.Lock()
        self.active = self.max_active = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.bodies.append(body)
                    server.headers.append(dict(self.headers))
                    n = len(server.bodies)
                    server.active += 1
                    server.max_active = max(server.max_active, server.active)
                try:
                    if self.path != "/v1/chat/completions":
                        status, text, delay = 404, "not found", 0.0
                    else:
                        status, text, delay = server.script(body, n)
                    time.sleep(delay)
                finally:
                    # Done before the answer goes out: a client that got it may send its next
                    # request before this thread would reach the end of the handler.
                    with server.lock:
                        server.active -= 1
                if status == 200:
                    payload = json.dumps(
                        {
                            "id": f"c{n}",
                            "object": "chat.completion",
                            "model": body["model"],
                            "choices": [
                                {
                                    "index": 0,
                                    "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": text},
                                }
                            ],
                        }
                    )
                else:
                    payload = json.dumps({"error": {"message": text}})
                data = payload.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def judge_server():
    """``judge_server(script)`` starts a :class:`JudgeServer`; all are stopped after the test."""
    servers = []

    def start(script):
        servers.append(JudgeServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def closed_port():
    """A port on 127.0.0.1 where nothing listens (connections are refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
