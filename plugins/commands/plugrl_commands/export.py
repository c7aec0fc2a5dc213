"""``plugrl export CHECKPOINT [--merge] OUT``: a checkpoint's policy as a folder other tools load.

- A LoRA checkpoint (``policy_adapter/``) with ``--merge``: the run's base model (``model.path`` of its
  ``config.yaml``, or ``--base``) with the adapter merged into its weights, in float32, then cast to the dtype of
  the base model's config, written with the tokenizer as safetensors: a plain Hugging Face model that
  ``AutoModelForCausalLM.from_pretrained`` and vLLM load (what verl's model merger and PEFT's ``merge_and_unload``
  give).
- A LoRA checkpoint without ``--merge``: the adapter folder as it is (PEFT format, with the tokenizer).
- A full fine-tuning checkpoint (``policy/``): that folder as it is (``--merge`` has nothing to merge).

CHECKPOINT is ``RUN_DIR/checkpoints/step_N`` or the run directory (its newest complete checkpoint). Nothing is
written unless the checkpoint passes its manifest check; OUT is written beside itself first and renamed into place,
so an export that fails leaves no half-written OUT.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from plugrl import checkpoint, model_adapters
from plugrl.config import ConfigError

log = logging.getLogger("plugrl.export")
_HUB_NAME = re.compile(r"^[\w.-]+/[\w.-]+$")  # organisation/name: left to transformers (its cache or the Hub)


class ExportError(RuntimeError):
    """A checkpoint that cannot be exported, or an OUT that must not be written; the message says how to fix it."""


@dataclass(frozen=True)
class Exported:
    out: Path
    checkpoint: Path
    kind: str  # "merged", "adapter" or "full"
    message: str


def find_checkpoint(path: Path) -> tuple[Path, bool]:
    """``(path, False)`` when ``path`` is a checkpoint folder (``policy/`` or ``policy_adapter/`` in it), else, for
    a run directory, ``(its newest checkpoint that passes the manifest check, True)``: the flag says whether it
    was checked already. An ExportError otherwise."""
    if not path.exists():
        raise ExportError(f"{path} does not exist: give a checkpoint (RUN_DIR/checkpoints/step_N) or a run directory")
    if not path.is_dir():
        raise ExportError(f"{path} is a file, not a checkpoint: give RUN_DIR/checkpoints/step_N or a run directory")
    if (path / "policy").is_dir() or (path / checkpoint.ADAPTER_FOLDER).is_dir():
        return path, False
    if (path / "checkpoints").is_dir():  # a run directory: its newest complete checkpoint
        if not checkpoint.list_checkpoints(path):
            raise ExportError(
                f"run directory {path} has no checkpoint in {path / 'checkpoints'} yet: a run writes one every "
                "trainer.save_freq steps and at its last step (none with trainer.save_freq=0); export once it has"
            )
        newest = checkpoint.latest_checkpoint(path)  # damaged ones are skipped with a warning naming them
        if newest is None:
            raise ExportError(
                f"run directory {path} has no complete checkpoint: every one in {path / 'checkpoints'} fails its "
                "manifest check (see the warnings above); repair or restore one, or give a step_N folder that passes"
            )
        return newest, True
    raise ExportError(
        f"{path} is not a plugrl checkpoint (no policy/ or {checkpoint.ADAPTER_FOLDER}/ in it) nor a run directory "
        "(no checkpoints/ in it): give RUN_DIR/checkpoints/step_N or RUN_DIR"
    )


def _check_out(out: Path, force: bool, *keep: Path) -> None:
    """Refuse an OUT that is a file, one that exists with files in it (unless ``force``), or one that is, holds or
    sits inside a folder that must be kept (the checkpoint, the base model): ``--force`` would delete it."""
    resolved = out.resolve()
    for folder in keep:
        inside = folder.resolve()
        if resolved == inside or resolved.is_relative_to(inside) or inside.is_relative_to(resolved):
            raise ExportError(
                f"OUT {out} is, holds or lies inside {folder}, which the export reads: choose an OUT outside it"
            )
    if out.exists() and not out.is_dir():
        raise ExportError(f"OUT {out} is a file: choose another OUT (a new or empty folder)")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(
            f"OUT {out} exists and is not empty: choose another OUT, or add --force to replace its contents"
        )


def _base_of(ckpt: Path, base: str | None) -> str:
    """The base model to merge into: ``base`` (``--base``) or the run's ``model.path``; an ExportError naming the
    key and ``--base`` when it cannot be read or names a folder that no longer exists."""
    if base is None:
        config = model_adapters.run_config_path(ckpt)
        if not config.is_file():
            raise ExportError(
                f"no {config} to read the base model (model.path) from: {ckpt} is not inside its run directory "
                "(RUN_DIR/checkpoints/step_N); give the base model with --base PATH"
            )
        try:
            resolved = model_adapters.base_model_path(ckpt)
        except (ConfigError, RuntimeError) as e:  # a config that no longer validates; a local: model not prepared
            raise ExportError(
                f"cannot read the base model (model.path) from {config}: {e}; give it with --base PATH"
            ) from None
        where = f"model.path {resolved!r} (from {config})"
        fix = "restore it there, or give the base model the adapter was trained on with --base PATH"
    else:
        resolved, where, fix = os.path.expanduser(base), f"--base {base!r}", "give a model folder or org/name"
    if not Path(resolved).exists() and not (_HUB_NAME.match(resolved) and not resolved.startswith((".", "~", "/"))):
        raise ExportError(f"the base model {where} does not exist: {fix}")
    return resolved


def config_dtype(model_path: str) -> torch.dtype:
    """The dtype of the model's config (``dtype``/``torch_dtype`` in its config.json); float32 where it names none."""
    from transformers import AutoConfig

    dtype = AutoConfig.from_pretrained(model_path).dtype
    if isinstance(dtype, str):  # an older config may hold the name
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _write(out: Path, fill: Callable[[Path], object]) -> None:
    """Write OUT through ``fill(tmp)`` into a temporary folder beside it, then put it in place (replacing OUT's
    contents only now, once the new ones are complete)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        fill(tmp / "out")
        if out.is_dir():  # empty, or --force: checked before anything was read
            shutil.rmtree(out)
        (tmp / "out").rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _first_line(e: BaseException) -> str:
    return next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)


def export(
    path: str | Path, out: str | Path, *, merge: bool = False, base: str | None = None, force: bool = False
) -> Exported:
    """Export the checkpoint at ``path`` (a step folder or a run directory) to ``out``; see the module docstring."""
    (ckpt, checked), out = find_checkpoint(Path(path)), Path(out)
    _check_out(out, force, ckpt)  # before the checkpoint is hashed: the cheap refusals first
    problem = None if checked else checkpoint.verify(ckpt)  # its files against their sizes and sha256, as a resume
    if problem:
        raise ExportError(
            f"checkpoint {ckpt} is incomplete or damaged: {problem}; export an older one, or give the run directory "
            "to export its newest complete checkpoint"
        )
    adapter = ckpt / checkpoint.ADAPTER_FOLDER
    if not adapter.is_dir():  # full fine-tuning: policy/ is an HF model folder already
        if merge:
            log.info("%s holds full weights (policy/), no LoRA adapter: --merge has nothing to merge", ckpt)
        if base is not None:
            log.info("--base is unused: %s holds full weights (policy/), no LoRA adapter to merge into it", ckpt)
        _write(out, lambda tmp: shutil.copytree(ckpt / "policy", tmp))
        return Exported(out, ckpt, "full", f"wrote {out}: the fine-tuned model of {ckpt} (HF safetensors, tokenizer)")
    if not merge:
        if base is not None:
            log.info("--base is unused without --merge: the adapter is written as it is (PEFT format)")
        _write(out, lambda tmp: shutil.copytree(adapter, tmp))
        return Exported(
            out,
            ckpt,
            "adapter",
            f"wrote {out}: the LoRA adapter of {ckpt} (PEFT format, tokenizer; PeftModel.from_pretrained(base, "
            f"{out}) loads it); add --merge for a full model",
        )
    try:  # merging takes the adapters' own code (plugrl-lora)
        merge_to_folder = model_adapters.kit(f"--merge of {adapter}").merge_to_folder
    except model_adapters.NoAdapters as e:
        raise ExportError(str(e)) from None
    base_path = _base_of(ckpt, base)
    if Path(base_path).exists():  # a local base model must stay out of the way of OUT (and of --force)
        _check_out(out, force, Path(base_path))
    try:
        dtype = config_dtype(base_path)
    except (OSError, ValueError) as e:  # no config.json there; a Hub name not in the cache, offline
        raise ExportError(
            f"the base model {base_path} cannot be read ({type(e).__name__}: {_first_line(e)}): give a model "
            "folder (a Hugging Face save) or a reachable org/name with --base PATH"
        ) from None
    try:
        _write(out, lambda tmp: merge_to_folder(base_path, adapter, tmp, dtype=dtype))
    except (ValueError, RuntimeError) as e:  # peft: target modules it lacks, tensors of other shapes
        raise ExportError(
            f"the adapter in {adapter} does not fit the base model {base_path} ({type(e).__name__}: "
            f"{_first_line(e)}): give the model it was trained on with --base PATH"
        ) from None
    name = str(dtype).removeprefix("torch.")
    return Exported(
        out,
        ckpt,
        "merged",
        f"wrote {out}: {base_path} with the LoRA adapter of {ckpt} merged ({name} safetensors, tokenizer); "
        "AutoModelForCausalLM.from_pretrained and vLLM load it",
    )


def _run(args: Any) -> int:
    from plugrl.cli import one_line

    try:
        result = export(args.checkpoint, args.out, merge=args.merge, base=args.base, force=args.force)
    except ExportError as e:
        print(f"plugrl: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    print(result.message)
    return 0


def register(commands: Any) -> None:
    """``plugrl export``: added to the kernel's command line (entry point ``export`` in group plugrl.commands)."""
    x = commands.add_parser(
        "export",
        help="a checkpoint's policy as a Hugging Face model folder (a LoRA adapter merged with --merge)",
        description="Write a checkpoint's policy to OUT. A LoRA checkpoint (policy_adapter/) with --merge: the "
        "run's base model (model.path in RUN_DIR/config.yaml, or --base) with the adapter merged in float32, then "
        "cast to the dtype of the base model's config, as safetensors with the tokenizer: transformers' "
        "AutoModelForCausalLM and vLLM load it. Without --merge: the adapter as it is (PEFT format). A full "
        "fine-tuning checkpoint (policy/): its HF model folder as it is (--merge is a no-op). The checkpoint's "
        "checksums are checked first, as a resume does.",
    )
    x.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        help="RUN_DIR/checkpoints/step_N, or RUN_DIR for its newest complete checkpoint",
    )
    x.add_argument("out", metavar="OUT", help="the folder to write (new or empty; see --force)")
    x.add_argument(
        "--merge",
        action="store_true",
        help="LoRA: merge the adapter into the base model (float32, then the base config's dtype) and write a "
        "full model; a no-op for a full fine-tuning checkpoint",
    )
    x.add_argument(
        "--base",
        metavar="PATH",
        default=None,
        help="with --merge: the base model to merge into (default: model.path of the run's config.yaml)",
    )
    x.add_argument("--force", action="store_true", help="replace OUT's contents when it exists and is not empty")
    x.set_defaults(fn=_run)
