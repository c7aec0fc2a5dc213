"""Checkpoints: the policy as HF safetensors, plus optimizer, LR schedule, RNG and data position.

Layout of ``RUN_DIR/checkpoints/step_000010/``::

    policy/            config.json, model.safetensors, tokenizer files (transformers and vLLM load it)
    policy_adapter/    instead of policy/ with actor.lora.r > 0: adapter_config.json, adapter_model.safetensors
                       (PEFT format: PeftModel.from_pretrained(base, folder) loads it) and the tokenizer files;
                       optimizer.pt then holds the adapters' state only
    optimizer.pt       full (unsharded) optimizer state: resumable with another world size
    critic/, critic_optimizer.pt   the value model, when the run has one
    critic_adapter/    instead of critic/ with critic.lora.r > 0: the critic's adapters and its value head as one
                       PEFT adapter (PeftModel.from_pretrained(AutoModelForTokenClassification base with
                       num_labels=1, folder) loads it); critic_optimizer.pt then holds their state only
    trainer_state.json step, data position, scheduler state
    rng/rank_K.pt      every rank's RNG states
    manifest.json      file sizes and sha256, written last

A checkpoint is written to a temporary directory and renamed into place, so a crash leaves the complete
checkpoint or none. A damaged one (it fails :func:`verify`) is never deleted automatically but set aside as
``checkpoints/damaged_step_000010`` (out of sight of resuming and ``trainer.max_checkpoints``), with a warning
naming what is wrong: by ``trainer.resume=auto``, which resumes from an older good one, and by the pruning of a
save (:func:`prune_checkpoints`). When every checkpoint of the run is damaged, ``auto`` stops with a
:class:`CheckpointError` instead of starting over (which would restart the run's metrics.jsonl).

At scale (7B-70B, 8 ranks a node) rank 0 alone touches the weights and optimizer files (each rank its own RNG
file): it writes, hashes and reads them one piece at a time (a model's weights, then its optimizer state),
broadcasting each tensor into the other ranks' shards on resume, so a host holds one full copy of a piece, not
one per rank. Meanwhile the others wait in :func:`plugrl.dist.host_barrier` (gloo), not in an NCCL collective
that the watchdog would time out.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path, PurePosixPath
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
DAMAGED = "damaged_"  # damaged_step_000010: a damaged checkpoint set aside (kept for the user, never deleted)
_DELETING = ".deleting_"  # a pruned checkpoint is renamed to this first, so a kill mid-delete leaves no half one
ROLLOUTS_AHEAD = "rollouts_ahead"  # trainer.off_policy_steps: the rollouts each rank generated for later steps


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


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _bad_name(rel: str) -> str | None:
    """Why ``rel`` (a file name in a manifest) is not a plain path inside the checkpoint, or None."""
    if not rel or "\x00" in rel:
        return "is empty or holds a NUL byte"
    if PurePosixPath(rel).is_absolute():
        return "is an absolute path"
    parts = rel.split("/")
    if ".." in parts:
        return "leaves the checkpoint directory (..)"
    if any(part in ("", ".") for part in parts):
        return "is not a plain relative path"
    return None


def _manifest_files(data: Any) -> tuple[dict[str, tuple[int, str]], str | None]:
    """``{file: (size, sha256)}`` of a parsed manifest.json, or what makes it not one plugrl writes."""
    if not isinstance(data, dict):
        return {}, f"it is {_kind(data)}, not an object with 'files'"
    if "files" not in data:
        return {}, "it has no 'files'"
    files = data["files"]
    if not isinstance(files, dict):
        return {}, f"'files' is {_kind(files)}, not an object of file name -> size and sha256"
    out: dict[str, tuple[int, str]] = {}
    for rel, meta in files.items():
        bad = _bad_name(rel)
        if bad:
            return {}, f"the file name {rel!r} {bad}"
        if not isinstance(meta, dict):
            return {}, f"the entry of {rel} is {_kind(meta)}, not an object with size and sha256"
        size, sha = meta.get("size"), meta.get("sha256")
        if type(size) is not int or size < 0:
            return {}, f"the entry of {rel} has no valid size (a byte count), got {size!r}"
        if not isinstance(sha, str) or len(sha) != 64 or not set(sha.lower()) <= set("0123456789abcdef"):
            return {}, f"the entry of {rel} has no valid sha256 (64 hex digits), got {sha!r}"
        out[rel] = (size, sha.lower())
    if "trainer_state.json" not in out:
        return {}, "'files' does not list trainer_state.json"
    return out, None


def verify(ckpt: Path) -> str | None:
    """None if ``ckpt`` matches its manifest, else what is wrong; a manifest.json plugrl would not write (e.g. a
    file name leaving the directory: nothing outside it is read) makes it damaged too. Every file's presence and
    size (a disk that filled up leaves files short) is checked before any byte is hashed."""
    if not ckpt.is_dir():
        return "no such checkpoint directory"
    manifest = ckpt / "manifest.json"
    if not manifest.is_file():
        return "no manifest.json (the write did not finish)"
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        return f"unreadable manifest.json ({e})"
    files, problem = _manifest_files(data)
    if problem:
        return f"manifest.json is not one plugrl writes: {problem}"
    try:
        root = ckpt.resolve()
        for rel, (size, _) in files.items():
            p = ckpt / rel
            if not p.resolve().is_relative_to(root):
                return f"{rel} points outside the checkpoint directory (a symlink)"
            if not p.is_file():
                return f"{rel} is missing"
            if p.stat().st_size != size:
                return f"{rel} has {p.stat().st_size} bytes, its manifest says {size} (cut short or changed)"
        for rel, (_, sha) in files.items():
            if _sha256(ckpt / rel) != sha:
                return f"{rel} does not match its checksum"
    except (OSError, RuntimeError) as e:  # an I/O error of a failing disk; a symlink loop
        return f"its files cannot be read ({type(e).__name__}: {e})"
    return None


def _scan(run_dir: Path) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest checkpoint that passes :func:`verify` (None: none does), and the damaged newer ones with their
    problems, newest first. Older checkpoints than the good one are not hashed."""
    damaged = []
    for ckpt in reversed(list_checkpoints(run_dir)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt, damaged
        damaged.append((ckpt, problem))
    return None, damaged


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest checkpoint that passes its manifest check; broken ones are skipped with a warning (and left
    where they are: the resume pick, :func:`resume_checkpoint`, sets them aside)."""
    good, damaged = _scan(run_dir)
    for ckpt, problem in damaged:
        log.warning("skipping checkpoint %s: %s; falling back to the previous one", ckpt, problem)
    return good


def set_aside(ckpt: Path, problem: str) -> Path:
    """Rename the damaged checkpoint ``ckpt`` to ``damaged_<name>`` beside it (``damaged_<name>.2``, ... when taken),
    out of :func:`list_checkpoints`' sight, with a warning naming it and ``problem``; never deleted (its files may
    still be recovered). Returns where it is now (``ckpt`` itself, with a warning, if it cannot be renamed)."""
    target = ckpt.with_name(DAMAGED + ckpt.name)
    n = 1
    while target.exists():
        n += 1
        target = ckpt.with_name(f"{DAMAGED}{ckpt.name}.{n}")
    try:
        os.rename(ckpt, target)
    except OSError as e:
        log.warning(
            "checkpoint %s is damaged (%s) and could not be set aside (%s); it is left in place", ckpt, problem, e
        )
        return ckpt
    log.warning(
        "checkpoint %s is damaged (%s): set aside as %s, not deleted (remove it yourself once it is of no use)",
        ckpt,
        problem,
        target,
    )
    return target


def _pick(run_dir: Path | None, mode: str) -> Path | None:
    """This process's answer for :func:`resume_checkpoint` (it hashes the files)."""
    if mode == "auto":
        if run_dir is None:
            raise ValueError("trainer.resume=auto needs the run dir")
        good, damaged = _scan(run_dir)
        if good is None and damaged:
            root = run_dir / "checkpoints"
            found = "; ".join(f"{ckpt.name}: {problem}" for ckpt, problem in damaged)
            raise CheckpointError(
                f"trainer.resume=auto: every checkpoint in {root} is damaged ({found}). Nothing was loaded, renamed "
                "or deleted: starting over from step 0 would restart this run's metrics.jsonl. To go on, repair or "
                "restore one, or name a good copy with trainer.resume=<path>; to start over, move the damaged ones "
                "out of that folder or set trainer.resume=disable (either restarts metrics.jsonl at step 1), or use "
                "another trainer.experiment_name"
            )
        for ckpt, problem in damaged:  # newer than the one resumed: out of the way of this run's saves
            set_aside(ckpt, f"{problem}; resuming from {good.name} instead")
        return good
    ckpt = Path(mode)
    problem = verify(ckpt)
    if problem:
        raise CheckpointError(f"trainer.resume={mode!r}: checkpoint {ckpt} is unusable: {problem}")
    return ckpt


