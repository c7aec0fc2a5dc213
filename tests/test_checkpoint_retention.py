"""Checkpoints are never lost (issue 23, point 1): pruning to ``trainer.max_checkpoints`` keeps the newest *good*
checkpoints, damaged ones are set aside as ``damaged_step_N`` (never deleted), a manifest.json of the wrong shape
or naming files outside the checkpoint is "damaged" with a reason, and ``trainer.resume=auto`` with every
checkpoint damaged stops with an error instead of starting over on top of the run's metrics."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch

from plugrl import checkpoint
from test_actor import _policy
from test_e2e import ROOT, tiny_overrides


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative name -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _flip(path: Path) -> None:
    """One flipped byte in the middle: same size, wrong sha256."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _cut(path: Path) -> None:
    """The file cut to half its size, as a full disk leaves it."""
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


PLUGRL_MANIFEST = object()


def _made(run_dir: Path, step: int, files: dict[str, bytes] | None = None, manifest=PLUGRL_MANIFEST) -> Path:
    """A hand-made checkpoint with plugrl's manifest of its files, or ``manifest`` (an object, or raw text)."""
    ckpt = run_dir / "checkpoints" / f"step_{step:06d}"
    if files is None:
        files = {"trainer_state.json": json.dumps({"step": step}).encode(), "policy/model.safetensors": b"w" * 64}
    for rel, data in files.items():
        (ckpt / rel).parent.mkdir(parents=True, exist_ok=True)
        (ckpt / rel).write_bytes(data)
    if manifest is PLUGRL_MANIFEST:
        entries = {rel: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for rel, data in files.items()}
        manifest = {"step": step, "files": entries}
    ckpt.mkdir(parents=True, exist_ok=True)
    (ckpt / "manifest.json").write_bytes(manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode())
    return ckpt


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "plugrl.checkpoint" and r.levelno >= logging.WARNING]


def _hashed(monkeypatch) -> list[str]:
    """The files checkpoint._sha256 reads from now on (their paths)."""
    seen: list[str] = []
    sha = checkpoint._sha256

    def recorded(path):
        seen.append(str(path))
        return sha(path)

    monkeypatch.setattr(checkpoint, "_sha256", recorded)
    return seen


def test_every_checkpoint_damaged_stops_resume_auto_and_keeps_history(tiny_model, tmp_path, capsys):
    """A run dir with metrics for steps 1-2 and both its checkpoints damaged: step 2 has a flipped byte, step 1's
    optimizer.pt is cut short. `plugrl train` with trainer.resume=auto exits 2 with an error naming both, what is
    wrong with each and how to go on, before anything is written: metrics.jsonl and the checkpoints (files and
    names) are as they were, no step ran. The old code started from step 0 and rewrote metrics.jsonl."""
    from plugrl import cli

    run_dir = tmp_path / "e2e"  # tiny_overrides' run dir
    root = run_dir / "checkpoints"
    for step in (1, 2):
        files = {
            "trainer_state.json": json.dumps({"step": step}).encode(),
            "policy/model.safetensors": bytes(range(256)) * 4,
            "optimizer.pt": b"o" * 1000,
        }
        _made(run_dir, step, files)
    _flip(root / "step_000002" / "policy" / "model.safetensors")
    _cut(root / "step_000001" / "optimizer.pt")
    history = b"".join(json.dumps({"step": s, "reward/mean": 0.5}).encode() + b"\n" for s in (1, 2))
    (run_dir / "metrics.jsonl").write_bytes(history)
    before = _tree(run_dir)

    args = ["train", str(ROOT / "examples/countdown_grpo.yaml"), *tiny_overrides(tiny_model, tmp_path, 3)]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"plugrl: error: trainer.resume=auto: every checkpoint in {root} is damaged" in err, err[-3000:]
    assert "step_000002: policy/model.safetensors does not match its checksum" in err
    assert "step_000001: optimizer.pt has 500 bytes, its manifest says 1000" in err
    assert "metrics.jsonl" in err and "trainer.resume=disable" in err and "trainer.resume=<path>" in err
    assert (run_dir / "metrics.jsonl").read_bytes() == history, "the metrics history was rewritten"
    assert _tree(run_dir) == before, "a file of the run dir was changed, added, renamed or deleted"


