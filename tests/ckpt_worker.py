"""Run by tests/test_checkpoint_scale.py under torchrun (gloo): checkpoints written, checked and read by a sharded
policy (FSDP2, or tensor parallelism over TP_SIZE ranks), recording on each rank what touched the files.

``ckpt_worker.py MODEL RUN_DIR OUT_DIR``: one update, checkpoint 1; another update, checkpoint 2; rank 0 flips a
byte of checkpoint 2's weights; the checkpoint to resume named as checkpoint 2, then picked with trainer.resume=auto
(which sets checkpoint 2 aside); a third update, then checkpoint 1 loaded. Each rank writes OUT_DIR/rank_K.pt:
which torch barriers it entered during the writes (default group or plugrl's gloo host group), how many files it
hashed for each pick and what it got, which checkpoint files it read, and the full weights and optimizer state
after the load.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import safetensors.torch
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from dp_worker import global_batch
from plugrl import checkpoint
from plugrl import dist as pdist
from plugrl.actor import PolicyModel
from plugrl.config import ActorConfig, ModelConfig
from plugrl.dist import exit_worker, init_distributed


class Recorder:
    """Wraps torch.distributed.barrier, plugrl.checkpoint._sha256, safetensors' load_file and torch.load."""

    def __init__(self):
        self.barriers: list[str] = []
        self.hashed: list[str] = []
        self.reads: list[str] = []
        barrier, sha, load_file, load = dist.barrier, checkpoint._sha256, safetensors.torch.load_file, torch.load

        def recorded_barrier(*args, group=None, **kwargs):
            if group is None or group is dist.group.WORLD:
                self.barriers.append("default")
            elif pdist._host_group.cache_info().currsize and group is pdist._host_group():  # made, not making it
                self.barriers.append("host")
            else:
                self.barriers.append("other")
            return barrier(*args, group=group, **kwargs)

        def recorded_sha(path):
            self.hashed.append(Path(path).name)
            return sha(path)

        def recorded_load_file(path, *args, **kwargs):
            self.reads.append(Path(path).name)
            return load_file(path, *args, **kwargs)

        def recorded_load(f, *args, **kwargs):
            if isinstance(f, (str, os.PathLike)):  # not the buffers of broadcast_object_list
                self.reads.append(Path(f).name)
            return load(f, *args, **kwargs)

        dist.barrier = recorded_barrier
        checkpoint._sha256 = recorded_sha
        safetensors.torch.load_file = recorded_load_file
        torch.load = recorded_load

    def take(self, name: str) -> list[str]:
        """What was recorded in ``name`` since the last take."""
        values = getattr(self, name)
        out = list(values)
        values.clear()
        return out


def pick(run_dir: Path, mode: str, rank: int) -> tuple[str | None, str | None]:
    """(checkpoint name or None, None) or (None, the CheckpointError's message)."""
    try:
        ckpt = checkpoint.resume_checkpoint(run_dir, mode)
    except checkpoint.CheckpointError as e:
        return None, str(e)
    return (ckpt.name if ckpt else None), None


def main(model: str, run_dir: str, out_dir: str) -> None:
    info = init_distributed("cpu", tp_size=int(os.environ.get("TP_SIZE", "1")))
    run_dir = Path(run_dir)
    batch = global_batch()
    share = len(batch) // info.dp_size
    local = batch.select(list(range(info.dp_rank * share, (info.dp_rank + 1) * share)))
    actor = ActorConfig(tp_size=info.tp_size, optim={"lr": 1e-3, "eps": 1e-6}, ppo_max_token_len_per_gpu=24)
    policy = PolicyModel(model, ModelConfig(path=model), actor, info.device)
    tokenizer = type("Tok", (), {"save_pretrained": lambda self, path: None})()
    rec = Recorder()
    report: dict = {"rank": info.rank}

    def update():
        policy.update(local, num_mini_batches=1, temperature=1.0, norm_length=16)  # steps the LR schedule too

    rec.take("barriers")
    for step in (1, 2):
        update()
        checkpoint.save_checkpoint(run_dir, step, policy, tokenizer, {"data": {}}, keep=3, rank=info.rank)
        report[f"save_{step}_barriers"] = rec.take("barriers")
    report["save_hashed"] = rec.take("hashed")

    if info.rank == 0:  # one flipped byte in checkpoint 2's weights: same size, wrong sha256
        weights = run_dir / "checkpoints" / "step_000002" / "policy" / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    pdist.host_barrier()
    rec.take("barriers")
    # named first: the auto pick then sets the damaged checkpoint 2 aside (renamed to damaged_step_000002)
    report["named"] = pick(run_dir, str(run_dir / "checkpoints" / "step_000002"), info.rank)
    report["named_hashed"] = rec.take("hashed")
    report["auto"] = pick(run_dir, "auto", info.rank)
    report["auto_hashed"] = rec.take("hashed")
    report["after_auto"] = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    report["pick_barriers"] = rec.take("barriers")

    update()  # weights and optimizer state move away from checkpoint 1's
    before = dict(policy.named_full_parameters())
    rec.take("reads")
    rec.take("barriers")
    state = checkpoint.load_checkpoint(run_dir / "checkpoints" / "step_000001", policy, info.rank)
    report["load_reads"] = rec.take("reads")
    report["load_barriers"] = rec.take("barriers")
    report["step"] = state["step"]
    report["lr"] = policy.scheduler.get_last_lr()
    report["weights"] = dict(policy.named_full_parameters())
    report["load_changed_weights"] = any(not torch.equal(before[k], w) for k, w in report["weights"].items())
    report["optimizer"] = get_optimizer_state_dict(
        policy.model, policy.optimizer, options=StateDictOptions(full_state_dict=True)
    )
    torch.save(report, Path(out_dir) / f"rank_{info.rank}.pt")
    exit_worker()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