def resume_checkpoint(run_dir: Path | None, mode: str) -> Path | None:
    """The checkpoint that ``trainer.resume=mode`` continues from, the same on every rank; None: start fresh.

    ``auto``: the newest one in ``run_dir/checkpoints`` that passes :func:`verify` (newer damaged ones set aside;
    a CheckpointError naming them when every one is damaged); a path: that checkpoint, or a CheckpointError naming
    what is wrong (``run_dir`` may then be None); ``disable``: None. A collective under torchrun: rank 0 alone
    hashes the files while the others wait in :func:`host_barrier`."""
    if mode == "disable":
        return None
    if not is_distributed():
        return _pick(run_dir, mode)
    answer, error = None, None
    if dist.get_rank() == 0:
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


ADAPTER_FOLDER = "policy_adapter"  # a LoRA policy's adapter (PEFT format), instead of policy/
CRITIC_ADAPTER_FOLDER = "critic_adapter"  # a LoRA critic's adapter and value head (PEFT format), instead of critic/
# part -> (its folder with full weights, its folder with a LoRA adapter, the config key that decides)
_FOLDERS = {
    "policy": ("policy", ADAPTER_FOLDER, "actor.lora"),
    "critic": ("critic", CRITIC_ADAPTER_FOLDER, "critic.lora"),
}