def test_pruning_keeps_the_newest_good_checkpoints_and_sets_damaged_ones_aside(
    tiny_model, smol_tokenizer, tmp_path, caplog, monkeypatch
):
    """Real saves with max_checkpoints 2: steps 1-3 written (keep 3), then step 2's weights get a flipped byte and
    step 3's optimizer.pt is cut short (a full disk). Saving step 4 keeps steps 1 and 4 (the old code kept the
    damaged 3 and deleted 1, the last good one before 4); 2 and 3 are set aside, files intact, with a warning
    each. With step 4 damaged as well, resume=auto still finds step 1 and loads its weights. Cost: a save hashes
    only its own files while there are at most 2 checkpoints, and its own plus the previous one's after that
    (step 1 is deleted unhashed); a `.deleting_` leftover of an interrupted delete is removed."""
    policy = _policy(tiny_model)
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    param = policy.model.model.layers[0].mlp.down_proj.weight
    saved = {}

    def save(step: int, keep: int) -> Path:
        with torch.no_grad():
            param.add_(0.01 * step)  # each checkpoint holds different weights
        saved[step] = param.detach().clone()
        return checkpoint.save_checkpoint(run_dir, step, policy, smol_tokenizer, {"data": {}}, keep=keep, rank=0)

    for step in (1, 2, 3):
        save(step, keep=3)
    _flip(root / "step_000002" / "policy" / "model.safetensors")
    _cut(root / "step_000003" / "optimizer.pt")
    damaged = {name: _tree(root / name) for name in ("step_000002", "step_000003")}

    caplog.set_level(logging.WARNING, logger="plugrl.checkpoint")
    save(4, keep=2)
    assert [p.name for p in checkpoint.list_checkpoints(run_dir)] == ["step_000001", "step_000004"]
    assert sorted(p.name for p in root.iterdir()) == [
        "damaged_step_000002",
        "damaged_step_000003",
        "step_000001",
        "step_000004",
    ]
    for name, files in damaged.items():
        assert _tree(root / f"damaged_{name}") == files, f"{name} was not set aside intact"
    warned = _warnings(caplog)
    assert len(warned) == 2, warned
    assert str(root / "step_000003") in warned[0] and "optimizer.pt has" in warned[0] and "set aside" in warned[0]
    assert str(root / "step_000002") in warned[1] and "does not match its checksum" in warned[1]
    assert all(checkpoint.verify(p) is None for p in checkpoint.list_checkpoints(run_dir))

    # the newest one damaged too: step 1, kept by the pruning, is what a resume gets, and it loads
    _flip(root / "step_000004" / "policy" / "model.safetensors")
    assert checkpoint.resume_checkpoint(run_dir, "auto") == root / "step_000001"
    assert (root / "damaged_step_000004").is_dir() and not (root / "step_000004").exists()
    assert checkpoint.load_checkpoint(root / "step_000001", policy, rank=0)["step"] == 1
    assert torch.equal(param, saved[1])

    # the cost: step 5 (2 checkpoints then) hashes only its own files; step 6 its own and step 5's, not step 1's
    hashed = _hashed(monkeypatch)
    save(5, keep=2)
    assert hashed and all("/.tmp_step_000005/" in h for h in hashed), hashed
    hashed.clear()
    (root / ".deleting_step_000000" / "policy").mkdir(parents=True)  # a delete that a kill interrupted
    save(6, keep=2)
    assert {Path(h).parent.relative_to(root).parts[0] for h in hashed} == {".tmp_step_000006", "step_000005"}
    assert [p.name for p in checkpoint.list_checkpoints(run_dir)] == ["step_000005", "step_000006"]
    assert sorted(p.name for p in root.iterdir()) == [
        "damaged_step_000002",
        "damaged_step_000003",
        "damaged_step_000004",
        "step_000005",
        "step_000006",
    ]


