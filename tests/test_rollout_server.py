"""rollout.mode: server: `plugrl rollout-serve` in a real process on 127.0.0.1 and the trainer's RemoteEngine.

The server runs the HF engine on the tiny random Llama (float32), which seeds each generation from the request:
so its rollouts can be compared, token for token and log-prob for log-prob, with an HF engine in this process.
The slow tests run vLLM in the server, and training runs with servers that plugrl starts itself.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch

import plugrl_model_servers as servers
from plugrl.rollout import SamplingSettings
from plugrl_rollout_servers.remote import RemoteEngine, RemoteEngineError, chunks, free_port, resolve_transport, shares
from plugrl_rollout_servers.server import (
    TOKEN_ENV,
    sampling_from_json,
    sampling_to_json,
    shared_weights_path,
    tensor_buffer,
    tensor_meta,
)
from test_e2e import metrics, tiny_overrides

SAMPLING = SamplingSettings(n=3, max_tokens=10, temperature=1.0, seed=1234)


def _start(model: Path, tmp_path: Path, *settings: str, env: dict | None = None) -> servers.ManagedServer:
    port = free_port()
    command = [
        "python",
        "-m",
        "plugrl.cli",
        "rollout-serve",
        str(model),
        "rollout.name=hf",
        "rollout.dtype=float32",
        *settings,
        "--port",
        str(port),
        "--max-model-len",
        "256",
        "--device",
        "cpu",
    ]
    import sys

    command[0] = sys.executable
    return servers.start_command(
        lambda: command, str(model), port, log_path=tmp_path / f"server_{port}.log", timeout_s=120, env=env
    )


@pytest.fixture(scope="module")
def hf_server(tiny_model, tmp_path_factory):
    server = _start(tiny_model, tmp_path_factory.mktemp("server"))
    yield f"http://127.0.0.1:{server.port}"
    servers.stop(server.port)


@pytest.fixture(scope="module")
def local_engine(tiny_model, smol_tokenizer):
    from plugrl.rollout.hf_engine import HFEngine

    return HFEngine(str(tiny_model), "float32", "cpu", smol_tokenizer)


def _train_on_servers(tiny_model: Path, tmp_path: Path, settings: list[str]) -> list[dict]:
    """`plugrl train` (in this process) of 3 steps of the tiny run with rollout.mode=server and ``settings``, lr
    1e-3 (the policy moves) and the rollout correction's diagnostics on; the metrics of the run."""
    from plugrl.cli import main

    args = [
        "train",
        "examples/countdown_grpo.yaml",
        *tiny_overrides(tiny_model, tmp_path, 3),
        "trainer.save_freq=0",
        "actor.optim.lr=1e-3",
        "rollout.mode=server",
        "algorithm.rollout_correction.mode=monitor",
        *settings,
    ]
    cwd = os.getcwd()
    os.chdir(Path(__file__).resolve().parent.parent)
    try:
        assert main(args) == 0
    finally:
        os.chdir(cwd)
    return metrics(tmp_path / "e2e")


def _prompts(tok) -> list[list[int]]:
    return [tok(t)["input_ids"] for t in ("The capital of France is", "1 + 1 =", "Once upon a time")]


# --------------------------------------------------------------------------- pure parts


def test_shares_split_prompts_evenly_in_order():
    assert shares(7, 3) == [slice(0, 3), slice(3, 5), slice(5, 7)]
    assert shares(2, 3) == [slice(0, 1), slice(1, 2), slice(2, 2)]
    assert [s.stop - s.start for s in shares(16, 4)] == [4, 4, 4, 4]


def test_weights_go_in_pieces_of_the_chunk_size_a_larger_tensor_alone():
    w = [("a", torch.zeros(256)), ("b", torch.zeros(256)), ("big", torch.zeros(2048)), ("c", torch.zeros(10))]
    pieces = list(chunks(iter(w), max_bytes=2048))  # float32: a and b are 1 KiB each, big 8 KiB
    assert [list(p) for p in pieces] == [["a", "b"], ["big"], ["c"]]


