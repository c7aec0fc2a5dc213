"""The ``tensorboard`` logger (``trainer.logger: [..., tensorboard]``): each step's metrics as scalars in
``RUN_DIR/tensorboard``; a resumed run purges the events from its first step on, so no step is there twice."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

TENSORBOARD_DIR = "tensorboard"


class TensorBoardLogger:
    name = "tensorboard"

    @staticmethod
    def prepare() -> None:
        """Import TensorBoard's writer: an ImportError naming the pip command when it is not installed."""
        _import_summary_writer()

    @staticmethod
    def problem(environ: Mapping[str, str]) -> str | None:
        """Why this logger cannot run here (its package does not import), or None."""
        try:
            _import_summary_writer()
        except ImportError as e:
            return str(e)
        return None

    def __init__(self, run_dir: Path, cfg_trainer: Any, *, start_step: int, **_: Any) -> None:
        writer = _import_summary_writer()
        self.writer = writer(log_dir=str(Path(run_dir) / TENSORBOARD_DIR), purge_step=start_step or None)

    def log(self, step: int, values: Mapping[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Samples are in ``rollouts/`` (the tracker's); TensorBoard shows scalars only."""

    def close(self, summary: Mapping[str, Any] | None) -> None:
        self.writer.close()


def _import_summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ImportError(
            "trainer.logger includes 'tensorboard' but the tensorboard package is not installed; "
            "install it with `pip install tensorboard` or remove 'tensorboard' from trainer.logger"
        ) from None
    return SummaryWriter