def test_a_step_written_again_sets_its_damaged_checkpoint_aside(tiny_model, smol_tokenizer, tmp_path, caplog):
    """A run resumed from step 1 writes step 2 again while a damaged step_000002 is there (left by a resume from a
    named checkpoint, or trainer.max_checkpoints above the count): the damaged one is set aside, not deleted; a
    second damaged copy of the same step gets the next free name."""
    policy = _policy(tiny_model)
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    for step in (1, 2):
        checkpoint.save_checkpoint(run_dir, step, policy, smol_tokenizer, {"data": {}}, keep=5, rank=0)
    caplog.set_level(logging.WARNING, logger="plugrl.checkpoint")
    for aside in ("damaged_step_000002", "damaged_step_000002.2"):
        _flip(root / "step_000002" / "policy" / "model.safetensors")
        files = _tree(root / "step_000002")
        caplog.clear()
        checkpoint.save_checkpoint(run_dir, 2, policy, smol_tokenizer, {"data": {}}, keep=5, rank=0)
        assert _tree(root / aside) == files
        assert checkpoint.verify(root / "step_000002") is None
        warned = _warnings(caplog)
        assert len(warned) == 1 and str(root / aside) in warned[0] and "written again" in warned[0]
    assert [p.name for p in checkpoint.list_checkpoints(run_dir)] == ["step_000001", "step_000002"]


def test_resume_auto_sets_damaged_checkpoints_aside_with_their_files(tmp_path, caplog, monkeypatch):
    """Hand-made checkpoints 1 (good), 2 (a file missing), 3 (a flipped byte): resume=auto picks 1 and sets 2 and 3
    aside as damaged_step_N with every file as it was and a warning naming each and its problem. They are out of
    list_checkpoints, so the next resume hashes step 1 alone. latest_checkpoint only looks: it renames nothing."""
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    good = _made(run_dir, 1)
    _made(run_dir, 2)
    (root / "step_000002" / "policy" / "model.safetensors").unlink()
    _made(run_dir, 3)
    _flip(root / "step_000003" / "policy" / "model.safetensors")
    before = _tree(root)
    assert checkpoint.latest_checkpoint(run_dir) == good and _tree(root) == before

    caplog.set_level(logging.WARNING, logger="plugrl.checkpoint")
    caplog.clear()
    assert checkpoint.resume_checkpoint(run_dir, "auto") == good
    assert sorted(p.name for p in root.iterdir()) == ["damaged_step_000002", "damaged_step_000003", "step_000001"]
    assert _tree(root) == {(f"damaged_{k}" if not k.startswith("step_000001/") else k): v for k, v in before.items()}, (
        "the files set aside are not the ones that were there"
    )
    warned = _warnings(caplog)
    assert len(warned) == 2, warned
    assert str(root / "step_000003") in warned[0] and "does not match its checksum" in warned[0]
    assert str(root / "damaged_step_000003") in warned[0] and "resuming from step_000001" in warned[0]
    assert str(root / "step_000002") in warned[1] and "policy/model.safetensors is missing" in warned[1]

    hashed = _hashed(monkeypatch)
    assert checkpoint.resume_checkpoint(run_dir, "auto") == good
    assert {Path(h).relative_to(root).parts[0] for h in hashed} == {"step_000001"}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


STATE = b'{"step": 1}'
ENTRY = {"size": len(STATE), "sha256": _sha(STATE)}

# manifest.json -> what verify must say (each raised TypeError, AttributeError or KeyError before)
WRONG_SHAPES = [
    ([], "it is a list, not an object with 'files'"),
    (["trainer_state.json"], "it is a list"),
    (None, "it is null"),
    ("files", "it is a string"),
    (3, "it is a number"),
    ({"files": 3}, "'files' is a number, not an object"),
    ({"files": ["trainer_state.json"]}, "'files' is a list"),
    ({"files": None}, "'files' is null"),
    ({"files": {"trainer_state.json": 5}}, "the entry of trainer_state.json is a number, not an object with size"),
    ({"files": {"trainer_state.json": [11, ENTRY["sha256"]]}}, "the entry of trainer_state.json is a list"),
    ({"files": {"trainer_state.json": "abc"}}, "the entry of trainer_state.json is a string"),
    ({"files": {"trainer_state.json": {"sha256": ENTRY["sha256"]}}}, "has no valid size (a byte count), got None"),
    ({"files": {"trainer_state.json": {"size": len(STATE)}}}, "has no valid sha256 (64 hex digits), got None"),
    ({"files": {"trainer_state.json": {**ENTRY, "size": str(len(STATE))}}}, "has no valid size"),
    ({"files": {"trainer_state.json": {**ENTRY, "size": True}}}, "has no valid size"),
    ({"files": {"trainer_state.json": {**ENTRY, "size": -1}}}, "has no valid size"),
    ({"files": {"trainer_state.json": {**ENTRY, "size": [11]}}}, "has no valid size"),
    ({"files": {"trainer_state.json": {**ENTRY, "sha256": 7}}}, "has no valid sha256"),
    ({"files": {"trainer_state.json": {**ENTRY, "sha256": "zz"}}}, "has no valid sha256"),
    ({"files": {"trainer_state.json": {**ENTRY, "sha256": {"a": 1}}}}, "has no valid sha256"),
]


