"""A rollout server: one engine (vLLM, or the HF engine) in a process of its own, generating for a trainer that
pushes it new weights after each update (``rollout.mode: server``; ``plugrl rollout-serve MODEL`` starts one).

Who calls what: :class:`plugrl_rollout_servers.remote.RemoteEngine` in the trainer (every rank) sends ``/generate``
requests and, from rank 0, ``/weights`` after each update; :func:`serve` runs the server until SIGTERM/SIGINT.
The engine is built as the trainer builds its own (:func:`plugrl.rollout.make_engine` with the ``rollout``
settings given), always reporting sampling log-probs (a request says whether it wants them back).

Routes (JSON unless said otherwise; a server started with ``PLUGRL_ROLLOUT_TOKEN`` in its environment answers
the POSTs only when they carry ``Authorization: Bearer <that token>``, 401 otherwise):

- ``POST /generate``: ``{"prompts": [[token id]], "sampling": {SamplingSettings' fields}, "logprobs": bool}``
  -> ``{"rollouts": [[{"response_ids", "logprobs", "finish_reason"}]], "weights_version": int}``, ``n`` per
  prompt, in order. A prompt with images (a vision-language model; the vLLM engine) is an object instead:
  ``{"ids": [token id], "model_ids": [token id], "images": [base64 PNG]}`` (:class:`ImagePrompt`'s fields: the
  ids with one image token per image, the processor's expansion of them, the images losslessly as PNG).
- ``POST /weights?version=V&piece=I&last=0|1``: piece I (0-based) of the weights of version V (the steps
  trained), ``last=1`` on the final one, either the bytes of a safetensors file (``application/octet-stream``:
  across hosts) or ``{"path": ...}`` naming such a file the client wrote to shared memory on this host
  (``/dev/shm/plugrl_weights_*.safetensors``; no other path is read, and the client keeps it until the last
  piece is answered). The pieces are held until all have arrived, then loaded in one engine call: vLLM's
  in-place reload processes a fused layer (q, k and v in one matrix) once it has all of its parts within one
  call, and one split over two calls would get uninitialised memory for the missing part. ->
  ``{"weights_version": the version now served (the previous one until the last piece), "tensors": the number
  this call loaded}``.
- ``POST /weights/collective?version=V&piece=I&last=0|1`` (``rollout.weight_transport: collective``): the same
  pieces, their tensors broadcast over a process group of the trainer's rank 0 and the servers instead of a file:
  ``{"group": {"host", "port", "rank", "world_size", "backend", "timeout_s"}, "tensors": [[name, dtype, shape]]}``.
  The server joins the group (``host:port`` is the trainer's TCPStore; ``backend`` gloo, or nccl when both
  sides are on CUDA, on different GPUs) on the first call and keeps it until a call names another one; it says it
  is ready in the store (:func:`ready_key`), receives each tensor in order into a buffer of that dtype and shape
  (over NCCL one tensor at a time on its GPU, each copied to host memory as it arrives: the pieces wait for the
  last one in host memory, never on the GPU beside the engine's own weights), and answers as ``/weights`` does
  once they are in (and, with the last piece, loaded).
- ``GET /health`` -> ``{"status": "ok", "model", "engine", "device", "gpus", "weights_version"}`` (``gpus``: the
  UUIDs of the GPUs the server sees, by which a trainer tells whether a server shares its GPU);
  ``GET /v1/models`` lists the model (what :func:`plugrl_model_servers.reachable` asks).

A vLLM server of ``rollout.tensor_model_parallel_size`` > 1 runs its shards in worker processes of vLLM's own; the
weights then reach them as safetensors files in a folder of its own in /dev/shm that each worker reads
(:meth:`plugrl.rollout.vllm_engine.VLLMEngine.load_weights_from_files`), removed once loaded.

Engine calls run one at a time on a thread of their own: requests from several trainer ranks queue, and a weight
piece never lands in the middle of a generation. Errors are ``{"error": {"message"}}`` with status 400 (a
request that cannot be served: the message says why) or 500 (the engine failed; its log has the traceback).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import io
import json
import logging
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp import web

from plugrl.rollout.types import ImagePrompt, Rollout, SamplingSettings

log = logging.getLogger("plugrl.rollout_servers")

TOKEN_ENV = "PLUGRL_ROLLOUT_TOKEN"
MAX_BODY = 16 << 30  # a weight piece is at most rollout.weight_chunk_mb; this only bounds a broken client
SHARED_DIRS = ("/dev/shm", tempfile.gettempdir())
SHARED_NAME = re.compile(r"^plugrl_weights_[\w.-]+\.safetensors$")


class RequestError(Exception):
    """A request the server answers with status 400: the message says what was wrong."""


def sampling_to_json(s: SamplingSettings) -> dict[str, Any]:
    return {**dataclasses.asdict(s), "stop": list(s.stop)}


def sampling_from_json(data: Any) -> SamplingSettings:
    if not isinstance(data, dict):
        raise RequestError("'sampling' must be an object with SamplingSettings' fields (n, max_tokens, ...)")
    fields = {f.name for f in dataclasses.fields(SamplingSettings)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise RequestError(f"unknown sampling fields {unknown}; known: {sorted(fields)}")
    try:
        return SamplingSettings(**{**data, "stop": tuple(data.get("stop") or ())})
    except TypeError as e:
        raise RequestError(f"sampling: {e}") from None


def prompt_to_json(prompt: list[int] | ImagePrompt) -> list[int] | dict[str, Any]:
    """A prompt as ``/generate`` takes it: token ids, or an image prompt's ids and images (PNG, base64)."""
    if not isinstance(prompt, ImagePrompt):
        return list(prompt)
    encoded = []
    for image in prompt.images:
        buf = io.BytesIO()
        image.save(buf, format="PNG")  # lossless: the server's pixels are the trainer's
        encoded.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    return {"ids": list(prompt.ids), "model_ids": list(prompt.model_ids), "images": encoded}


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) for t in value)


