"""rlcore.engine_kit.remote.ServerPool against small real HTTP servers: balancing, whole-request
retries, named failures, 4xx not retried, engine errors that mean retry, rejoining."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlcore.engine_kit.remote import RejectedError, ServerError, ServerPool
from rlcore.errors import RlcoreError


class Fake:
    """A server answering ``/health`` and ``POST /echo`` (with its own name); ``fail`` makes
    the next requests to /echo answer that status."""

    def __init__(self, name: str):
        self.name = name
        self.fail: list[int] = []
        self.healthy = True
        self.echoes = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(200 if fake.healthy else 503, {"ok": fake.healthy})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                item = json.loads(self.rfile.read(length) or b"null")
                if fake.fail:
                    self._answer(fake.fail.pop(0), {"error": f"{fake.name} says no"})
                    return
                fake.echoes += 1
                self._answer(200, {"server": fake.name, "item": item})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fakes():
    servers = [Fake("a"), Fake("b")]
    yield servers
    for s in servers:
        s.close()


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _echo(pool: ServerPool):
    return lambda url, item: pool.request(url, "POST", "/echo", json=item).json()


def test_no_servers_is_an_error():
    with pytest.raises(RlcoreError, match="Test: no servers given"):
        ServerPool([], engine="Test")


def test_map_keeps_item_order_and_spreads_the_load(fakes):
    pool = ServerPool([f.url for f in fakes], engine="Test", max_concurrency=4)
    out = pool.map(_echo(pool), list(range(20)), "echo")
    assert [o["item"] for o in out] == list(range(20))
    assert fakes[0].echoes > 0 and fakes[1].echoes > 0 and fakes[0].echoes + fakes[1].echoes == 20
    assert pool.map(_echo(pool), [], "echo") == []


def test_check_health_names_every_unreachable_server(fakes):
    dead = _dead_url()
    pool = ServerPool([fakes[0].url, dead], engine="Test")
    with pytest.raises(ServerError, match="unreachable Test servers") as info:
        pool.check_health()
    assert (
        dead in str(info.value)
        and "cannot connect" in str(info.value)
        and fakes[0].url not in str(info.value)
    )


def test_a_5xx_marks_the_server_down_and_the_request_goes_whole_to_another(fakes):
    fakes[0].fail = [500]
    pool = ServerPool([f.url for f in fakes], engine="Test", max_concurrency=1, rejoin=False)
    out = pool.map(_echo(pool), [1, 2, 3], "echo")
    assert [o["item"] for o in out] == [1, 2, 3] and {o["server"] for o in out} == {"b"}
    assert "HTTP 500" in pool.down[fakes[0].url] and "a says no" in pool.down[fakes[0].url]
    pool.map(_echo(pool), [4], "echo")
    assert fakes[0].url in pool.down  # rejoin=False: stays down


def test_a_server_marked_down_rejoins_when_healthy(fakes):
    fakes[0].fail = [502]
    pool = ServerPool([f.url for f in fakes], engine="Test", max_concurrency=1)
    pool.map(_echo(pool), [1], "echo")
    assert fakes[0].url in pool.down
    fakes[0].healthy = False
    pool.map(_echo(pool), [2], "echo")
    assert fakes[0].url in pool.down
    fakes[0].healthy = True
    pool.map(_echo(pool), [3], "echo")
    assert pool.down == {}


def test_a_4xx_is_raised_at_once_without_retrying(fakes):
    fakes[0].fail = [400]
    fakes[1].fail = [400]
    pool = ServerPool([f.url for f in fakes], engine="Test")
    with pytest.raises(RejectedError, match=r"Test server .* POST /echo: HTTP 400"):
        pool.call(lambda url: pool.request(url, "POST", "/echo", json=1), "echo")
    assert pool.down == {} and sum(len(f.fail) for f in fakes) == 1  # only one server was asked


def test_every_server_failing_names_each_and_what_failed(fakes):
    dead = _dead_url()
    fakes[0].fail = [503]
    pool = ServerPool([dead, fakes[0].url], engine="Test", max_retries=1)
    with pytest.raises(ServerError, match=r"echo \(prompt 0\) failed on every Test server tried") as info:
        pool.map(_echo(pool), [7], "echo")
    assert dead in str(info.value) and fakes[0].url in str(info.value) and "HTTP 503" in str(info.value)
    with pytest.raises(ServerError, match=r"none live\):\n  no live server\n  already down: "):
        pool.call(lambda url: None, "again")


def test_engine_errors_in_retry_on_mean_try_another_server(fakes):
    class Aborted(RlcoreError):
        pass

    calls = []

    def fn(url):
        calls.append(url)
        if len(calls) == 1:
            raise Aborted("aborted")
        return url

    pool = ServerPool([f.url for f in fakes], engine="Test", retry_on=(Aborted,))
    assert pool.call(fn, "x") == calls[1] != calls[0]
    assert pool.down == {calls[0]: "aborted"}
    plain = ServerPool([f.url for f in fakes], engine="Test")
    with pytest.raises(ValueError):
        plain.call(lambda url: (_ for _ in ()).throw(ValueError("bug")), "x")  # other errors are not retried
    assert plain.down == {}


def test_broadcast_reaches_every_live_server_and_names_a_failing_one(fakes):
    pool = ServerPool([f.url for f in fakes], engine="Test")
    assert [r.json()["server"] for r in pool.broadcast("POST", "/echo", "update", json=1)] == ["a", "b"]
    fakes[1].fail = [500]
    with pytest.raises(ServerError, match=f"update failed: Test server {fakes[1].url}"):
        pool.broadcast("POST", "/echo", "update", json=1)
    pool.down = {fakes[0].url: "x"}
    assert [r.json()["server"] for r in pool.broadcast("POST", "/echo", "update", json=1)] == ["b"]
    pool.down = {f.url: "gone" for f in fakes}
    with pytest.raises(ServerError, match="update failed: every Test server is down"):
        pool.broadcast("POST", "/echo", "update")


def test_api_key_is_sent_as_a_bearer_token():
    seen = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            seen["auth"] = self.headers.get("Authorization")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        ServerPool(
            [f"http://127.0.0.1:{httpd.server_address[1]}"], engine="Test", api_key="s3cret"
        ).check_health()
        assert seen["auth"] == "Bearer s3cret"
    finally:
        httpd.shutdown()
        httpd.server_close()