def test_wrong_shape_manifests_are_damaged_with_a_reason(tmp_path, caplog):
    """Valid JSON that is not what plugrl writes: verify says "manifest.json is not one plugrl writes: <why>" (the
    old code raised TypeError, AttributeError or KeyError). Every such checkpoint is refused by name as
    trainer.resume=<path> with a CheckpointError, and skipped by resume=auto, which then resumes the good one."""
    run_dir = tmp_path / "run"
    root = run_dir / "checkpoints"
    good = _made(run_dir, 1, {"trainer_state.json": STATE})
    for step, (manifest, reason) in enumerate(WRONG_SHAPES, start=2):
        ckpt = _made(run_dir, step, {"trainer_state.json": STATE}, manifest=manifest)
        problem = checkpoint.verify(ckpt)
        assert problem is not None and problem.startswith("manifest.json is not one plugrl writes: "), manifest
        assert reason in problem, (manifest, problem)
        with pytest.raises(checkpoint.CheckpointError, match=f"{ckpt.name} is unusable: manifest.json is not one"):
            checkpoint.resume_checkpoint(None, str(ckpt))
    # the right shape but listing no trainer_state.json (nothing to resume from): damaged too
    empty = _made(run_dir, len(WRONG_SHAPES) + 2, {"trainer_state.json": STATE}, manifest={"step": 0, "files": {}})
    assert (
        checkpoint.verify(empty) == "manifest.json is not one plugrl writes: 'files' does not list trainer_state.json"
    )

    caplog.set_level(logging.WARNING, logger="plugrl.checkpoint")
    assert checkpoint.resume_checkpoint(run_dir, "auto") == good
    assert len(_warnings(caplog)) == len(WRONG_SHAPES) + 1
    assert [p.name for p in root.iterdir() if not p.name.startswith("damaged_")] == ["step_000001"]


def test_a_manifest_naming_files_outside_the_checkpoint_is_damaged_and_they_are_not_read(tmp_path, monkeypatch):
    """A file outside the checkpoint, listed in its manifest with its true size and sha256 (the old code read it and
    called the checkpoint good): by ``../``, by an absolute path, by a symlink inside the checkpoint, by ``./``
    or an empty part. Each is damaged with the reason, and nothing is hashed."""
    run_dir = tmp_path / "run"
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not part of any checkpoint")
    entry = {"size": secret.stat().st_size, "sha256": _sha(secret.read_bytes())}
    hashed = _hashed(monkeypatch)
    cases = {
        "../../../secret.txt": "the file name '../../../secret.txt' leaves the checkpoint directory (..)",
        "policy/../../../../secret.txt": "leaves the checkpoint directory (..)",
        str(secret): f"the file name {str(secret)!r} is an absolute path",
        "policy/link.txt": "policy/link.txt points outside the checkpoint directory (a symlink)",
        "./trainer_state.json": "is not a plain relative path",
        "policy//model.safetensors": "is not a plain relative path",
        "": "is empty or holds a NUL byte",
    }
    for step, (name, reason) in enumerate(cases.items(), start=1):
        ckpt = _made(run_dir, step, {"trainer_state.json": STATE})
        (ckpt / "policy").mkdir()
        (ckpt / "policy" / "link.txt").symlink_to(secret)
        manifest = {"step": step, "files": {"trainer_state.json": ENTRY, name: entry}}
        (ckpt / "manifest.json").write_text(json.dumps(manifest))
        problem = checkpoint.verify(ckpt)
        assert problem is not None and reason in problem, (name, problem)
    assert hashed == [], "a file was read"
