"""verl's sample files: ``trainer.rollout_data_dir`` and ``trainer.validation_data_dir``, written as verl's trainer
dumps them, so scripts written for verl's dumps read a plugrl run's unchanged (:mod:`plugrl_compat.hooks` writes
them from the kernel's hook ``plugrl_samples``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_verl_samples(directory: str | os.PathLike, step: int, rows: list[Mapping[str, Any]]) -> Path:
    """Write a step's samples as verl's trainer dumps them (``trainer.rollout_data_dir`` and
    ``trainer.validation_data_dir``): ``{directory}/{step}.jsonl``, one line per sample with ``input`` (the
    prompt text), ``output`` (the completion), ``gts`` (the ground truth), ``score`` (the reward) and ``step``,
    then the reward's details (verl's ``reward_extra_info``) and the data source, so scripts written for verl's
    dumps read these unchanged. Returns the file written."""
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for row in rows:
        entry: dict[str, Any] = {
            "input": row.get("prompt"),
            "output": row.get("completion"),
            "gts": row.get("ground_truth"),
            "score": row.get("reward"),
            "step": int(step),
        }
        details = row.get("details")
        if isinstance(details, Mapping):
            entry.update({str(k): v for k, v in details.items() if str(k) not in entry})
        entry.setdefault("data_source", row.get("data_source"))
        lines.append(json.dumps(entry, ensure_ascii=False, default=str))
    path = out_dir / f"{int(step)}.jsonl"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)
    return path