def prompt_from_json(data: Any, index: int) -> list[int] | ImagePrompt:
    """A ``/generate`` prompt back: token ids, or an :class:`ImagePrompt` (its images decoded; no pixel inputs:
    vLLM makes its own). A RequestError naming prompt ``index`` for anything else."""
    if _token_ids(data):
        return data
    where = f"prompts[{index}]"
    if not isinstance(data, dict) or not _token_ids(data.get("ids")) or not _token_ids(data.get("model_ids")):
        raise RequestError(
            f"{where} must be a non-empty list of token ids, or an object with 'ids', 'model_ids'"
            " (non-empty lists of token ids) and 'images' (base64 PNGs)"
        )
    images = data.get("images")
    if not isinstance(images, list) or not images or not all(isinstance(i, str) for i in images):
        raise RequestError(f"{where}: 'images' must be a non-empty list of base64-encoded images")
    from plugrl.vlm import ImageError, NoVisionSupport, vision_support

    try:
        vision = vision_support()  # images are decoded by plugrl-vision, which a run with images has
    except NoVisionSupport as e:
        raise RequestError(f"{where}: {e}") from None
    decoded = []
    for k, text in enumerate(images):
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(f"{where}: images[{k}] is not base64") from None
        try:
            decoded.append(vision.load_image(raw, f"{where}: images[{k}]"))
        except ImageError as e:
            raise RequestError(str(e)) from None
    return ImagePrompt(ids=data["ids"], images=decoded, model_ids=data["model_ids"], pixels=None)


def rollouts_to_json(groups: list[list[Rollout]], logprobs: bool) -> list[list[dict[str, Any]]]:
    return [
        [
            {
                "response_ids": r.response_ids,
                "logprobs": r.logprobs if logprobs else None,
                "finish_reason": r.finish_reason,
            }
            for r in group
        ]
        for group in groups
    ]


def tensor_meta(name: str, tensor) -> list:
    """``[name, dtype, shape]`` of a tensor sent over the weights group (``"bfloat16"``: torch's name)."""
    return [name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)]


def tensor_buffer(meta: Any, device: str = "cpu") -> tuple[str, Any]:
    """(name, an empty tensor) for a :func:`tensor_meta` entry, on ``device`` (``meta``: the shape and dtype
    alone, no memory); a RequestError if it is not one."""
    import torch

    try:
        name, dtype, shape = meta
        kind = getattr(torch, dtype)
        ok = isinstance(name, str) and isinstance(kind, torch.dtype)
        ok = ok and isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)
    except (TypeError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise RequestError(f"tensor {meta!r}: each must be [name, dtype (such as 'bfloat16'), shape (list of sizes)]")
    return name, torch.empty(shape, dtype=kind, device=device)


def receive_buffer(spec: Any, device: str) -> Any:
    """An empty tensor like ``spec`` (a meta tensor: dtype and shape) on ``device``, for one broadcast."""
    import torch

    return torch.empty(spec.shape, dtype=spec.dtype, device=device)


def to_host(received: Any, device: str) -> Any:
    """A tensor received on ``device`` in host memory: copied off a GPU (its buffer is then freed), as it is on the
    CPU."""
    return received if device == "cpu" else received.to("cpu", copy=True)


def gpu_ids() -> list[str]:
    """The UUIDs of the CUDA devices this process sees ([] without CUDA): which physical GPUs a server is on."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


def ready_key(version: int, piece: int, rank: int) -> str:
    """The key a server sets in the weights group's store once it is about to receive a piece: the trainer
    broadcasts only when every server is ready, so a refused request is an error at once, not a broadcast that
    waits out the timeout."""
    return f"plugrl_weights_ready/{version}/{piece}/{rank}"


def route_address(host: str, port: int) -> str:
    """This host's address on its route to ``host`` (a UDP socket's connect sends nothing): where that host
    reaches this process, for the weights group's gloo connections."""
    import socket

    family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as s:
        s.connect(address)
        return s.getsockname()[0]


