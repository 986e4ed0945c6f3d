"""Endpoint checks before any progress: an unreachable server, a rejected key and a model the
server does not list are one line before work starts; a server without a model list is taken."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memloop.core.errors import UserError
from memloop.environment.datafile import save_items
from memloop.environment.procedural import generate_procedural
from memloop.experiments.cli import main
from memloop.llm.client import ChatClient
from memloop.llm.endpoint import Endpoint
from memloop.llm.errors import EndpointUnreachable
from memloop.testing.paths import SHIPPED
from memloop.testing.servers import free_port


class Models:
    """A server whose GET /v1/models answers `status` with `models` listed; POST is refused."""

    def __init__(self, status: int = 200, models: tuple[str, ...] = ("gpt-x", "gpt-y")):
        outer = self
        self.gets: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.gets.append(self.headers.get("Authorization", ""))
                body = json.dumps({"data": [{"id": m} for m in models]}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.send_response(500)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def client(base_url: str, model: str = "gpt-x", **more) -> ChatClient:
    return ChatClient(Endpoint(model=model, base_url=base_url, **more))


def test_a_listed_model_passes_and_the_key_is_sent(monkeypatch):
    monkeypatch.setenv("PREFLIGHT_KEY", "sk-test-123")
    server = Models()
    try:
        client(server.base_url, api_key_env="PREFLIGHT_KEY").preflight()
        assert server.gets == ["Bearer sk-test-123"]
    finally:
        server.close()


@pytest.mark.parametrize(
    ("status", "model", "error", "needle"),
    [
        (200, "gpt-z", UserError, "serves no model 'gpt-z' (it lists: gpt-x, gpt-y)"),
        (401, "gpt-x", UserError, "rejected the API key (HTTP 401); check the variable"),
        (403, "gpt-x", UserError, "rejected the API key (HTTP 403)"),
    ],
)
def test_a_missing_model_or_a_rejected_key_is_one_line(status, model, error, needle):
    server = Models(status)
    try:
        with pytest.raises(error) as info:
            client(server.base_url, model).preflight()
        assert needle in str(info.value) and "\n" not in str(info.value)
    finally:
        server.close()


def test_a_server_without_a_model_list_is_taken_as_it_is():
    server = Models(404)
    try:
        client(server.base_url, "anything").preflight()  # no error
        assert len(server.gets) == 1
    finally:
        server.close()


def test_an_unreachable_server_is_one_line():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EndpointUnreachable, match=r"cannot reach http://127\.0\.0\.1:\d+/v1"):
        client(url).preflight()


def test_eval_stops_before_any_progress_or_file_on_an_unlisted_model(tmp_path, capsys):
    server = Models()
    try:
        env = tmp_path / "env.json"
        save_items(generate_procedural(users=1, periods=1, questions=1, seed=3), env)
        endpoint = tmp_path / "e.yaml"
        endpoint.write_text(f"model: gpt-4.1-mni\nbase_url: {server.base_url}\n")
        argv = [
            "eval",
            "--env",
            str(env),
            "--endpoint",
            str(endpoint),
            "--out",
            str(tmp_path / "o"),
        ]
        argv += [
            "--policy",
            str(SHIPPED / "policies" / "native.yaml"),
            "--cache",
            str(tmp_path / "c"),
        ]
        assert main(argv) == 2
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and "serves no model 'gpt-4.1-mni'" in err[0], err
        assert not (tmp_path / "o").exists()
    finally:
        server.close()
