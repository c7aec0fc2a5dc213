"""verl's sample dumps on the kernel's hooks; an extension (entry point ``compat`` in group ``plugrl.extensions``),
so its hook runs in every run, and writes only when the config names a directory:

- :func:`plugrl_samples` (rank 0, every step's and every validation's samples): ``trainer.rollout_data_dir`` and
  ``trainer.validation_data_dir`` get ``{dir}/{step}.jsonl`` in verl's layout
  (:func:`plugrl_compat.verl_samples.write_verl_samples`).
"""

from __future__ import annotations

from typing import Any

from plugrl import hookimpl
from plugrl_compat.verl_samples import write_verl_samples


@hookimpl
def plugrl_samples(config: Any, step: int, rows: list[dict[str, Any]], validation: bool) -> None:
    """A training step's samples to ``trainer.rollout_data_dir``, a validation's to ``trainer.validation_data_dir``,
    when set."""
    directory = config.trainer.validation_data_dir if validation else config.trainer.rollout_data_dir
    if directory:
        write_verl_samples(directory, step, rows)