def test_transport_auto_is_shared_memory_only_when_every_server_is_on_this_host():
    assert resolve_transport("auto", ["http://127.0.0.1:8100", "http://localhost:8101"]) == "shm"
    assert resolve_transport("auto", ["http://127.0.0.1:8100", "http://10.0.0.7:8100"]) == "http"
    assert resolve_transport("http", ["http://127.0.0.1:8100"]) == "http"
    assert resolve_transport("collective", ["http://127.0.0.1:8100"]) == "collective"  # never chosen by auto


def test_collective_metadata_makes_buffers_of_the_same_name_dtype_and_shape_and_refuses_others():
    for t in (torch.zeros(3, 4, dtype=torch.bfloat16), torch.ones(7, dtype=torch.int64), torch.zeros(())):
        meta = json.loads(json.dumps(tensor_meta("model.w", t)))  # as it crosses the wire
        name, buffer = tensor_buffer(meta)
        assert (name, buffer.dtype, buffer.shape, buffer.device) == ("model.w", t.dtype, t.shape, t.device)
    assert tensor_meta("a", torch.zeros(2, dtype=torch.float16)) == ["a", "float16", [2]]
    for bad in (["a", "float17", [2]], ["a", "Tensor", [2]], ["a", "float32", [-1]], ["a", "float32"], "a", None):
        with pytest.raises(Exception, match=r"each must be \[name, dtype"):
            tensor_buffer(bad)


def test_the_collective_goes_over_nccl_only_between_different_gpus():
    from plugrl_rollout_servers.remote import collective_backend

    assert collective_backend(True, "GPU-a", [["GPU-b"], ["GPU-c", "GPU-d"]])[0] == "nccl"
    # a server on the trainer's own GPU, or two servers on one: NCCL refuses a group with one GPU twice
    backend, why = collective_backend(True, "GPU-a", [["GPU-a"]])
    assert backend == "gloo" and "shares a GPU with the trainer's rank 0" in why
    assert collective_backend(True, "GPU-a", [["GPU-b"], ["GPU-b"]])[0] == "gloo"
    assert collective_backend(True, "GPU-a", [["GPU-b"], []])[0] == "gloo"  # a server on the CPU
    assert collective_backend(False, None, [["GPU-b"]])[0] == "gloo"  # weights in host memory


class _Store:
    def __init__(self):
        self.keys: dict[str, str] = {}

    def set(self, key, value):
        self.keys[key] = value


def test_weights_received_over_nccl_wait_in_host_memory_one_tensor_on_the_gpu_at_a_time(monkeypatch):
    """The NCCL path of /weights/collective run on CPU tensors standing in for CUDA ones (no GPU here): each tensor is
    received into a buffer of its own on the engine's device and copied to host memory before the next comes, so
    the pieces held until the last one never sit on the GPU (2x the model beside vLLM's share at 7B)."""
    import gc
    import weakref

    from plugrl_rollout_servers import server as srv

    asked, alive_at_broadcast = [], []
    live: list = []

    def receive_buffer(spec, device):
        asked.append(device)
        t = torch.empty(spec.shape, dtype=spec.dtype)
        live.append(weakref.ref(t))
        return t

    class Group:
        def broadcast(self, buffer, src):
            gc.collect()
            alive_at_broadcast.append(sum(r() is not None for r in live))
            buffer.fill_(len(alive_at_broadcast))
            return type("Work", (), {"wait": lambda self: None})()

    monkeypatch.setattr(srv, "receive_buffer", receive_buffer)
    server = srv.RolloutServer(engine=None, model="m", engine_name="vllm")
    spec = {"host": "h", "port": 1, "rank": 1, "world_size": 2, "backend": "nccl", "timeout_s": 5.0}
    server._group = (tuple(sorted(spec.items())), _Store(), Group())
    metas = [["a", "float32", [2, 3]], ["b", "bfloat16", [4]], ["c", "float32", [1]]]
    got = server._receive(spec, metas, srv.ready_key(1, 0, 1))
    assert asked == ["cuda", "cuda", "cuda"]
    assert alive_at_broadcast == [1, 1, 1], "received tensors stayed on the device"
    assert [(n, t.device.type, t.dtype, list(t.shape)) for n, t in got] == [
        ("a", "cpu", torch.float32, [2, 3]),
        ("b", "cpu", torch.bfloat16, [4]),
        ("c", "cpu", torch.float32, [1]),
    ]
    assert [float(t.flatten()[0]) for _, t in got] == [1.0, 2.0, 3.0]


