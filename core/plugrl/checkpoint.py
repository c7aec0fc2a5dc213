"""Checkpoints: the policy as HF safetensors, plus optimizer, LR schedule, RNG and data position.

Layout of ``RUN_DIR/checkpoints/step_000010/``::

    policy/            config.json, model.safetensors, tokenizer files (transformers and vLLM load it)
    optimizer.pt       full (unsharded) optimizer state: resumable with another world size
    critic/, critic_optimizer.pt   the value model, when the run has one
    trainer_state.json step, data position, scheduler state
    rng/rank_K.pt      every rank's RNG states
    manifest.json      file sizes and sha256, written last

A checkpoint is written to a temporary directory and renamed into place, so a
crash leaves either the complete checkpoint or none; one that fails its manifest
check is skipped with a warning and the previous one is used.

At scale (7B-70B, 8 ranks a node) rank 0 alone touches the weights and optimizer files (each rank
writes and reads only its own RNG file): it writes them one piece at a time (a model's weights, then its
optimizer state), hashes them (:func:`resume_checkpoint`), and reads them on resume, broadcasting each
tensor into the other ranks' shards, so a host holds one full copy of a piece, not one per rank. While
rank 0 works on files the others wait in :func:`plugrl.dist.host_barrier` (gloo), not in an NCCL
collective that the watchdog would time out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from plugrl.dist import barrier, broadcast_object, host_barrier, is_distributed

log = logging.getLogger("plugrl.checkpoint")
PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint named for resuming cannot be used."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def list_checkpoints(run_dir: Path) -> list[Path]:
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def verify(ckpt: Path) -> str | None:
    """None if ``ckpt`` matches its manifest, else what is wrong."""
    manifest = ckpt / "manifest.json"
    if not manifest.is_file():
        return "no manifest.json (the write did not finish)"
    try:
        files = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError) as e:
        return f"unreadable manifest.json ({e})"
    for rel, meta in files.items():
        p = ckpt / rel
        if not p.is_file():
            return f"{rel} is missing"
        if p.stat().st_size != meta["size"] or _sha256(p) != meta["sha256"]:
            return f"{rel} does not match its checksum"
    return None


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that passes its manifest check; broken ones are skipped with a warning."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt
        log.warning("skipping checkpoint %s: %s; falling back to the previous one", ckpt, problem)
    return None


def _pick(run_dir: Path | None, mode: str) -> Path | None:
    """This process's answer for :func:`resume_checkpoint` (it hashes the files)."""
    if mode == "auto":
        if run_dir is None:
            raise ValueError("trainer.resume=auto needs the run dir")
        return latest_checkpoint(run_dir)
    ckpt = Path(mode)
    problem = verify(ckpt)
    if problem:
        raise CheckpointError(f"trainer.resume={mode!r}: checkpoint {ckpt} is unusable: {problem}")
    return ckpt


def resume_checkpoint(run_dir: Path | None, mode: str, rank: int | None = None) -> Path | None:
    """The checkpoint that ``trainer.resume=mode`` continues from, the same on every rank; None: start fresh.

    ``auto``: the newest one in ``run_dir/checkpoints`` that passes its manifest check (broken ones skipped
    with a warning); a path: that checkpoint, or a CheckpointError naming it and what is wrong (``run_dir``
    may then be None); ``disable``: None. A collective under torchrun: rank 0 alone reads and hashes the
    files while the others wait in :func:`host_barrier`, then every rank gets its answer, or raises its
    CheckpointError. ``rank``: this process's rank (default: its rank in the process group, 0 alone)."""
    if mode == "disable":
        return None
    if not is_distributed():
        return _pick(run_dir, mode)
    if rank is None:
        rank = dist.get_rank()
    answer, error = None, None
    if rank == 0:
        try:
            ckpt = _pick(run_dir, mode)
            answer = ("ok", None if ckpt is None else str(ckpt))
        except CheckpointError as e:
            error, answer = e, ("unusable", str(e))
        except Exception as e:  # the others must not wait for an answer that never comes
            error, answer = e, ("failed", f"{type(e).__name__}: {e}")
    host_barrier()  # rank 0 hashes multi-GB files once for all ranks; the rest wait over gloo meanwhile
    kind, value = broadcast_object(answer)
    if error is not None:
        raise error
    if kind == "unusable":
        raise CheckpointError(value)
    if kind == "failed":
        raise CheckpointError(f"trainer.resume={mode!r}: rank 0 could not check the checkpoint: {value}")
    return None if value is None else Path(value)


def _parts(policy, critic) -> dict[str, tuple]:
    """name -> (model, HF folder, optimizer file)."""
    parts = {"policy": (policy, "policy", "optimizer.pt")}
    if critic is not None:
        parts["critic"] = (critic, "critic", "critic_optimizer.pt")
    return parts