def _has_lora(m) -> bool:
    return getattr(m, "lora", None) is not None


def _parts(policy, critic) -> dict[str, tuple]:
    """name -> (model, HF folder, optimizer file)."""
    models = {"policy": (policy, "optimizer.pt"), "critic": (critic, "critic_optimizer.pt")}
    return {
        name: (m, _FOLDERS[name][1] if _has_lora(m) else _FOLDERS[name][0], optim_file)
        for name, (m, optim_file) in models.items()
        if m is not None
    }


def save_checkpoint(
    run_dir: Path,
    step: int,
    policy,
    tokenizer,
    trainer_state: dict[str, Any],
    keep: int,
    rank: int,
    critic=None,
    rollouts_ahead: list | None = None,
) -> Path:
    """Write checkpoint ``step`` and return its path; a collective: rank 0 writes, hashes and renames while the
    others wait in :func:`host_barrier`. ``rollouts_ahead``: this rank's rollouts generated for later steps
    (``trainer.off_policy_steps``), written to ``rollouts_ahead/rank_N.pt`` when there are any."""
    root = run_dir / "checkpoints"
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp_{PREFIX}{step:06d}"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "rng").mkdir(parents=True)
    state = dict(trainer_state, step=step)
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    # one piece at a time (module doc); gathering is a collective, writing rank 0's alone: the others wait in
    # host_barrier, so no NCCL collective is held open while rank 0 writes (minutes at 70B)
    for name, (m, folder, optim_file) in _parts(policy, critic).items():
        if _has_lora(m):  # the adapter alone (the frozen base is model.path): every rank gathers, rank 0 writes
            adapter = m.adapters.state(m.device)
            if rank == 0:
                m.adapters.save(adapter, tmp / folder)
            del adapter
        else:
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
        tokenizer.save_pretrained(tmp / _parts(policy, None)["policy"][1])
        (tmp / "trainer_state.json").write_text(json.dumps(state, indent=2))
    torch.save(rng_state(), tmp / "rng" / f"rank_{rank}.pt")
    if rollouts_ahead:
        (tmp / ROLLOUTS_AHEAD).mkdir(exist_ok=True)
        torch.save(rollouts_ahead, tmp / ROLLOUTS_AHEAD / f"rank_{rank}.pt")
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
        if final.exists():  # a step written again (a resume from an older checkpoint): a damaged one is kept
            problem = verify(final)
            if problem:
                set_aside(final, f"{problem}; step {step} was written again")
            else:
                _delete(final)
        os.replace(tmp, final)
        prune_checkpoints(run_dir, keep, written=final)
    host_barrier()  # rank 0 hashes, fsyncs, renames and prunes
    return final


def _delete(ckpt: Path) -> None:
    """Renamed first, then removed: a kill meanwhile leaves a ``.deleting_`` folder (removed by the next prune),
    never a half-deleted checkpoint that would look damaged."""
    trash = ckpt.with_name(_DELETING + ckpt.name)
    shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(ckpt, trash)
    except OSError:
        trash = ckpt
    shutil.rmtree(trash, ignore_errors=True)


