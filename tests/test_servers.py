"""plugrl_model_servers, the managed local OpenAI-compatible server: its command line, start / health / restart / stop
(one server per port, bound to 127.0.0.1, its process group gone after stop), clear failures (exits, never
answers, port taken, another model on the port), waiting for another rank's server, and the parent-death signal.

vLLM itself is started by the slow tests of the plugins that launch it (tests/plugins/test_tinyv.py,
tests/plugins/test_judge.py); here a stand-in takes its place through ``servers.vllm_command``: the stand-in
OpenAI-compatible server of tests/stand_in_openai.py as a process, which answers ``GET /v1/models`` as vLLM does
and starts in well under a second where vLLM takes a minute, so every failure path can be shown."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time

import pytest

import plugrl_model_servers as servers
import stand_in_openai

HOST = "127.0.0.1"
WHERE = "reward.options.demo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def stand_in(monkeypatch) -> str:
    monkeypatch.setattr(servers, "vllm_command", stand_in_openai.vllm_command())
    monkeypatch.setattr(servers, "POLL_S", 0.05)
    yield stand_in_openai.SCRIPT
    servers.stop_all(grace_s=2)


@pytest.mark.parametrize("fast_bf16", [True, False])
def test_vllm_command_picks_the_dtype(monkeypatch, fast_bf16):
    """Without --dtype, a CPU-only machine without bf16 kernels serves float32 (vLLM's auto would serve the bf16
    checkpoint in bf16, 3.2x slower there); with bf16 kernels vLLM's auto stays; a --dtype of the user's wins.
    The CPU's bf16 support is substituted: one machine has one answer."""
    from plugrl import precision

    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: fast_bf16)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    cmd = servers.vllm_command("/m", "m", 8000, ["--enforce-eager"])
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--host") + 1] == HOST and cmd[cmd.index("--served-model-name") + 1] == "m"
    assert cmd[cmd.index("--port") + 1] == "8000" and cmd[-1] == "--enforce-eager"
    assert ("--dtype" in cmd) != fast_bf16
    if not fast_bf16:
        assert cmd[cmd.index("--dtype") + 1] == "float32"
    for given in (["--dtype", "bfloat16"], ["--dtype=half"]):
        cmd = servers.vllm_command("/m", "m", 8000, given)
        assert cmd[-len(given) :] == given and sum(a.startswith("--dtype") for a in cmd) == 1


def test_start_health_restart_stop(stand_in, tmp_path):
    port = free_port()
    log_path = tmp_path / "logs" / "server.log"
    server = servers.start("judge-model", port, log_path=log_path, timeout_s=30, where=WHERE)
    assert server.base_url == f"http://{HOST}:{port}/v1" and server.model == "judge-model"
    assert server.healthy() and servers.reachable(server.base_url)
    assert servers.served_context(server.base_url, "judge-model") == 2048
    assert servers.served_context(server.base_url, "other") is None
    assert servers.start("judge-model", port, where=WHERE) is server  # the same port again: the same server
    with pytest.raises(
        servers.ServerError,
        match=r"other\.base_url\): this process already serves .judge-model. there \(for reward\.options\.demo",
    ):
        servers.start("another-model", port, where="reward.options.other")

    # a crash: unhealthy; restart brings it back on the same port, same log
    server.process.kill()
    server.process.wait()
    assert not server.healthy()
    again = servers.restart(port, timeout_s=30)
    assert again is not server and again.healthy() and again.command == server.command
    assert servers.running() == {port: again}
    assert log_path.read_text().count("stand-in serving judge-model") == 2

    assert servers.stop(port, grace_s=2) is True
    assert again.process.poll() is not None and servers.group_members(again.process.pid) == []
    assert not servers.port_in_use(port) and not servers.reachable(again.base_url, timeout_s=0.5)
    assert servers.stop(port) is False and servers.running() == {}
    with pytest.raises(servers.ServerError, match="no server of this process runs on port"):
        servers.restart(port)


def test_stop_all_can_keep_other_callers_servers(stand_in, tmp_path):
    a = servers.start("a", free_port(), log_path=tmp_path / "a.log", where="reward.options.tinyv")
    b = servers.start("b", free_port(), log_path=tmp_path / "b.log", where="reward.options.judge")
    servers.stop_all(grace_s=2, where="reward.options.tinyv")
    assert not a.alive() and b.healthy()
    servers.stop_all(grace_s=2)
    assert not b.alive() and servers.running() == {}