class _FileEngine:
    """A rollout server's engine whose workers read weight files (vLLM with rollout TP > 1): records what the
    folder held when it was loaded."""

    weights_from_files = True
    device = "cpu"

    def __init__(self):
        self.loaded: list[tuple[str, dict]] = []

    def load_weights_from_files(self, folder: str) -> None:
        from safetensors.torch import load_file

        found = {}
        for path in sorted(Path(folder).glob("*.safetensors")):
            found.update(load_file(str(path)))
        self.loaded.append((folder, found))


def test_a_tp_server_hands_every_piece_to_its_workers_as_files_and_removes_them(tmp_path):
    """rollout-serve with rollout.tensor_model_parallel_size > 1: vLLM's shards run in worker processes, which read
    the weights from a folder of this server's in /dev/shm; pieces from shared memory, HTTP bytes and a
    collective all end up there, and the folder is gone after the load."""
    from safetensors.torch import save, save_file

    from plugrl_rollout_servers import server as srv

    folder = Path(srv.SHARED_DIRS[0] if Path(srv.SHARED_DIRS[0]).is_dir() else srv.SHARED_DIRS[1])
    shm = folder / f"plugrl_weights_test_{os.getpid()}.safetensors"
    save_file({"a": torch.ones(2)}, str(shm))
    try:
        engine = _FileEngine()
        server = srv.RolloutServer(engine, "m", "vllm")
        count = server._load([shm, save({"b": torch.full((3,), 2.0)}), [("c", torch.zeros(1, 2))]])
    finally:
        shm.unlink()
    assert count == 3
    [(loaded_from, tensors)] = engine.loaded
    assert {k: v.tolist() for k, v in tensors.items()} == {"a": [1.0, 1.0], "b": [2.0] * 3, "c": [[0.0, 0.0]]}
    assert Path(loaded_from).parent == folder and not Path(loaded_from).exists()


def test_rollout_servers_plugrl_starts_get_their_own_gpus_and_memory(monkeypatch, tmp_path):
    """connect() on rank 0 of a node with 8 GPUs: with 6 training processes the 2 servers get CUDA_VISIBLE_DEVICES
    6 and 7 and 0.9 of them; with 8 they share training GPUs 0 and 1 at the run's fraction."""
    from plugrl import placement
    from plugrl.config import load_config
    from plugrl_rollout_servers import remote

    started = []

    def start_command(command, model, port, *, log_path, timeout_s, where, env=None):
        started.append((command(), env))
        return servers.ManagedServer(model, port, command(), None, log_path, where)

    monkeypatch.setattr(servers, "start_command", start_command)
    cfg = load_config("examples/countdown_grpo.yaml", ["rollout.mode=server", "rollout.servers=2"])
    for training, want_env, want_fraction in ((6, ["6", "7"], True), (8, ["0", "1"], False)):
        topo = placement.Topology(world_size=training, local_world_size=training, device_count=8)
        monkeypatch.setattr(placement.Topology, "from_env", classmethod(lambda cls, *a, topo=topo, **k: topo))
        started.clear()
        engine = remote.connect(cfg, rank=0, world_size=1, device="cuda", log_dir=tmp_path)
        engine._pool.shutdown()
        assert [env["CUDA_VISIBLE_DEVICES"] for _, env in started] == want_env
        fractions = ["rollout.gpu_memory_utilization=0.9" in command for command, _ in started]
        assert fractions == [want_fraction] * 2


def test_sampling_settings_cross_the_wire_unchanged_and_unknown_fields_are_refused():
    s = SamplingSettings(n=2, max_tokens=7, temperature=0.5, top_p=0.9, top_k=5, stop=("</a>",), seed=3)
    assert sampling_from_json(json.loads(json.dumps(sampling_to_json(s)))) == s
    with pytest.raises(Exception, match="unknown sampling fields"):
        sampling_from_json({**sampling_to_json(s), "best_of": 4})