def save_checkpoint(
    run_dir: Path, step: int, policy, tokenizer, trainer_state: dict[str, Any], keep: int, rank: int, critic=None
) -> Path:
    """Write checkpoint ``step`` (a collective: every rank calls it). Returns its path.

    Rank 0 writes the files; the other ranks wait for it (and for its hashing, fsync and rename) in
    :func:`host_barrier`."""
    root = run_dir / "checkpoints"
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp_{PREFIX}{step:06d}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    state = dict(trainer_state, step=step)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # one piece at a time (these weights, then this optimizer state): rank 0's host holds one full copy, not
    # every model's and optimizer's at once. Gathering is a collective, writing rank 0's alone: between them
    # the others wait in host_barrier, so no NCCL collective is held open while rank 0 writes (minutes at 70B)
    for name, (m, folder, optim_file) in _parts(policy, critic).items():
        model_sd = get_model_state_dict(m.model, options=opts)  # full tensors on rank 0, {} elsewhere
        if rank == 0:
            inner = getattr(m.model, "module", m.model)
            inner.save_pretrained(tmp / folder, state_dict=_share_tied(inner, model_sd), safe_serialization=True)
        del model_sd
        host_barrier()
        optim_sd = get_optimizer_state_dict(m.model, m.optimizer, options=opts)
        if rank == 0:
            torch.save(optim_sd, tmp / optim_file)
        del optim_sd
        host_barrier()
        state[f"{name}_scheduler"] = m.scheduler.state_dict()
    if rank == 0:
        tokenizer.save_pretrained(tmp / "policy")
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    torch.save(rng_state(), tmp / "rng" / f"rank_{rank}.pt")
    host_barrier()
    # fault injection for the crash tests: hold the half-written checkpoint open for a while
    time.sleep(float(os.environ.get("PLUGRL_TEST_CHECKPOINT_PAUSE_S", "0")))
    if rank == 0:
        files = {
            str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        (tmp / "manifest.json").write_text(json.dumps({"step": step, "files": files}, indent=2))
        _fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        for old in list_checkpoints(run_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    host_barrier()  # rank 0 hashes, fsyncs and renames
    return final


def _share_tied(model, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Names of one shared parameter (tied embeddings) point to one tensor, so it is saved once: a
    tensor-parallel gather returns a copy per name."""
    first: dict[int, str] = {}
    out = dict(state_dict)
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first and name in out and first[id(p)] in out:
            out[name] = out[first[id(p)]]
        first.setdefault(id(p), name)
    return out


def _load_weights(folder: Path, model) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    weights: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(f))
    for name in set(model.state_dict()) - set(weights):  # tied weights are saved once
        if name.endswith("lm_head.weight") and "model.embed_tokens.weight" in weights:
            weights[name] = weights["model.embed_tokens.weight"]
    return weights


def load_checkpoint(ckpt: Path, policy, rank: int, critic=None) -> dict[str, Any]:
    """Restore weights, optimizers and schedulers (policy, and critic if given) and this rank's RNG.

    A collective under torchrun: rank 0 alone reads the weights and optimizer files (one full copy in host
    memory, the optimizer memory-mapped) and broadcasts them tensor by tensor into every rank's shards; the
    others pass empty dicts. Alone, the files are loaded as they are. Returns trainer_state."""
    state = json.loads((ckpt / "trainer_state.json").read_text())
    for name, (m, folder, optim_file) in _parts(policy, critic).items():
        if not (ckpt / folder).is_dir():
            raise CheckpointError(f"checkpoint {ckpt} has no {folder}/: it was written by a run without a {name}")
        if is_distributed():
            _broadcast_part(ckpt, m, folder, optim_file)
        else:
            opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
            set_model_state_dict(m.model, _load_weights(ckpt / folder, m.model), options=opts)
            optim_sd = torch.load(ckpt / optim_file, map_location="cpu", weights_only=False)
            set_optimizer_state_dict(m.model, m.optimizer, optim_sd, options=opts)
        m.scheduler.load_state_dict(state[f"{name}_scheduler"])
    rng_file = ckpt / "rng" / f"rank_{rank}.pt"
    if rng_file.is_file():  # a resume with more ranks than before starts their RNG fresh
        set_rng_state(torch.load(rng_file, weights_only=False))
    barrier()
    return state


def _broadcast_part(ckpt: Path, m, folder: str, optim_file: str) -> None:
    """One model's weights and optimizer state from rank 0's files into every rank's shards (FSDP2 and
    tensor-parallel DTensors alike: each rank keeps its slice of every broadcast tensor)."""
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    main = dist.get_rank() == 0  # torch broadcasts from global rank 0
    weights = _load_weights(ckpt / folder, m.model) if main else {}
    host_barrier()  # the others wait over gloo while rank 0 reads the file (minutes at 70B)
    set_model_state_dict(m.model, weights, options=opts)
    del weights
    # memory-mapped: the page cache, not rank 0's heap, holds the full optimizer state (8 bytes a parameter)
    optim_sd = torch.load(ckpt / optim_file, map_location="cpu", weights_only=False, mmap=True) if main else {}
    host_barrier()
    set_optimizer_state_dict(m.model, m.optimizer, optim_sd, options=opts)
