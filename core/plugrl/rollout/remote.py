"""The trainer's side of ``rollout.mode: server``: a RolloutEngine whose generations run on rollout servers
(:mod:`plugrl.rollout.server`), one or more, started by the trainer or given as ``rollout.server_urls``.

- :meth:`RemoteEngine.generate` splits the prompts over the servers (consecutive shares, as even as they go),
  asks them at once and returns the rollouts in prompt order, as a colocated engine would.
- :meth:`RemoteEngine.load_weights` (every rank calls it: gathering the full weights is a collective) pushes the
  new weights from rank 0 to every server in pieces of ``rollout.weight_chunk_mb``, then every rank waits for
  the push (a gloo barrier), so no rank generates with the old weights. The transport
  (``rollout.weight_transport``): ``shm``, a safetensors file in ``/dev/shm`` that servers on this host read in
  place; ``http``, the file's bytes in the request (servers on other hosts); ``auto``, ``shm`` when every server
  is on this host.
- Sleep and wake are no-ops: the servers keep their own memory.

Errors name the server's URL and what to do: a server that does not answer, or answers with an error (its
message), stops the step with :class:`RemoteEngineError`.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from plugrl.rollout.server import TOKEN_ENV, sampling_to_json
from plugrl.rollout.types import Rollout, SamplingSettings

log = logging.getLogger("plugrl.rollout.remote")

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class RemoteEngineError(RuntimeError):
    """A rollout server failed or could not be reached; the message names it."""


def shares(count: int, parts: int) -> list[slice]:
    """``parts`` consecutive slices of ``range(count)``, sizes differing by at most one (the first ones larger)."""
    base, extra = divmod(count, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (i < extra)
        out.append(slice(start, start + size))
        start += size
    return out


def chunks(weights: Iterable[tuple[str, torch.Tensor]], max_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """The named tensors in order, grouped into dicts of at most ``max_bytes`` (a larger tensor alone)."""
    piece: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if piece and size + nbytes > max_bytes:
            yield piece
            piece, size = {}, 0
        piece[name] = tensor.detach().contiguous().cpu()
        size += nbytes
    if piece:
        yield piece


def resolve_transport(transport: str, urls: list[str]) -> str:
    """``auto`` -> ``shm`` when every server is on this host (and /dev/shm exists), else ``http``."""
    if transport != "auto":
        return transport
    local = all(urllib.parse.urlsplit(u).hostname in LOCAL_HOSTS for u in urls)
    return "shm" if local and Path("/dev/shm").is_dir() else "http"


class RemoteEngine:
    """Rollout servers at ``urls`` (``http://host:port``) behind the RolloutEngine interface (module docstring).

    ``calculate_log_probs``: whether rollouts carry the sampler's log-probs; ``rank`` / ``world_size``: this
    trainer process's (rank 0 pushes the weights); ``launched``: the :class:`plugrl.servers.ManagedServer`
    this process started (stopped by :meth:`close`); ``timeout_s``: per request."""

    def __init__(
        self,
        urls: list[str],
        *,
        calculate_log_probs: bool = False,
        transport: str = "auto",
        chunk_mb: int = 256,
        timeout_s: float = 1800.0,
        rank: int = 0,
        world_size: int = 1,
        launched: list | None = None,
    ):
        if not urls:
            raise ValueError("RemoteEngine needs at least one server URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.calculate_log_probs = calculate_log_probs
        self.transport = resolve_transport(transport, self.urls)
        self.chunk_bytes = chunk_mb << 20
        self.timeout_s = timeout_s
        self.rank, self.world_size = rank, world_size
        self.launched = list(launched or [])
        self.token = os.environ.get(TOKEN_ENV) or None
        self.version = 0
        self._pool = ThreadPoolExecutor(max(len(self.urls), 1), thread_name_prefix="plugrl-remote-engine")

    # ----------------------------------------------------------------------------------- requests
    def _request(self, url: str, path: str, body: bytes, content_type: str) -> dict[str, Any]:
        headers = {"Content-Type": content_type}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url + path, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read())["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = e.reason
            raise RemoteEngineError(f"rollout server {url} answered {path} with {e.code}: {message}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise RemoteEngineError(
                f"rollout server {url} did not answer {path} ({reason}); is it running? (rollout.server_urls, "
                "or the log of a server plugrl started: rollout_server_<i>.log in the run directory)"
            ) from None

    def _post_json(self, url: str, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        return self._request(url, path, json.dumps(payload).encode(), "application/json")

    # ----------------------------------------------------------------------------------- the engine
    def generate(self, prompts: list[list[int]], sampling: SamplingSettings) -> list[list[Rollout]]:
        """``sampling.n`` rollouts per prompt, the prompts shared out over the servers."""
        if not prompts:
            return []
        parts = [(url, s) for url, s in zip(self.urls, shares(len(prompts), len(self.urls)), strict=True)]
        payload = {"sampling": sampling_to_json(sampling), "logprobs": self.calculate_log_probs}
        futures = [
            self._pool.submit(self._post_json, url, "/generate", {**payload, "prompts": prompts[s]})
            for url, s in parts
            if s.stop > s.start
        ]
        groups: list[list[Rollout]] = []
        for (url, s), future in zip([p for p in parts if p[1].stop > p[1].start], futures, strict=True):
            reply = future.result()
            got = reply.get("rollouts", [])
            if len(got) != s.stop - s.start:
                raise RemoteEngineError(
                    f"rollout server {url} returned {len(got)} groups for {s.stop - s.start} prompts"
                )
            for prompt, group in zip(prompts[s], got, strict=True):
                groups.append(
                    [Rollout(list(prompt), r["response_ids"], r.get("logprobs"), r["finish_reason"]) for r in group]
                )
        return groups

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push the new weights (module docstring); every rank calls it and drains ``weights`` (a collective)."""
        from plugrl.dist import host_barrier

        t0 = time.perf_counter()
        self.version += 1
        if self.rank == 0:
            pieces = self._push(chunks(weights, self.chunk_bytes))
            log.debug(
                "weights v%d to %d server(s) in %d piece(s) over %s: %.2fs",
                self.version,
                len(self.urls),
                pieces,
                self.transport,
                time.perf_counter() - t0,
            )
        else:
            for _ in weights:  # the gathers are collectives: this rank takes part, rank 0 sends
                pass
        host_barrier()  # no rank generates before the servers hold the new weights

    def _push(self, pieces: Iterator[dict[str, torch.Tensor]]) -> int:
        """Every piece to every server, numbered, the last one marked (the servers load them together once all
        have arrived: see :mod:`plugrl.rollout.server`); returns the number of pieces. One piece ahead is read
        to know which is the last, so over http at most two pieces are in this process's memory; over shared
        memory every piece's file stays until the last one is answered."""
        from safetensors.torch import save, save_file

        folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        files: list[Path] = []

        def send(i: int, piece: dict[str, torch.Tensor], last: bool) -> None:
            query = f"/weights?version={self.version}&piece={i}&last={int(last)}"
            if self.transport == "http":
                data, kind = save(piece), "application/octet-stream"
                calls = [self._pool.submit(self._request, u, query, data, kind) for u in self.urls]
            else:
                path = folder / f"plugrl_weights_{os.getpid()}_{uuid.uuid4().hex[:8]}.safetensors"
                files.append(path)
                save_file(piece, str(path))
                calls = [self._pool.submit(self._post_json, u, query, {"path": str(path)}) for u in self.urls]
            for c in calls:
                c.result()

        count = 0
        try:
            ahead = next(pieces, None)
            while ahead is not None:
                piece, ahead = ahead, next(pieces, None)
                send(count, piece, last=ahead is None)
                count += 1
        finally:
            for path in files:
                path.unlink(missing_ok=True)
        return count

    def load_adapter(self, tensors, peft_config) -> None:
        raise RemoteEngineError("rollout.mode=server serves merged weights only: set rollout.lora_sync=merged")

    def sleep(self) -> None:  # the servers keep their memory
        pass

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.launched:
            from plugrl import servers

            for server in self.launched:
                servers.stop(server.port)
            self.launched = []


# --------------------------------------------------------------------------- servers started by the trainer

# the rollout keys a started server is built with (the engine's own settings; sampling comes with each request)
ENGINE_KEYS = (
    "name",
    "dtype",
    "engine_log_level",
    "gpu_memory_utilization",
    "cpu_kv_cache_gb",
    "block_size",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enforce_eager",
    "tensor_model_parallel_size",
)


def serve_command(model_path: str, rollout, *, port: int, max_model_len: int, device: str, seed: int) -> list[str]:
    """``plugrl rollout-serve`` for ``model_path`` on 127.0.0.1:``port``, its engine as ``rollout`` sets it."""
    import sys

    # the engine and its dtype always; the rest where the run sets them (a default the server has as well)
    keys = [k for k in ENGINE_KEYS if k in ("name", "dtype") or k in rollout.model_fields_set]
    settings = [f"rollout.{k}={json.dumps(getattr(rollout, k))}" for k in keys]
    return [
        sys.executable,
        "-m",
        "plugrl.cli",
        "rollout-serve",
        str(model_path),
        *settings,
        f"rollout.seed={seed}",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--device",
        device,
    ]


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(cfg, *, rank: int, world_size: int, device: str, log_dir: Path) -> RemoteEngine:
    """The RemoteEngine of a run with ``rollout.mode: server``: ``rollout.server_urls``, or ``rollout.servers``
    servers that rank 0 starts on this host (logs ``log_dir/rollout_server_<i>.log``; each seeded with
    ``rollout.seed`` + i) and whose addresses every rank receives. A collective under torchrun."""
    from plugrl import servers
    from plugrl.dist import broadcast_object

    r = cfg.rollout
    launched: list = []
    urls = list(r.server_urls)
    if not urls:
        problem = None
        if rank == 0:
            seed = r.seed if r.seed is not None else cfg.trainer.seed
            try:
                for i in range(r.servers):
                    port = free_port()
                    command = serve_command(
                        cfg.model.path,
                        r,
                        port=port,
                        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
                        device=device,
                        seed=seed + i,
                    )
                    launched.append(
                        servers.start_command(
                            lambda command=command: command,
                            cfg.model.path,
                            port,
                            log_path=log_dir / f"rollout_server_{i}.log",
                            timeout_s=r.server_timeout_s,
                            where="rollout",
                        )
                    )
            except servers.ServerError as e:
                problem = str(e)
                for server in launched:
                    servers.stop(server.port)
            urls = [f"http://{servers.HOST}:{s.port}" for s in launched]
        problem, urls = broadcast_object((problem, urls))
        if problem:
            raise RemoteEngineError(f"could not start the rollout servers: {problem}")
    return RemoteEngine(
        urls,
        calculate_log_probs=r.calculate_log_probs,
        transport=r.weight_transport,
        chunk_mb=r.weight_chunk_mb,
        timeout_s=r.server_timeout_s,
        rank=rank,
        world_size=world_size,
        launched=launched,
    )