def process_group(store, rank: int, size: int, backend: str, timeout_s: float, address: str):
    """A process group of its own for the weights, built on ``store``: outside torch.distributed's default
    group, which the trainer under torchrun and a vLLM engine in the server each have of their own. ``gloo``
    connects from ``address``; ``nccl`` runs on this process's current CUDA device (untested here: no GPU)."""
    from datetime import timedelta

    import torch.distributed as dist

    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timedelta(seconds=timeout_s)
        return dist.ProcessGroupNCCL(store, rank, size, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    return dist.ProcessGroupGloo(store, rank, size, options)


def shared_weights_path(path: Any) -> Path:
    """The weight file a client named, if it is one a client may name (:data:`SHARED_NAME` in a directory of
    :data:`SHARED_DIRS`); a RequestError otherwise. The server reads no other file for a client."""
    if not isinstance(path, str):
        raise RequestError("'path' must be a string")
    p = Path(path)
    if not SHARED_NAME.match(p.name) or str(p.parent) not in SHARED_DIRS:
        raise RequestError(
            f"{path!r} is not a weight file this server reads: it reads plugrl_weights_*.safetensors in "
            f"{' or '.join(SHARED_DIRS)} only"
        )
    if not p.is_file():
        raise RequestError(f"{path} does not exist on the server's host (is the client on another host? use http)")
    return p


class RolloutServer:
    """The aiohttp application around one engine (module docstring). ``engine``: a RolloutEngine; ``model``:
    the name ``/health`` and ``/v1/models`` report."""

    def __init__(self, engine, model: str, engine_name: str, token: str | None = None):
        self.engine, self.model, self.engine_name, self.token = engine, model, engine_name, token
        self.version = 0
        self._pieces: dict[int, Any] = {}  # piece -> a Path (shared memory), bytes or tensors, of self._incoming
        self._incoming: int | None = None  # the version being received
        self._count: int | None = None  # its number of pieces, once the last one has come
        self._group: tuple | None = None  # the weights group joined: (its spec, the store, the process group)
        self.device = str(getattr(engine, "device", "cpu"))
        self.gpus = gpu_ids() if self.device.startswith("cuda") else []
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="plugrl-rollout-engine")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._errors])
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/weights", self._weights)
        app.router.add_post("/weights/collective", self._weights_collective)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        guarded = request.method != "GET"  # the two GETs say only that it is up, and what it serves
        if guarded and self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return _error(401, f"this rollout server needs 'Authorization: Bearer <token>' (${TOKEN_ENV})")
        try:
            return await handler(request)
        except RequestError as e:
            return _error(400, str(e))
        except web.HTTPException:
            raise
        except Exception as e:  # the engine failed: said to the client, the traceback in this server's log
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, f"{type(e).__name__}: {e}")

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _generate(self, request: web.Request) -> web.Response:
        body = await _json(request)
        raw = body.get("prompts")
        if not isinstance(raw, list):
            raise RequestError("'prompts' must be a list of prompts (lists of token ids, or image prompt objects)")
        prompts = [prompt_from_json(p, i) for i, p in enumerate(raw)]
        if any(isinstance(p, ImagePrompt) for p in prompts) and not getattr(self.engine, "multimodal", False):
            raise RequestError(
                f"image prompts need a vision-language model served by the vllm engine; this server runs "
                f"{self.model} with the {self.engine_name} engine"
            )
        sampling = sampling_from_json(body.get("sampling"))
        want_logprobs = bool(body.get("logprobs", False))
        groups = await self._run(self.engine.generate, prompts, sampling) if prompts else []
        return web.json_response({"rollouts": rollouts_to_json(groups, want_logprobs), "weights_version": self.version})

    async def _weights(self, request: web.Request) -> web.Response:
        version, piece, last = _piece_query(request)
        if request.content_type == "application/json":
            source: Any = shared_weights_path((await _json(request)).get("path"))
        else:
            source = await request.read()
            _check_safetensors(source)
        return await self._add_piece(version, piece, last, source)

    async def _weights_collective(self, request: web.Request) -> web.Response:
        version, piece, last = _piece_query(request)
        body = await _json(request)
        group, metas = _group_spec(body.get("group")), body.get("tensors")
        if not isinstance(metas, list) or not metas:
            raise RequestError("'tensors' must be a non-empty list of [name, dtype, shape]")
        if group["backend"] == "nccl" and not self.device.startswith("cuda"):
            raise RequestError(f"backend nccl needs the engine on CUDA; this server's is on {self.device}")
        received = await self._run(self._receive, group, metas, ready_key(version, piece, group["rank"]))
        return await self._add_piece(version, piece, last, received)

    def _receive(self, group: dict[str, Any], metas: list, ready: str) -> list[tuple[str, Any]]:
        """The piece's tensors from the trainer's broadcasts (joining its group first when it is a new one), in host
        memory, on the engine's thread. The entries are checked before saying ready (a bad one is refused before
        any broadcast); over NCCL each tensor lands in a GPU buffer of its own, copied to host memory before the
        next one comes, so the GPU holds at most one received tensor beside the engine."""
        from datetime import timedelta

        import torch.distributed as dist

        device = "cuda" if group["backend"] == "nccl" else "cpu"
        specs = [tensor_buffer(m, "meta") for m in metas]
        spec = tuple(sorted(group.items()))
        if self._group is not None and self._group[0] == spec:
            _, store, pg = self._group
            store.set(ready, "1")
        else:  # a new trainer, or the same one after a failed push: the old group is dropped
            self._group = None
            host, port, rank, size = group["host"], group["port"], group["rank"], group["world_size"]
            timeout = timedelta(seconds=group["timeout_s"])
            store = dist.TCPStore(host, port, None, is_master=False, timeout=timeout)
            store.set(ready, "1")  # the trainer builds its side of the group once every server has said so
            pg = process_group(store, rank, size, group["backend"], group["timeout_s"], route_address(host, port))
            self._group = (spec, store, pg)
        received = []
        try:
            for name, shape in specs:
                buffer = receive_buffer(shape, device)
                pg.broadcast(buffer, 0).wait()
                received.append((name, to_host(buffer, device)))
                del buffer
        except Exception:
            self._group = None
            raise
        return received

    async def _add_piece(self, version: int, piece: int, last: int, source: Any) -> web.Response:
        """Hold piece ``piece`` of ``version`` (a Path, bytes or a list of (name, tensor)); load every piece in
        one engine call once the last has come and all have arrived."""
        if self._incoming != version:  # a new push (one that broke off before its end is dropped)
            self._incoming, self._pieces, self._count = version, {}, None
        self._pieces[piece] = source
        if last:
            self._count = piece + 1
        if self._count is None or len(self._pieces) < self._count:
            return web.json_response({"weights_version": self.version, "tensors": 0})
        if sorted(self._pieces) != list(range(self._count)):
            got = sorted(self._pieces)
            self._incoming, self._pieces, self._count = None, {}, None
            raise RequestError(f"weights version {version}: pieces {got} arrived, expected 0..{len(got) - 1}")
        sources = [self._pieces[i] for i in range(self._count)]
        self._incoming, self._pieces, self._count = None, {}, None
        count = await self._run(self._load, sources)
        self.version = version
        return web.json_response({"weights_version": version, "tensors": count})

    def _load(self, sources: list) -> int:
        """Every piece's tensors in one engine call (module docstring)."""
        from contextlib import ExitStack

        from safetensors import safe_open
        from safetensors.torch import load

        if getattr(self.engine, "weights_from_files", False):
            return self._load_files(sources)
        with ExitStack() as files:
            tensors: list[tuple[str, Any]] = []
            for source in sources:
                if isinstance(source, Path):  # memory-mapped: read where the client wrote it
                    f = files.enter_context(safe_open(str(source), framework="pt"))
                    tensors += [(name, f.get_tensor(name)) for name in f.keys()]
                elif isinstance(source, list):  # received over the weights group
                    tensors += source
                else:
                    tensors += list(load(source).items())
            self.engine.load_weights(iter(tensors))
        return len(tensors)

    def _load_files(self, sources: list) -> int:
        """Every piece as a safetensors file in a new folder of this server's in /dev/shm, which each of the
        engine's worker processes reads (:meth:`VLLMEngine.load_weights_from_files`); the folder is removed once
        loaded. A client's shared-memory file is linked in (copied when on another filesystem)."""
        import shutil

        from safetensors import safe_open
        from safetensors.torch import save_file

        root = Path(SHARED_DIRS[0] if Path(SHARED_DIRS[0]).is_dir() else SHARED_DIRS[1])
        folder = Path(tempfile.mkdtemp(prefix=f"plugrl_server_{os.getpid()}_", dir=root))
        count = 0
        try:
            for i, source in enumerate(sources):
                path = folder / f"piece_{i:05d}.safetensors"
                if isinstance(source, Path):
                    try:
                        os.link(source, path)
                    except OSError:
                        shutil.copyfile(source, path)
                elif isinstance(source, list):
                    save_file(dict(source), str(path))
                else:
                    path.write_bytes(source)
                with safe_open(str(path), framework="pt") as f:
                    count += len(list(f.keys()))
            self.engine.load_weights_from_files(str(folder))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return count

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ok",
                "model": self.model,
                "engine": self.engine_name,
                "device": self.device,
                "gpus": self.gpus,
                "weights_version": self.version,
            }
        )

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model"}]})


