"""A local, unpackaged plugin (loaded as `toy_plugin:`) whose reward varies within a group even for a random model."""

import plugrl


@plugrl.reward("toy")
def parity(completion: str) -> float:
    return float(len(completion) % 2)