def test_the_server_reads_only_weight_files_named_by_the_protocol(tmp_path):
    for bad in ("/etc/passwd", str(tmp_path / "plugrl_weights_x.safetensors"), "/dev/shm/model.safetensors"):
        with pytest.raises(Exception, match="not a weight file this server reads"):
            shared_weights_path(bad)


# --------------------------------------------------------------------------- a real server


def test_generation_on_the_server_equals_the_same_engine_in_process(hf_server, local_engine, smol_tokenizer):
    """Token ids, log-probs and finish reasons cross the wire unchanged, in prompt order. With two servers (here
    the same one twice) each gets a consecutive share in a request of its own, seeded as a call of its own."""
    prompts = _prompts(smol_tokenizer)
    one = RemoteEngine([hf_server], calculate_log_probs=True)
    assert one.generate(prompts, SAMPLING) == local_engine.generate(prompts, SAMPLING)
    two = RemoteEngine([hf_server, hf_server], calculate_log_probs=True)
    expected = local_engine.generate(prompts[:2], SAMPLING) + local_engine.generate(prompts[2:], SAMPLING)
    assert two.generate(prompts, SAMPLING) == expected
    without = RemoteEngine([hf_server], calculate_log_probs=False)
    assert all(r.logprobs is None for g in without.generate(prompts, SAMPLING) for r in g)
    assert one.generate([], SAMPLING) == []
    health = one._request(hf_server, "/health", None)  # a GET
    assert (health["status"], health["engine"], health["device"]) == ("ok", "hf", "cpu")


@pytest.mark.parametrize("transport", ["shm", "http", "collective"])
def test_pushed_weights_serve_the_new_policy(hf_server, local_engine, smol_tokenizer, tiny_model, transport):
    """New weights, in pieces smaller than the model, over shared memory, in the request or broadcast over a
    gloo group: the server then samples what an engine holding them samples, reports their version, and leaves
    no file in /dev/shm."""
    from safetensors.torch import load_file

    base = load_file(tiny_model / "model.safetensors")
    changed = {k: v + 0.02 * torch.randn_like(v) if v.dim() == 2 else v for k, v in base.items()}
    prompts = _prompts(smol_tokenizer)
    remote = RemoteEngine([hf_server], calculate_log_probs=True, transport=transport, chunk_mb=1)
    mine = f"plugrl_weights_{os.getpid()}_*"  # this process writes them; other tests running beside it write theirs
    before = set(Path("/dev/shm").glob(mine))
    try:
        remote.load_weights(iter(changed.items()))
        local_engine.load_weights(iter(changed.items()))
        assert remote.generate(prompts, SAMPLING) == local_engine.generate(prompts, SAMPLING)
        health = json.loads(urllib.request.urlopen(hf_server + "/health", timeout=10).read())
        assert health["weights_version"] == remote.version == 1
        assert set(Path("/dev/shm").glob(mine)) == before
    finally:
        remote.load_weights(iter(base.items()))
        local_engine.load_weights(iter(base.items()))


def test_collective_pushes_change_and_restore_the_policy_and_a_refusal_fails_at_once(
    hf_server, smol_tokenizer, tiny_model, monkeypatch
):
    """Over a collective: pushing new weights changes what the server samples and pushing the originals back
    restores it (several pieces per push, the group kept between pushes). A request the server refuses (here a
    tensor entry it cannot read) is an error at once naming the server and the way out, not a broadcast waiting
    for its timeout; the next push builds a new group, which the server joins, as it joins a new trainer's."""
    import time

    from safetensors.torch import load_file

    import plugrl_rollout_servers.remote as remote_module

    base = load_file(tiny_model / "model.safetensors")
    changed = {k: v + 0.05 * torch.randn_like(v) if v.dim() == 2 else v for k, v in base.items()}
    prompts = _prompts(smol_tokenizer)
    remote = RemoteEngine([hf_server], calculate_log_probs=True, transport="collective", chunk_mb=1, timeout_s=120)
    original = remote.generate(prompts, SAMPLING)
    try:
        remote.load_weights(iter(changed.items()))
        new_policy = remote.generate(prompts, SAMPLING)
        assert new_policy != original
        remote.load_weights(iter(base.items()))
        assert remote.generate(prompts, SAMPLING) == original
        group = remote._group
        assert group is not None and group.backend == "gloo"

        with monkeypatch.context() as m:
            m.setattr(remote_module, "tensor_meta", lambda name, t: [name, "float17", list(t.shape)])
            t0 = time.perf_counter()
            refused = f"rollout server {hf_server} answered /weights/collective.* 400: tensor .*weight_transport=http"
            with pytest.raises(RemoteEngineError, match=refused):
                remote.load_weights(iter(changed.items()))
            assert time.perf_counter() - t0 < 30
        assert remote._group is None
        remote.load_weights(iter(changed.items()))  # a new group
        assert remote._group is not group and remote.generate(prompts, SAMPLING) == new_policy

        other = RemoteEngine([hf_server], calculate_log_probs=True, transport="collective")  # another trainer
        other.load_weights(iter(base.items()))
        assert other.generate(prompts, SAMPLING) == original
    finally:
        RemoteEngine([hf_server], transport="http").load_weights(iter(base.items()))


