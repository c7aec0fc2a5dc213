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

from plugrl.dist import barrier, is_distributed

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


def _parts(policy, critic) -> dict[str, tuple]:
    """name -> (model, HF folder, optimizer file)."""
    parts = {"policy": (policy, "policy", "optimizer.pt")}
    if critic is not None:
        parts["critic"] = (critic, "critic", "critic_optimizer.pt")
    return parts


def save_checkpoint(
    run_dir: Path, step: int, policy, tokenizer, trainer_state: dict[str, Any], keep: int, rank: int, critic=None
) -> Path:
    """Write checkpoint ``step`` (a collective: every rank calls it). Returns its path."""
    root = run_dir / "checkpoints"
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp_{PREFIX}{step:06d}"
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    gathered = {
        name: (
            get_model_state_dict(m.model, options=opts),
            get_optimizer_state_dict(m.model, m.optimizer, options=opts),
        )
        for name, (m, _, _) in _parts(policy, critic).items()
    }
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
        state = dict(trainer_state, step=step)
        for name, (m, folder, optim_file) in _parts(policy, critic).items():
            model_sd, optim_sd = gathered[name]
            inner = getattr(m.model, "module", m.model)
            model_sd = _share_tied(inner, model_sd)
            inner.save_pretrained(tmp / folder, state_dict=model_sd, safe_serialization=True)
            torch.save(optim_sd, tmp / optim_file)
            state[f"{name}_scheduler"] = m.scheduler.state_dict()
        tokenizer.save_pretrained(tmp / "policy")
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    barrier()
    torch.save(rng_state(), tmp / "rng" / f"rank_{rank}.pt")
    barrier()
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
    barrier()
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

    Returns trainer_state."""
    state = json.loads((ckpt / "trainer_state.json").read_text())
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    for name, (m, folder, optim_file) in _parts(policy, critic).items():
        if not (ckpt / folder).is_dir():
            raise CheckpointError(f"checkpoint {ckpt} has no {folder}/: it was written by a run without a {name}")
        set_model_state_dict(m.model, _load_weights(ckpt / folder, m.model), options=opts)
        optim_sd = torch.load(ckpt / optim_file, map_location="cpu", weights_only=False)
        set_optimizer_state_dict(m.model, m.optimizer, optim_sd, options=opts)
        m.scheduler.load_state_dict(state[f"{name}_scheduler"])
    rng_file = ckpt / "rng" / f"rank_{rank}.pt"
    if rng_file.is_file():  # a resume with more ranks than before starts their RNG fresh
        set_rng_state(torch.load(rng_file, weights_only=False))
    if is_distributed():
        dist.barrier()
    return state
