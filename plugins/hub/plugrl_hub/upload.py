"""The Hub's side of ``trainer.push_to_hub``: the final checkpoint's model, uploaded with huggingface_hub.

The token comes from ``HF_TOKEN`` (or a ``hf auth login``), never from the config; the endpoint from
``HF_ENDPOINT`` (huggingface_hub's own variable), read when the upload starts. As TRL (transformers'
``Trainer``) does, the repo is created when the run starts, so a missing token, a token without write access
or a wrong ``hub_model_id`` stops the run before any training; the upload happens once the last step's
checkpoint is written: its ``policy/`` folder (config, safetensors weights, tokenizer), which transformers and
vLLM load as it is. :mod:`plugrl_hub.hooks` calls these at the run's start and end.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from plugrl.plugins import PluginError

log = logging.getLogger("plugrl.hub")


class HubError(PluginError):
    """An upload failed after training; the message names the checkpoint and how to upload it again (a
    :class:`PluginError`: the kernel ends the run with it as it is, ``plugrl: error: ...``)."""


def _api(token: str) -> Any:
    from huggingface_hub import HfApi

    # HF_ENDPOINT read now: huggingface_hub reads it once, when imported
    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None, token=token)


def hub_token() -> str | None:
    """The token huggingface_hub would use: ``HF_TOKEN``, else the one ``hf auth login`` stored."""
    from huggingface_hub import get_token

    return get_token()


def token_problem(cfg_trainer: Any) -> str | None:
    """Why ``trainer.push_to_hub`` cannot upload (no token), or None; checked at start, before anything loads."""
    if not cfg_trainer.push_to_hub or hub_token():
        return None
    return (
        "trainer.push_to_hub is true but there is no Hugging Face token: set HF_TOKEN to a token with write "
        "access (or run `hf auth login`), or set trainer.push_to_hub=false (TRL: push_to_hub: false)"
    )


def repo_id_of(cfg_trainer: Any) -> str:
    return cfg_trainer.hub_model_id or cfg_trainer.experiment_name


def prepare_repo(cfg_trainer: Any) -> tuple[str | None, str | None]:
    """Create (or find) the repo of ``trainer.hub_model_id`` at start: ``(problem, None)`` or ``(None, repo_id)``,
    the full ``owner/name`` the hub answered (a bare name lands in the token's namespace)."""
    problem = token_problem(cfg_trainer)
    if problem:
        return problem, None
    wanted = repo_id_of(cfg_trainer)
    try:
        url = _api(hub_token()).create_repo(
            wanted, repo_type="model", private=cfg_trainer.hub_private_repo, exist_ok=True
        )
    except Exception as e:  # noqa: BLE001 - offline, no write access, a bad name: all stop the run the same way
        return (
            f"trainer.push_to_hub: cannot create or reach the hub repo {wanted!r} at "
            f"{os.environ.get('HF_ENDPOINT') or 'https://huggingface.co'} ({type(e).__name__}: {e}); check that "
            "HF_TOKEN has write access and trainer.hub_model_id (TRL: hub_model_id) names a repo you may write, "
            "or set trainer.push_to_hub=false"
        ), None
    return None, url.repo_id


def push_checkpoint(ckpt: Path, repo_id: str, commit_message: str) -> str:
    """Upload ``ckpt/policy`` (a LoRA run: ``ckpt/policy_adapter``, a PEFT adapter repo, as TRL pushes one) to
    ``repo_id``; returns the commit's URL. Raises :class:`HubError`."""
    folder = Path(ckpt) / "policy"
    if not folder.is_dir() and (Path(ckpt) / "policy_adapter").is_dir():
        folder = Path(ckpt) / "policy_adapter"
    token = hub_token()
    if not token:  # checked at start; the environment may have changed since (a resumed run)
        raise HubError(f"no Hugging Face token to upload {folder}: set HF_TOKEN and run the same command again")
    log.info("uploading %s to the hub repo %s", folder, repo_id)
    try:
        info = _api(token).upload_folder(
            repo_id=repo_id, folder_path=folder, repo_type="model", commit_message=commit_message
        )
    except Exception as e:  # noqa: BLE001 - the checkpoint is safe on disk: say how to try again
        raise HubError(
            f"uploading {folder} to the hub repo {repo_id!r} failed ({type(e).__name__}: {e}); the checkpoint is "
            "kept: run the same command again (the run is complete, so it only uploads), or upload the folder "
            f"with `hf upload {repo_id} {folder}`"
        ) from None
    log.info("uploaded to %s", info.commit_url)
    return str(info.commit_url)