def test_failures_are_clear(stand_in, monkeypatch, tmp_path):
    def crashing(model_path, served_name, port, args=()):
        return [sys.executable, "-c", "import sys; print('boom: no such model'); sys.exit(3)"]

    monkeypatch.setattr(servers, "vllm_command", crashing)
    with pytest.raises(servers.ServerError, match=r"(?s)exited with code 3.*boom: no such model"):
        servers.start("m", free_port(), log_path=tmp_path / "crash.log", timeout_s=30, where=WHERE)

    def silent(model_path, served_name, port, args=()):
        return [sys.executable, "-c", "import time; print('loading...', flush=True); time.sleep(600)"]

    monkeypatch.setattr(servers, "vllm_command", silent)
    with pytest.raises(servers.ServerError, match=r"(?s)did not answer .* within 1s.*loading\.\.\.") as e:
        servers.start("m", free_port(), timeout_s=1, where=WHERE)
    assert f"{WHERE}.launch_timeout_s" in str(e.value) and f"{WHERE}.launch_args" in str(e.value)
    assert servers.running() == {}  # the server that never answered was stopped

    with socket.create_server((HOST, 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(
            servers.ServerError, match=rf"{port} \({WHERE}\.base_url\) is already in use.*launch: false"
        ):
            servers.start("m", port, where=WHERE)


def test_other_ranks_wait_for_the_url(stand_in, tmp_path):
    port = free_port()
    with pytest.raises(servers.ServerError, match=rf"which rank 0 launches.*{WHERE}\.launch: false"):
        servers.wait_for_url(f"http://{HOST}:{port}/v1", 0.3, where=WHERE)
    server = servers.start("m", port, log_path=tmp_path / "s.log")
    servers.wait_for_url(server.base_url, 5, where=WHERE)  # answers: returns at once


def test_a_killed_trainer_takes_its_server_along(tmp_path):
    """SIGKILL leaves no chance to clean up: the parent-death signal stops the server."""
    script = stand_in_openai.SCRIPT
    trainer = tmp_path / "trainer.py"
    trainer.write_text(
        textwrap.dedent(
            f"""
            import sys, time
            import plugrl_model_servers as servers
            script = {str(script)!r}
            servers.vllm_command = lambda m, s, port, args=(): [sys.executable, script, "--port", str(port)]
            server = servers.start("m", {free_port()}, log_path={str(tmp_path / "s.log")!r}, timeout_s=60)
            print(server.process.pid, flush=True)
            time.sleep(600)
            """
        )
    )
    proc = subprocess.Popen([sys.executable, str(trainer)], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(proc.stdout.readline())
        assert servers.group_members(server_pid) == [server_pid]
        proc.kill()
        proc.wait()
        wait_until(lambda: servers.group_members(server_pid) == [], 20, "the server to stop after its parent died")
    finally:
        proc.kill()
        proc.stdout.close()


# --------------------------------------------------------------------------- a launched server's GPU and memory

GiB = 1 << 30


@pytest.fixture
def gpu_node(monkeypatch):
    """``node(training, free_gib)``: this process as rank 0 of ``training`` processes on a node of 8 80-GiB GPUs with
    ``free_gib`` free on each (torch.cuda's answers stand in: there is no GPU here)."""
    import torch

    from plugrl import placement

    def node(training: int, free_gib: float = 80.0) -> None:
        topo = placement.Topology(world_size=training, local_world_size=training, device_count=8)
        monkeypatch.setattr(placement.Topology, "from_env", classmethod(lambda cls, *a, **k: topo))
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (int(free_gib * GiB), 80 * GiB))

    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    return node


def _weights(folder, gib: float):
    """A model folder whose one weight file is ``gib`` GiB (sparse: no disk used)."""
    folder.mkdir()
    with open(folder / "model.safetensors", "wb") as f:
        f.truncate(int(gib * GiB))
    return str(folder)


def test_a_launched_server_takes_a_gpu_no_rank_trains_on_with_most_of_its_memory(gpu_node, stand_in, tmp_path):
    """7 training processes on 8 GPUs: the judge's server goes on GPU 7 with 0.9 of it; a second launched server
    shares GPU 7 with what is free there then (vLLM refuses more than the free share at start)."""
    gpu_node(7)
    first = servers.start("m", free_port(), log_path=tmp_path / "a.log", timeout_s=30, where=WHERE)
    assert first.env["CUDA_VISIBLE_DEVICES"] == "7" and first.gpus == ("7",)
    assert first.command[first.command.index("--gpu-memory-utilization") + 1] == "0.90"
    gpu_node(7, free_gib=8.0)
    second = servers.start("m2", free_port(), log_path=tmp_path / "b.log", timeout_s=30, where="reward.options.tinyv")
    assert second.gpus == ("7",)
    assert second.command[second.command.index("--gpu-memory-utilization") + 1] == "0.08"


def test_a_server_on_the_training_gpu_gets_what_its_model_needs_or_a_clear_refusal(gpu_node, tmp_path):
    gpu_node(8, free_gib=30.0)  # every GPU trains: the launching rank's own GPU 0
    env, args = servers.gpu_placement(_weights(tmp_path / "small", 1.0), [], WHERE)
    assert env == {"CUDA_VISIBLE_DEVICES": "0"} and args == ["--gpu-memory-utilization", "0.04"]  # (2 x 1 + 1) / 80
    with pytest.raises(servers.ServerError, match=rf"{WHERE}: the launched server needs ~31.0 GiB of GPU 0"):
        servers.gpu_placement(_weights(tmp_path / "big", 15.0), [], WHERE)
    # the user's own share wins, on the GPU plugrl picks
    assert servers.gpu_placement(_weights(tmp_path / "big2", 15.0), ["--gpu-memory-utilization=0.2"], WHERE) == (
        {"CUDA_VISIBLE_DEVICES": "0"},
        [],
    )
    with pytest.raises(servers.ServerError, match="size of its model is unknown"):
        servers.gpu_placement("no/such-model", [], WHERE)


def test_a_server_on_a_cpu_machine_gets_no_gpu_settings(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert servers.gpu_placement("/m", [], WHERE) == ({}, [])