def _piece_query(request: web.Request) -> tuple[int, int, int]:
    try:
        version, piece, last = (int(request.query[k]) for k in ("version", "piece", "last"))
    except (KeyError, ValueError):
        raise RequestError(f"POST {request.path} needs ?version=V&piece=I&last=0|1 (integers)") from None
    if piece < 0:
        raise RequestError(f"piece {piece}: pieces count from 0")
    return version, piece, last


def _group_spec(group: Any) -> dict[str, Any]:
    """The weights group a ``/weights/collective`` request names, checked; a RequestError otherwise."""
    kinds = {"host": str, "port": int, "rank": int, "world_size": int, "backend": str, "timeout_s": (int, float)}
    if not isinstance(group, dict) or set(group) != set(kinds):
        raise RequestError(f"'group' must be an object with exactly {sorted(kinds)}")
    bad = sorted(k for k, kind in kinds.items() if not isinstance(group[k], kind))
    if bad or not 0 < group["rank"] < group["world_size"] or group["backend"] not in ("gloo", "nccl"):
        raise RequestError(f"'group': {group} (wrong: {bad or 'rank, world_size or backend'})")
    return group


def _check_safetensors(data: bytes) -> None:
    """A RequestError unless ``data`` is a safetensors file (checked as it arrives, loaded with the last piece)."""
    from safetensors.torch import load

    try:
        load(data)
    except Exception as e:
        raise RequestError(f"the body is not a safetensors file ({e})") from None


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except json.JSONDecodeError as e:
        raise RequestError(f"the body is not JSON ({e})") from None
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    return body