def prune_checkpoints(run_dir: Path, keep: int, written: Path | None = None) -> list[Path]:
    """Keep the newest ``keep`` good checkpoints, delete the older ones, set damaged ones aside. Returns the deleted.

    ``written`` (the checkpoint just written) is always kept and counts as good unhashed. The others are checked
    with :func:`verify` newest first until ``keep`` good ones are found; every older one is deleted unhashed
    (surplus, damaged or not). A damaged one met on the way is set aside, never deleted, and does not count: with
    fewer than ``keep`` good ones nothing is deleted, so the only good checkpoint is never lost.

    Cost: past ``keep`` checkpoints, ``keep - 1`` earlier ones are hashed per save (``max_checkpoints=1``: none).
    At about 12 bytes per parameter (fp32 weights, AdamW's two moments: ~84 GB at 7B, ~840 GB at 70B) that is 1-2
    or 7-14 minutes at 1-2 GB/s on rank 0 while the others wait in :func:`host_barrier` (trainer.dist_timeout_s):
    the price of never deleting the last good checkpoint on a disk that corrupts what it stores."""
    root = run_dir / "checkpoints"
    if root.is_dir():
        for leftover in root.glob(_DELETING + "*"):  # a delete that a kill interrupted
            shutil.rmtree(leftover, ignore_errors=True)
    ckpts = list_checkpoints(run_dir)
    if len(ckpts) <= keep:
        return []
    good = 1 if written in ckpts else 0
    deleted = []
    for ckpt in reversed(ckpts):  # newest first
        if ckpt == written:
            continue
        if good >= keep:
            _delete(ckpt)
            deleted.append(ckpt)
            continue
        problem = verify(ckpt)
        if problem is None:
            good += 1
        else:
            set_aside(ckpt, f"{problem}; found while keeping the newest {keep} good checkpoints")
    return deleted


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
    """Restore weights, optimizers and schedulers (policy, and critic if given) and this rank's RNG; returns
    trainer_state. A collective under torchrun: rank 0 alone reads the files (the optimizer memory-mapped) and
    broadcasts them tensor by tensor into every rank's shards."""
    state = json.loads((ckpt / "trainer_state.json").read_text())
    for name, (m, folder, optim_file) in _parts(policy, critic).items():
        if not (ckpt / folder).is_dir():
            _refuse_other_kind(ckpt, name, folder)
            raise CheckpointError(f"checkpoint {ckpt} has no {folder}/: it was written by a run without a {name}")
        _load_part(ckpt, m, folder, optim_file)
        m.scheduler.load_state_dict(state[f"{name}_scheduler"])
    rng_file = ckpt / "rng" / f"rank_{rank}.pt"
    if rng_file.is_file():  # a resume with more ranks than before starts their RNG fresh
        set_rng_state(torch.load(rng_file, weights_only=False))
    barrier()
    return state


def load_rollouts_ahead(ckpt: Path, rank: int, world_size: int) -> list:
    """This rank's rollouts generated ahead in ``ckpt`` (:func:`save_checkpoint`), [] when it holds none.
    Raises CheckpointError when they were written by another number of ranks (each rank's are its share of
    the data)."""
    folder = ckpt / ROLLOUTS_AHEAD
    if not folder.is_dir():
        return []
    written = len(list(folder.glob("rank_*.pt")))
    if written != world_size:
        raise CheckpointError(
            f"checkpoint {ckpt} holds rollouts generated ahead (trainer.off_policy_steps) by {written} ranks, but "
            f"this run has {world_size}: each rank's are its share of the data; resume with {written} processes, "
            "or from a checkpoint of an on-policy run"
        )
    return torch.load(folder / f"rank_{rank}.pt", weights_only=False)


def _refuse_other_kind(ckpt: Path, name: str, folder: str) -> None:
    """A CheckpointError when ``ckpt`` holds the policy or the critic the other way (a LoRA adapter for a full
    fine-tuning run, or full weights for a LoRA run)."""
    full, adapter, key = _FOLDERS[name]
    other = adapter if folder == full else full
    if (ckpt / other).is_dir():
        held, wanted = ("a LoRA adapter", "full fine-tuning") if other == adapter else ("full weights", "LoRA")
        raise CheckpointError(
            f"checkpoint {ckpt} holds {held} ({other}/) but this run does {wanted} ({key}.r): resume with "
            f"the {key} settings of the run that wrote it, or start a new run (another trainer.experiment_name)"
        )


def _load_part(ckpt: Path, m, folder: str, optim_file: str) -> None:
    """One model's weights and optimizer state; under torchrun rank 0's read is broadcast into every rank's shards
    (FSDP2 and tensor-parallel DTensors alike)."""
    shared = is_distributed()
    # a LoRA model loads its adapters alone (not strict): the base weights stay as model.path loaded them
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=shared, strict=not _has_lora(m))
    main = not shared or dist.get_rank() == 0  # torch broadcasts from global rank 0
    if _has_lora(m):
        try:
            weights = m.adapters.load(ckpt / folder, key=f"{m.metric_prefix}.lora") if main else {}
        except ValueError as e:
            raise CheckpointError(str(e)) from e
    else:
        weights = _load_weights(ckpt / folder, m.model) if main else {}
    host_barrier()  # the others wait over gloo while rank 0 reads the file (minutes at 70B)
    set_model_state_dict(m.model, weights, options=opts)
    del weights
    # memory-mapped: the page cache, not rank 0's heap, holds the full optimizer state (8 bytes a parameter)
    optim_sd = torch.load(ckpt / optim_file, map_location="cpu", weights_only=False, mmap=True) if main else {}
    host_barrier()
    set_optimizer_state_dict(m.model, m.optimizer, optim_sd, options=opts)
