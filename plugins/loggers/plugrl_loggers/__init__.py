"""plugrl's loggers beyond the console and ``metrics.jsonl``: ``wandb`` and ``tensorboard`` (entry-point group
``plugrl.loggers``: each a class the tracker makes on rank 0 when ``trainer.logger`` names it)."""