def test_a_push_is_loaded_once_all_its_pieces_have_come_in_any_order(hf_server, tiny_model):
    """The server holds the pieces of a version until the last one's number is known and all have arrived (vLLM
    must get a fused layer's parts in one reload call), whatever order they arrive in; until then it serves the
    version before."""
    from safetensors.torch import load_file, save

    base = load_file(tiny_model / "model.safetensors")
    names = sorted(base)
    halves = [{k: base[k] for k in names[: len(names) // 2]}, {k: base[k] for k in names[len(names) // 2 :]}]

    def push(piece: int, last: int) -> dict:
        req = urllib.request.Request(
            f"{hf_server}/weights?version=41&piece={piece}&last={last}",
            data=save(halves[piece]),
            headers={"Content-Type": "application/octet-stream"},
            method="POST",
        )
        return json.loads(urllib.request.urlopen(req, timeout=60).read())

    before = json.loads(urllib.request.urlopen(hf_server + "/health", timeout=10).read())["weights_version"]
    assert push(1, 1) == {"weights_version": before, "tensors": 0}  # the last piece first: held
    assert push(0, 0) == {"weights_version": 41, "tensors": len(names)}  # all here: loaded in one call


def test_bad_requests_get_a_400_that_says_why_and_the_client_names_the_server(hf_server):
    def post(path, body, ctype="application/json"):
        req = urllib.request.Request(hf_server + path, data=body, headers={"Content-Type": ctype}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        return e.value.code, json.loads(e.value.read())["error"]["message"]

    assert post("/generate", b"{not json") == (400, post("/generate", b"{not json")[1])
    code, msg = post("/generate", json.dumps({"prompts": [[]], "sampling": sampling_to_json(SAMPLING)}).encode())
    assert code == 400 and "non-empty lists of token ids" in msg
    code, msg = post("/weights?version=3", b"junk", "application/octet-stream")
    assert code == 400 and "?version=V&piece=I&last=0|1" in msg
    code, msg = post("/weights?version=3&piece=0&last=1", b"junk", "application/octet-stream")
    assert code == 400 and "not a safetensors file" in msg
    code, msg = post("/weights?version=3&piece=0&last=1", json.dumps({"path": "/etc/passwd"}).encode())
    assert code == 400 and "not a weight file this server reads" in msg
    remote = RemoteEngine([hf_server])
    with pytest.raises(RemoteEngineError, match=f"rollout server {hf_server} answered /generate with 400: 'sampling'"):
        remote._post_json(hf_server, "/generate", {"prompts": [[1, 2]], "sampling": "greedy"})
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RemoteEngineError, match=f"rollout server {dead} did not answer /generate"):
        RemoteEngine([dead]).generate([[1, 2]], SAMPLING)


@pytest.mark.slow
def test_a_server_with_a_token_answers_only_requests_that_carry_it(tiny_model, tmp_path, monkeypatch):
    server = _start(tiny_model, tmp_path, env={TOKEN_ENV: "s3cret"})
    url = f"http://127.0.0.1:{server.port}"
    try:
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        with pytest.raises(RemoteEngineError, match="answered /generate with 401"):
            RemoteEngine([url]).generate([[1, 2, 3]], SAMPLING)
        with pytest.raises(RemoteEngineError, match="answered /weights/collective.* 401.*weight_transport=http"):
            RemoteEngine([url], transport="collective").load_weights(iter([("w", torch.zeros(2))]))
        monkeypatch.setenv(TOKEN_ENV, "s3cret")
        assert len(RemoteEngine([url]).generate([[1, 2, 3]], SAMPLING)[0]) == SAMPLING.n
    finally:
        servers.stop(server.port)


def test_server_keys_need_server_mode_and_server_mode_refuses_what_it_cannot_do(tmp_path, tiny_model):
    from plugrl.config import ConfigError, load_config

    (tmp_path / "c.yaml").write_text(f"model:\n  path: {tiny_model}\ndata:\n  dataset: countdown\n")
    cases = [
        (["rollout.server_urls=[http://10.0.0.7:8100]"], "rollout.server_urls is for rollout.mode=server"),
        (["rollout.weight_transport=collective"], "rollout.weight_transport is for rollout.mode=server"),
        (["rollout.mode=server", "rollout.server_urls=[10.0.0.7:8100]"], "is not http://host:port"),
        (["rollout.mode=server", "rollout.free_cache_engine=true"], "never sleep"),
        (["rollout.mode=server", "actor.lora.r=8", "rollout.lora_sync=adapter"], "rollout.lora_sync=merged"),
    ]
    for overrides, match in cases:
        with pytest.raises(ConfigError, match=match):
            load_config(tmp_path / "c.yaml", overrides)
    cfg = load_config(tmp_path / "c.yaml", ["rollout.mode=server"])
    assert not cfg.rollout.free_cache_engine and cfg.rollout.servers == 1


def test_the_server_engine_comes_from_this_package_and_its_absence_names_it(tmp_path, tiny_model):
    """The package's module in group plugrl.extensions gives every run the `server` engine, as the kernel's own;
    a registry without it (the package not installed) refuses rollout.mode=server naming the package, and the
    engine is refused by name in colocated mode."""
    from dataclasses import replace

    from plugrl.config import ConfigError, load_config
    from plugrl.plugins import load_plugins
    from plugrl.startup import check_engine

    registry = load_plugins([])
    assert registry.engines["server"].plugin == "plugrl-rollout-servers"  # its package's, in every run
    assert registry.engines["server"].factory.__module__ == "plugrl_rollout_servers.engine"
    (tmp_path / "c.yaml").write_text(f"model:\n  path: {tiny_model}\ndata:\n  dataset: countdown\n")
    cfg = load_config(tmp_path / "c.yaml", ["rollout.mode=server"])
    check_engine(cfg, registry)
    without = replace(registry, engines={k: v for k, v in registry.engines.items() if k != "server"})
    with pytest.raises(ConfigError, match=r"not installed: pip install plugrl-rollout-servers .*/rollout_servers"):
        check_engine(cfg, without)
    with pytest.raises(ConfigError, match="rollout.name=server is the engine of rollout.mode=server"):
        check_engine(load_config(tmp_path / "c.yaml", ["rollout.name=server"]), registry)


# --------------------------------------------------------------------------- training


@pytest.mark.slow
def test_training_with_two_started_servers_keeps_them_on_the_policy(tiny_model, tmp_path):
    """rollout.mode=server, 2 servers started by plugrl (HF engine): after each update both hold the new weights
    (the engine's log-probs equal the trainer's recomputed ones while the policy moves, lr 1e-3), each writes its
    log to the run directory, and both are stopped when the run ends."""
    m = _train_on_servers(tiny_model, tmp_path, ["rollout.servers=2"])
    assert [x["step"] for x in m] == [1, 2, 3]
    assert max(x["rollout_corr/logp_abs_diff_mean"] for x in m) < 1e-4
    logs = sorted((tmp_path / "e2e").glob("rollout_server_*.log"))
    assert [p.name for p in logs] == ["rollout_server_0.log", "rollout_server_1.log"]
    assert not [s for s in servers.running().values() if s.where == "rollout"]  # (the module's own server runs on)


@pytest.mark.slow  # ~60 s on 2 busy cores, as the test above; the pushes are tested above
def test_training_with_weights_over_a_collective_keeps_two_servers_on_the_policy(tiny_model, tmp_path):
    """rollout.weight_transport=collective with 2 started servers: one gloo group of the trainer and both, the
    weights broadcast after each update; the servers' log-probs equal the trainer's recomputed ones."""
    m = _train_on_servers(tiny_model, tmp_path, ["rollout.servers=2", "rollout.weight_transport=collective"])
    assert [x["step"] for x in m] == [1, 2, 3]
    assert max(x["rollout_corr/logp_abs_diff_mean"] for x in m) < 1e-4


@pytest.mark.slow
def test_a_vllm_server_takes_each_update_and_samples_the_trained_policy(tiny_model, tmp_path):
    """`plugrl rollout-serve` with vLLM (float32, in its own process) given as rollout.server_urls, the weights
    pushed through shared memory after every update, one tensor a piece (vLLM fuses q, k and v: loaded in two
    reload calls, the parts of a fused layer not in the first were uninitialised memory): the sampler's log-probs
    match the trainer's recomputed ones to float tolerance at every step while the policy moves, and the server
    counts the pushes (one at the start, one per step)."""
    server = _start(tiny_model, tmp_path, "rollout.name=vllm", "rollout.cpu_kv_cache_gb=0.25")
    url = f"http://127.0.0.1:{server.port}"
    try:
        settings = [
            f"rollout.server_urls=[{url}]",
            "rollout.weight_transport=shm",
            "rollout.weight_chunk_mb=1",  # every tensor a piece of its own: q, k and v of a layer apart
        ]
        m = _train_on_servers(tiny_model, tmp_path, settings)
        assert max(x["rollout_corr/logp_abs_diff_mean"] for x in m) < 1e-4, [
            x["rollout_corr/logp_abs_diff_mean"] for x in m
        ]
        health = json.loads(urllib.request.urlopen(url + "/health", timeout=10).read())
        assert health["engine"] == "vllm" and health["weights_version"] == 4
    finally:
        servers.stop(server.port)


@pytest.mark.slow  # ~150 s to start two vLLM CPU workers on 2 busy cores
def test_a_vllm_server_with_rollout_tp_2_takes_pushed_weights(tiny_model, tmp_path):
    """rollout-serve with rollout.tensor_model_parallel_size=2: vLLM runs the two shards in worker processes of its
    own (here its CPU workers, one core each: vLLM's CPU TP binds a worker per NUMA node unless told the cores), and
    every push reaches both as files. Greedy outputs change with noisy weights and come back with the originals."""
    import sys

    from safetensors.torch import load_file

    port = free_port()
    command = [sys.executable, "-m", "plugrl.cli", "rollout-serve", str(tiny_model), "rollout.name=vllm",
               "rollout.dtype=float32", "rollout.tensor_model_parallel_size=2", "rollout.cpu_kv_cache_gb=0.25",
               "--port", str(port), "--max-model-len", "256", "--device", "cpu"]  # fmt: skip
    server = servers.start_command(
        lambda: command,
        str(tiny_model),
        port,
        log_path=tmp_path / "tp2.log",
        timeout_s=600,
        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"},
    )
    try:
        engine = RemoteEngine([f"http://127.0.0.1:{port}"], calculate_log_probs=True, transport="shm")
        greedy, prompt = SamplingSettings(n=1, max_tokens=8, temperature=0.0), [[1, 2, 3, 4, 5]]
        weights = load_file(str(tiny_model / "model.safetensors"))
        before = engine.generate(prompt, greedy)[0][0].response_ids
        torch.manual_seed(0)
        engine.load_weights(iter({k: v + 0.5 * torch.randn_like(v) for k, v in weights.items()}.items()))
        noisy = engine.generate(prompt, greedy)[0][0].response_ids
        engine.load_weights(iter(weights.items()))
        assert noisy != before and engine.generate(prompt, greedy)[0][0].response_ids == before
        assert not list(Path("/dev/shm").glob(f"plugrl_server_{server.process.pid}_*")), "weight folders left"
    finally:
        servers.stop(server.port)
