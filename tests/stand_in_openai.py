"""A stand-in OpenAI-compatible server for tests: a small HTTP server on 127.0.0.1, for the tests that need an
OpenAI-compatible API but not a model behind it (api.openai.com, a judge, a classifier or a verifier server), or
that need what a real server will not do on demand: chosen replies, HTTP errors, slowness, malformed bodies, a
model list with or without ``max_model_len``, a key the server rejects. (``tests/openai_server.py`` is the other
thing: the real vLLM server, for the slow tests.)

In a test, in a thread of the test's process, on a port the OS picks::

    from stand_in_openai import StandInOpenAI, error

    with StandInOpenAI("Score: 7", models={"judge": 2048}) as server:
        ...  # point the code under test at server.base_url (http://127.0.0.1:PORT/v1)
    assert server.requests[0]["body"]["model"] == "judge"

or as a process that ``plugrl_model_servers`` starts where it would start vLLM (``launch: true``)::

    monkeypatch.setattr(servers, "vllm_command", stand_in_openai.vllm_command("--reply", "Score: 7"))

It answers as vLLM's OpenAI-compatible server does:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: what ``answer`` says (below), as a chat completion
  (``choices[i].message.content``) or a text completion (``choices[i].text``), with ``n`` choices (the
  request's ``n``, 1 when it sets none);
- ``GET /v1/models``: the ``models``, each with its ``max_model_len`` when it has one; or, with
  ``models_status`` other than 200, that HTTP status and an OpenAI-style error (401: a server started with
  ``--api-key`` answering a wrong key);
- ``GET /health``: 200, empty; anything else: 404 with an OpenAI-style error.

``answer`` is a text, every reply's content; or a function of the request (its record, below), called in the
thread answering it (sleeping there makes a slow server), that returns:

- a text: the content of every choice;
- a list of texts: choice ``i`` gets text ``i`` (cycling);
- a :class:`Reply`: that HTTP status and body as they are, e.g. ``error(503, "warming up")``, or bytes that are
  not JSON (a malformed body).

Each request is recorded, in arrival order, as ``{"method", "path", "auth", "body", "count"}``: the
``Authorization`` header, the JSON body (None for a GET, or a body that is not JSON), and ``count``: for a POST,
the how-many-th naming its model it is (1 for the first: a first attempt that fails), for a GET the how-many-th
GET. POSTs go to ``requests``, GETs to ``gets``; :meth:`StandInOpenAI.bodies` and
:meth:`StandInOpenAI.max_in_flight` read the POSTs per model.
Stopping the server also closes the connections clients keep open, so a stopped server answers nothing.

Only the standard library is imported: as a process it starts in a fraction of a second (``--help`` for its
arguments).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOST = "127.0.0.1"
SCRIPT = __file__  # run as a process: python SCRIPT --port N ...


@dataclass(frozen=True)
class Reply:
    """An answer sent as it is: ``status`` and ``body`` (a JSON value; bytes are sent unchanged, so a body that is
    not JSON can be sent)."""

    status: int
    body: Any


def error(status: int, message: str = "stand-in error") -> Reply:
    """An OpenAI-style error answer: ``{"error": {"message", "type", "code"}}`` with that HTTP status."""
    return Reply(status, {"error": {"message": message, "type": "stand_in", "code": status}})


def echo(request: dict[str, Any]) -> str:
    """An ``answer``: the request's last message (a chat request) or its prompt (a completion request), so a test
    sees what was sent."""
    body = request["body"]
    if "messages" in body:
        return body["messages"][-1]["content"]
    prompt = body.get("prompt")
    return prompt[0] if isinstance(prompt, list) else str(prompt)


class StandInOpenAI:
    """The stand-in server (see the module's docstring). ``answer``: a text or a function of the request;
    ``models``: the model ids ``GET /v1/models`` lists (a mapping: id -> its ``max_model_len``, or None for
    none); ``models_status``: that answer's HTTP status (an error instead of the list when not 200); ``port``: 0,
    the OS's choice. Serves from :meth:`start` (or ``with``) until :meth:`stop`."""

    def __init__(
        self,
        answer: str | Callable[[dict[str, Any]], Any] = "OK",
        *,
        models: Mapping[str, int | None] | Sequence[str] = ("stand-in",),
        models_status: int = 200,
        port: int = 0,
    ):
        self.answer = answer
        self.models = dict(models) if isinstance(models, Mapping) else dict.fromkeys(models)
        self.models_status = models_status
        self.requests: list[dict[str, Any]] = []
        self.gets: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._most_in_flight: dict[str, int] = {}
        self._connections: set[socket.socket] = set()
        self.httpd = ThreadingHTTPServer((HOST, port), _handler(self))
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://{HOST}:{self.port}/v1"
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> StandInOpenAI:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="stand-in-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the listening socket and every connection still open (keep-alive)."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()
        with self._lock:
            open_now, self._connections = list(self._connections), set()
        for conn in open_now:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> StandInOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ what it was sent

    def bodies(self, model: str | None = None) -> list[Any]:
        """The JSON bodies of the POSTs so far, in arrival order; those naming ``model`` only, when given."""
        with self._lock:
            return [r["body"] for r in self.requests if model is None or _model_of(r["body"]) == model]

    def max_in_flight(self, model: str) -> int:
        """The most POSTs naming ``model`` that were being answered at once."""
        with self._lock:
            return self._most_in_flight.get(model, 0)

    # ------------------------------------------------------------------ answers

    def _record(self, method: str, path: str, auth: str | None, body: Any) -> dict[str, Any]:
        model = _model_of(body)
        with self._lock:
            if method == "GET":
                record = {"method": method, "path": path, "auth": auth, "body": None, "count": len(self.gets) + 1}
                self.gets.append(record)
                return record
            count = 1 + sum(1 for r in self.requests if _model_of(r["body"]) == model)
            record = {"method": method, "path": path, "auth": auth, "body": body, "count": count}
            self.requests.append(record)
            self._in_flight[model] = self._in_flight.get(model, 0) + 1
            self._most_in_flight[model] = max(self._most_in_flight.get(model, 0), self._in_flight[model])
        return record

    def _done(self, body: Any) -> None:
        with self._lock:
            self._in_flight[_model_of(body)] -= 1

    def models_reply(self) -> Reply:
        if self.models_status != 200:
            return error(self.models_status, "Unauthorized" if self.models_status == 401 else "stand-in error")
        data = [
            {"id": m, "object": "model", "owned_by": "stand-in", **({"max_model_len": n} if n else {})}
            for m, n in self.models.items()
        ]
        return Reply(200, {"object": "list", "data": data})

    def completion_reply(self, record: dict[str, Any]) -> Reply:
        answer = self.answer(record) if callable(self.answer) else self.answer
        if isinstance(answer, Reply):
            return answer
        texts = [answer] if isinstance(answer, str) else list(answer)
        body = record["body"]
        n = body.get("n") or 1
        chat = record["path"].endswith("/chat/completions")
        if chat:
            choices = [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": texts[i % len(texts)]},
                    "finish_reason": "stop",
                }
                for i in range(n)
            ]
        else:
            choices = [
                {"index": i, "text": texts[i % len(texts)], "logprobs": None, "finish_reason": "stop"} for i in range(n)
            ]
        return Reply(
            200,
            {
                "id": f"stand-in-{record['count']}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": body.get("model"),
                "choices": choices,
                "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": 1 + n},
            },
        )


