"""The trainer's side of ``rollout.mode: server``: a RolloutEngine whose generations run on rollout servers
(:mod:`plugrl_rollout_servers.server`), one or more, started by the trainer or given as ``rollout.server_urls``.

- :meth:`RemoteEngine.generate` splits the prompts over the servers (consecutive shares, as even as they go),
  asks them at once and returns the rollouts in prompt order, as a colocated engine would.
- :meth:`RemoteEngine.load_weights` (every rank calls it: gathering the full weights is a collective) pushes the
  new weights from rank 0 to every server in pieces of ``rollout.weight_chunk_mb``, then every rank waits for
  the push (a gloo barrier), so no rank generates with the old weights. The transport
  (``rollout.weight_transport``): ``shm``, a safetensors file in ``/dev/shm`` that servers on this host read in
  place; ``http``, the file's bytes in the request (servers on other hosts); ``auto``, ``shm`` when every server
  is on this host; ``collective``, each tensor broadcast over a process group of rank 0 and the servers
  (:class:`WeightsGroup`: gloo, or NCCL when the weights and every server's engine are on CUDA, each on a GPU of
  its own: :func:`collective_backend`), no file and no request body.
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
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from plugrl.rollout.types import ImagePrompt, Rollout, SamplingSettings, prompt_model_ids
from plugrl_rollout_servers.server import (
    TOKEN_ENV,
    process_group,
    prompt_to_json,
    ready_key,
    route_address,
    sampling_to_json,
    tensor_meta,
)

log = logging.getLogger("plugrl.rollout_servers")

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


def chunks(
    weights: Iterable[tuple[str, torch.Tensor]], max_bytes: int, to_cpu: bool = True
) -> Iterator[dict[str, torch.Tensor]]:
    """The named tensors in order, grouped into dicts of at most ``max_bytes`` (a larger tensor alone), moved to
    the host unless ``to_cpu`` is false."""
    piece: dict[str, torch.Tensor] = {}
    size = 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if piece and size + nbytes > max_bytes:
            yield piece
            piece, size = {}, 0
        tensor = tensor.detach().contiguous()
        piece[name] = tensor.cpu() if to_cpu else tensor
        size += nbytes
    if piece:
        yield piece


def collective_backend(weights_on_cuda: bool, trainer_gpu: str | None, server_gpus: list[list[str]]) -> tuple[str, str]:
    """(the weights group's backend, why) for ``rollout.weight_transport: collective``: NCCL when the weights are on
    a GPU (``trainer_gpu``: its UUID) and every server's engine is on GPUs (``server_gpus``: each server's, from its
    /health), all of them different GPUs; gloo (from host memory) otherwise. NCCL refuses two ranks of one group on
    one GPU, which a server on the trainer's own GPU, or two servers sharing one, would be."""
    if not weights_on_cuda or trainer_gpu is None:
        return "gloo", "the weights are in host memory"
    if not all(server_gpus):
        return "gloo", "a server's engine is not on a GPU"
    ends = [trainer_gpu] + [gpus[0] for gpus in server_gpus]  # each server receives on its first GPU
    if len(set(ends)) < len(ends):
        return "gloo", "a server shares a GPU with the trainer's rank 0 or with another server, which NCCL refuses"
    return "nccl", "the weights and every server are on GPUs of their own"


def resolve_transport(transport: str, urls: list[str]) -> str:
    """``auto`` -> ``shm`` when every server is on this host (and /dev/shm exists), else ``http``; ``collective``
    only when asked for."""
    if transport != "auto":
        return transport
    local = all(urllib.parse.urlsplit(u).hostname in LOCAL_HOSTS for u in urls)
    return "shm" if local and Path("/dev/shm").is_dir() else "http"