def serve(model: str, host: str, port: int, rollout, *, max_model_len: int, device: str) -> None:
    """Build the engine (``rollout``: a RolloutConfig; its ``seed`` seeds it) and serve it on ``host:port`` until
    SIGTERM or SIGINT."""
    from transformers import AutoTokenizer

    from plugrl.models import resolve_model_path
    from plugrl.precision import resolve_dtype
    from plugrl.rollout import make_engine

    path = resolve_model_path(model)
    rollout.calculate_log_probs = True  # the sampler's log-probs are always at hand; a request asks for them
    dtype = resolve_dtype(rollout.dtype, device, key="rollout.dtype")
    engine = make_engine(
        rollout.name,  # one of the kernel's engines (vllm, hf): a server is started without a run's plugins
        model_path=path,
        cfg=rollout,
        dtype=dtype,
        max_model_len=max_model_len,
        device=device,
        world_size=1,
        rank=0,
        tokenizer=AutoTokenizer.from_pretrained(path),
        # vLLM runs tensor-parallel shards in worker processes of its own: weights reach them as files
        weights_from_files=rollout.name == "vllm" and rollout.tensor_model_parallel_size > 1,
    )
    server = RolloutServer(engine, model, rollout.name, os.environ.get(TOKEN_ENV) or None)
    log.info("rollout server for %s (%s, %s) on http://%s:%d", model, rollout.name, dtype, host, port)
    web.run_app(server.app(), host=host, port=port, print=None, access_log=None, shutdown_timeout=5.0)
    engine.close()