def _model_of(body: Any) -> str:
    return str(body.get("model")) if isinstance(body, dict) else ""


def _handler(server: StandInOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as vLLM: the openai client reuses its connections

        def log_message(self, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            with server._lock:
                server._connections.add(self.connection)

        def finish(self) -> None:
            with server._lock:
                server._connections.discard(self.connection)
            super().finish()

        def send(self, reply: Reply) -> None:
            if reply.body is None:
                data = b""
            elif isinstance(reply.body, bytes):
                data = reply.body
            else:
                data = json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            server._record("GET", self.path, self.headers.get("Authorization"), None)
            if self.path.rstrip("/").endswith("/models"):
                self.send(server.models_reply())
            elif self.path == "/health":
                self.send(Reply(200, None))
            else:
                self.send(error(404, f"no route {self.path}"))

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            record = server._record("POST", self.path, self.headers.get("Authorization"), body)
            try:
                if not self.path.endswith("/completions"):
                    self.send(error(404, f"no route {self.path}"))
                elif not isinstance(body, dict):
                    self.send(error(400, "the request body is not a JSON object"))
                else:
                    self.send(server.completion_reply(record))
            finally:
                server._done(body)

    return Handler


# --------------------------------------------------------------------------- as a process


def vllm_command(*extra: str) -> Callable[..., list[str]]:
    """A stand-in for ``plugrl_model_servers.vllm_command`` (monkeypatch it in): the package then starts this
    module as a process where it would start vLLM, with the served name, the port and the launch_args it was
    given, then ``extra`` (e.g. ``"--reply", "Score: 7"``)."""

    def command(model_path: str, served_name: str, port: int, args: Sequence[str] = ()) -> list[str]:
        return [sys.executable, SCRIPT, "--served-model-name", served_name, "--port", str(port), *extra, *args]

    return command


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="The stand-in OpenAI-compatible server, as a process on 127.0.0.1. Arguments it does not know "
        "(vLLM's, from launch_args) are ignored."
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", default="stand-in", help="the model GET /v1/models lists")
    parser.add_argument("--max-model-len", type=int, default=2048, help="its max_model_len there")
    parser.add_argument("--reply", default="OK", help="every reply's content")
    parser.add_argument("--echo", action="store_true", help="reply with the request's last message instead")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds to wait before serving (slow to start)")
    parser.add_argument("--exit", type=int, default=None, help="exit at once with this code (a server that fails)")
    args, _ = parser.parse_known_args(argv)
    if args.exit is not None:
        print("stand-in: exiting at once", flush=True)
        sys.exit(args.exit)
    time.sleep(args.delay)
    server = StandInOpenAI(
        echo if args.echo else args.reply, models={args.served_model_name: args.max_model_len}, port=args.port
    )
    print(f"stand-in serving {args.served_model_name} on {args.port}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