class RemoteEngine:
    """Rollout servers at ``urls`` (``http://host:port``) behind the RolloutEngine interface (module docstring).

    ``calculate_log_probs``: whether rollouts carry the sampler's log-probs; ``rank`` / ``world_size``: this
    trainer process's (rank 0 pushes the weights); ``launched``: the :class:`plugrl_model_servers.ManagedServer`
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
        self._group: WeightsGroup | None = None  # transport collective: built on the first push, then kept
        self._pool = ThreadPoolExecutor(max(len(self.urls), 1), thread_name_prefix="plugrl-remote-engine")

    # ----------------------------------------------------------------------------------- requests
    def _request(self, url: str, path: str, body: bytes | None, content_type: str = "") -> dict[str, Any]:
        """POST ``body`` to ``url`` + ``path`` (a GET without one); the JSON answer."""
        headers = {"Content-Type": content_type} if body is not None else {}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(url + path, data=body, headers=headers, method="GET" if body is None else "POST")
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
    def generate(self, prompts: list[list[int] | ImagePrompt], sampling: SamplingSettings) -> list[list[Rollout]]:
        """``sampling.n`` rollouts per prompt, the prompts shared out over the servers (image prompts carry their
        images: :func:`plugrl_rollout_servers.server.prompt_to_json`)."""
        if not prompts:
            return []
        parts = [(url, s) for url, s in zip(self.urls, shares(len(prompts), len(self.urls)), strict=True)]
        payload = {"sampling": sampling_to_json(sampling), "logprobs": self.calculate_log_probs}
        sent = [prompt_to_json(p) for p in prompts]
        futures = [
            self._pool.submit(self._post_json, url, "/generate", {**payload, "prompts": sent[s]})
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
                ids = list(prompt_model_ids(prompt))  # what the model read: an image prompt's expanded ids
                groups.append([Rollout(ids, r["response_ids"], r.get("logprobs"), r["finish_reason"]) for r in group])
        return groups

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Push the new weights (module docstring); every rank calls it and drains ``weights`` (a collective)."""
        from plugrl.dist import host_barrier

        t0 = time.perf_counter()
        self.version += 1
        if self.rank == 0:
            # a collective sends each tensor from where it is (a CUDA tensor over NCCL)
            pieces = self._push(chunks(weights, self.chunk_bytes, to_cpu=self.transport != "collective"))
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
        have arrived: see :mod:`plugrl_rollout_servers.server`); returns the number of pieces. One piece ahead is read
        to know which is the last, so over http or a collective at most two pieces are in this process's memory
        (the collective's metadata names every tensor of a piece before its broadcasts); over shared memory every
        piece's file stays until the last one is answered."""
        from safetensors.torch import save, save_file

        folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        files: list[Path] = []

        def send(i: int, piece: dict[str, torch.Tensor], last: bool) -> None:
            query = f"/weights?version={self.version}&piece={i}&last={int(last)}"
            if self.transport == "collective":
                return self._send_collective(i, piece, last)
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

    def _send_collective(self, i: int, piece: dict[str, torch.Tensor], last: bool) -> None:
        """Piece ``i`` over the weights group: its metadata to every server (a request each, on the pool), its
        tensors broadcast in that order once all are ready, then every answer. Any failure drops the group (the
        next push builds a new one, which the servers join) and says what to do."""
        urls = list(dict.fromkeys(self.urls))  # a server named twice is one rank of the group
        query = f"/weights/collective?version={self.version}&piece={i}&last={int(last)}"
        calls: list[Future] = []
        try:
            if self._group is None:
                first = next(iter(piece.values()))
                trainer_gpu = str(torch.cuda.get_device_properties(first.device).uuid) if first.is_cuda else None
                gpus = [list(self._request(u, "/health", None).get("gpus") or []) for u in urls]
                backend, why = collective_backend(first.is_cuda, trainer_gpu, gpus)
                log.info("rollout.weight_transport=collective over %s: %s", backend, why)
                self._group = WeightsGroup(urls, backend, self.timeout_s)
            group = self._group
            metas = [tensor_meta(name, t) for name, t in piece.items()]
            calls = [
                self._pool.submit(self._post_json, u, query, {"group": group.spec(rank), "tensors": metas})
                for rank, u in enumerate(urls, 1)
            ]
            group.send(self.version, i, list(piece.values()), calls)
            for c in calls:
                c.result()
        except Exception as e:
            group, self._group = self._group, None
            wait(calls, timeout=5)  # a server's own error says most: it is the one raised
            failed = [c.exception() for c in calls if c.done() and c.exception() is not None]
            way_out = "rollout.weight_transport=http sends the weights in HTTP requests instead"
            if failed and isinstance(failed[0], RemoteEngineError):
                raise RemoteEngineError(f"{failed[0]} (rollout.weight_transport=collective; {way_out})") from None
            where = f" at {group.host}:{group.port} (its store) and over {group.backend}" if group else ""
            raise RemoteEngineError(
                f"weights v{self.version} over rollout.weight_transport=collective to rollout server(s) "
                f"{', '.join(urls)} failed: {type(e).__name__}: {e}. The servers must reach this process{where}, "
                f"and it them; {way_out}"
            ) from e

    def load_adapter(self, tensors, peft_config) -> None:
        raise RemoteEngineError("rollout.mode=server serves merged weights only: set rollout.lora_sync=merged")

    def sleep(self) -> None:  # the servers keep their memory
        pass

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        self._group = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.launched:
            import plugrl_model_servers as servers

            for server in self.launched:
                servers.stop(server.port)
            self.launched = []


class WeightsGroup:
    """The process group of ``rollout.weight_transport: collective``: this process (the trainer's rank 0) as rank
    0, hosting the group's ``TCPStore`` on a free port, and the servers at ``urls`` as ranks 1..N, in that order;
    ``backend`` gloo (tensors sent from the host) or nccl (from this process's current CUDA device: untested here,
    plugrl's tests run on CPU).

    One group of 1 + N ranks rather than one pair per server: each tensor is broadcast once for every server (NCCL
    pipelines a broadcast along a ring or tree, so this process sends each byte once, not N times), and a push
    needs every server anyway. It is a group of its own (:func:`plugrl_rollout_servers.server.process_group`), apart
    from torch.distributed's default one. The servers join on their first piece; this side's group is built once
    each has said in the store that it is ready (:func:`plugrl_rollout_servers.server.ready_key`), and kept for later
    pushes. The store and gloo listen on this host's address on the route to the servers (the first one not on
    this host, if any): unauthenticated, as torchrun's, so for a trusted network."""

    def __init__(self, urls: list[str], backend: str, timeout_s: float):
        from torch.distributed import TCPStore

        self.urls, self.backend, self.timeout_s = urls, backend, timeout_s
        far = [u for u in urls if urllib.parse.urlsplit(u).hostname not in LOCAL_HOSTS] or urls
        target = urllib.parse.urlsplit(far[0])
        self.host = route_address(target.hostname or "127.0.0.1", target.port or 80)
        self.port = free_port()
        timeout = timedelta(seconds=timeout_s)
        self.store = TCPStore(self.host, self.port, None, is_master=True, timeout=timeout, wait_for_workers=False)
        self.pg = None  # built with the first piece, once every server has joined

    def spec(self, rank: int) -> dict[str, Any]:
        """The group as server ``rank`` is told it (``/weights/collective``'s ``group``)."""
        size = len(self.urls) + 1
        return {"host": self.host, "port": self.port, "rank": rank, "world_size": size, "backend": self.backend,
                "timeout_s": self.timeout_s}  # fmt: skip

    def send(self, version: int, piece: int, tensors: list[torch.Tensor], calls: list[Future]) -> None:
        """Broadcast ``tensors`` in order once every server is ready for ``piece`` of ``version``; ``calls``:
        the servers' requests, in rank order (one answered before its server was ready is a refusal: raised)."""
        waiting = dict(enumerate(calls, 1))
        deadline = time.monotonic() + self.timeout_s
        while waiting:
            for rank, call in list(waiting.items()):
                if self.store.check([ready_key(version, piece, rank)]):
                    del waiting[rank]
                elif call.done():
                    call.result()  # its error names the server
                    raise RemoteEngineError(f"rollout server {self.urls[rank - 1]} answered before receiving")
            if waiting and time.monotonic() > deadline:
                names = ", ".join(self.urls[r - 1] for r in waiting)
                raise RemoteEngineError(f"rollout server(s) {names} not ready after {self.timeout_s:.0f}s")
            if waiting:
                time.sleep(0.001)
        if self.pg is None:
            self.pg = process_group(self.store, 0, len(self.urls) + 1, self.backend, self.timeout_s, self.host)
        for t in tensors:
            t = t.cpu() if self.backend == "gloo" else t if t.is_cuda else t.cuda()
            self.pg.broadcast(t, 0).wait()


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


def serve_command(
    model_path: str,
    rollout,
    *,
    port: int,
    max_model_len: int,
    device: str,
    seed: int,
    gpu_memory_utilization: float | None = None,
) -> list[str]:
    """``plugrl rollout-serve`` for ``model_path`` on 127.0.0.1:``port``, its engine as ``rollout`` sets it
    (``gpu_memory_utilization``: the fraction when the run leaves it unset, for a server on a GPU of its own)."""
    import sys

    # the engine and its dtype always; the rest where the run sets them (a default the server has as well)
    keys = [k for k in ENGINE_KEYS if k in ("name", "dtype") or k in rollout.model_fields_set]
    settings = [f"rollout.{k}={json.dumps(getattr(rollout, k))}" for k in keys]
    if gpu_memory_utilization is not None and "gpu_memory_utilization" not in keys:
        settings.append(f"rollout.gpu_memory_utilization={gpu_memory_utilization}")
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


def server_gpus(rollout, device: str, topo=None) -> list:
    """The :class:`.placement.ServerGPUs` of each rollout server rank 0 starts (None each on a CPU): GPUs no
    training rank uses when the node has enough, else training GPUs shared (said in the log, with what to do)."""
    from plugrl.placement import Topology
    from plugrl_rollout_servers.placement import rollout_server_gpus

    if device != "cuda":
        return [None] * rollout.servers
    placed = rollout_server_gpus(topo or Topology.from_env(), rollout.servers, rollout.tensor_model_parallel_size)
    for i, where in enumerate(placed):
        (log.warning if where.shares_training else log.info)(
            "rollout server %d on GPU(s) %s: %s%s",
            i,
            ",".join(where.visible),
            where.why,
            "; make more GPUs visible than torchrun's --nproc_per_node to give the servers their own"
            if where.shares_training
            else "",
        )
    return placed or [None] * rollout.servers


def connect(cfg, *, rank: int, world_size: int, device: str, log_dir: Path) -> RemoteEngine:
    """The RemoteEngine of a run with ``rollout.mode: server``: ``rollout.server_urls``, or ``rollout.servers``
    servers that rank 0 starts on this host (logs ``log_dir/rollout_server_<i>.log``; each seeded with
    ``rollout.seed`` + i; on GPUs each with its own ``CUDA_VISIBLE_DEVICES``: :func:`server_gpus`, and 0.9 of a GPU
    of its own unless rollout.gpu_memory_utilization is set) and whose addresses every rank receives. A collective
    under torchrun."""
    import plugrl_model_servers as servers
    from plugrl.dist import broadcast_object
    from plugrl.placement import PlacementError
    from plugrl_model_servers.placement import OWN_GPU_FRACTION

    r = cfg.rollout
    launched: list = []
    urls = list(r.server_urls)
    if not urls:
        problem = None
        if rank == 0:
            seed = r.seed if r.seed is not None else cfg.trainer.seed
            try:
                for i, gpus in enumerate(server_gpus(r, device)):
                    port = free_port()
                    command = serve_command(
                        cfg.model.path,
                        r,
                        port=port,
                        max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
                        device=device,
                        seed=seed + i,
                        gpu_memory_utilization=None if gpus is None or gpus.shares_training else OWN_GPU_FRACTION,
                    )
                    launched.append(
                        servers.start_command(
                            lambda command=command: command,
                            cfg.model.path,
                            port,
                            log_path=log_dir / f"rollout_server_{i}.log",
                            timeout_s=r.server_timeout_s,
                            where="rollout",
                            env=None if gpus is None else gpus.env,
                        )
                    )
            except (servers.ServerError, PlacementError) as e:
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
