"""verl's spelling of ``algorithm.rollout_correction`` (``rollout_is``, ``rollout_is_threshold``, ``rollout_rs``,
``rollout_rs_threshold``, ``bypass_mode``, ``loss_type``, ``rollout_is_batch_normalize``) read into plugrl's
(``mode``, ``level``, ``cap``, ``low``, ``high``): the keys combine, so the section is read whole
(:meth:`plugrl_compat.verl.VerlReader.read_section`, which the kernel's section asks). Combinations plugrl does not
compute are ``ValueError``s naming the key, which the config's error names the section of.
"""

from __future__ import annotations

from typing import Any

# verl's algorithm.rollout_correction keys (RolloutCorrectionConfig in verl/trainer/config/algorithm.py, 0.9.1),
# read into plugrl's (:func:`rollout_correction`)
VERL_ROLLOUT_CORRECTION_KEYS = (
    "rollout_is",
    "rollout_is_threshold",
    "rollout_is_batch_normalize",
    "rollout_rs",
    "rollout_rs_threshold",
    "bypass_mode",
    "loss_type",
)
# verl's ratio-bound (k1) rejection options at the level of its rollout_is: the ones plugrl's mask mode is
VERL_RS_LEVELS = {"token_k1": "token", "seq_sum_k1": "sequence", "seq_mean_k1": "geometric"}


def _verl_bounds(value: Any, key: str) -> tuple[float, float | None]:
    """verl's threshold spelling: a number (or its text) -> (upper, None); ``"lower_upper"`` -> (upper, lower)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"rollout_correction.{key} must be a number or a 'lower_upper' text, got {value!r}")
    text = str(value).strip()
    try:
        if "_" in text:
            lower, upper = (float(x) for x in text.split("_", 1))
            return upper, lower
        return float(text), None
    except ValueError:
        raise ValueError(
            f"rollout_correction.{key} {value!r} is neither a number nor 'lower_upper' (e.g. 0.5_2.0)"
        ) from None


def rollout_correction(data: dict[str, Any]) -> dict[str, Any]:
    """verl's spelling (decoupled mode) -> plugrl's: TIS (``rollout_is`` + a numeric threshold) is truncate;
    IcePop (``rollout_is`` + ``"lower_upper"``) is mask; ``rollout_is`` + ``rollout_rs: token_k1 / seq_sum_k1``
    at its level, with the IS cap at or above the rejection's upper bound, is mask; both null is off."""
    ours = sorted(k for k in data if k not in VERL_ROLLOUT_CORRECTION_KEYS)
    if ours:
        raise ValueError(
            f"verl's keys ({', '.join(k for k in VERL_ROLLOUT_CORRECTION_KEYS if k in data)}) and plugrl's "
            f"({', '.join(ours)}) are both set; write it one way (docs/coming_from_verl.md maps them)"
        )
    if data.get("bypass_mode") not in (None, False):
        raise ValueError(
            "bypass_mode=true (verl's bypass mode: the engine's log-probs as the old policy, no old log-prob "
            "pass) is not in plugrl, which always recomputes the old log-probs (verl's decoupled mode); remove it"
        )
    if data.get("loss_type") not in (None, "ppo_clip"):
        raise ValueError(
            f"loss_type={data['loss_type']!r} applies in verl's bypass mode only, which plugrl does not have; "
            "remove it (plugrl's loss is actor.loss_mode)"
        )
    if data.get("rollout_is_batch_normalize") not in (None, False):
        raise ValueError(
            "rollout_is_batch_normalize=true (weights rescaled to a batch mean of 1) is not in plugrl; remove it"
        )
    level, rs = data.get("rollout_is"), data.get("rollout_rs")
    if level not in (None, "token", "sequence"):
        raise ValueError(f"rollout_is={level!r}: verl's levels are token and sequence (or null)")
    if level is None and rs is None:
        return {"mode": "off"}  # verl computes no weights and rejects nothing
    if level is None:
        raise ValueError(
            f"rollout_rs={rs!r} without rollout_is rejects without weighting the kept tokens, which plugrl does "
            "not do: its mask mode weights them by w; write it as algorithm.rollout_correction.mode=mask, level "
            "(token, sequence, geometric), low, high"
        )
    upper, lower = _verl_bounds(data.get("rollout_is_threshold", 2.0), "rollout_is_threshold")
    if rs is None:
        if lower is None:  # TIS
            return {"mode": "truncate", "level": level, "cap": upper}
        return {"mode": "mask", "level": level, "low": lower, "high": upper}  # IcePop
    options = [o.strip() for o in str(rs).split(",") if o.strip()]
    if len(options) != 1 or VERL_RS_LEVELS.get(options[0]) != level or lower is not None:
        raise ValueError(
            f"rollout_is={level!r} with rollout_rs={rs!r}: plugrl reads one ratio-bound rejection at the level "
            f"of rollout_is ({'token_k1' if level == 'token' else 'seq_sum_k1'}) with a numeric "
            "rollout_is_threshold; other combinations: write algorithm.rollout_correction.mode/level/low/high"
        )
    if data.get("rollout_rs_threshold") is None:
        raise ValueError("rollout_rs needs rollout_rs_threshold, as in verl")
    rs_upper, rs_lower = _verl_bounds(data["rollout_rs_threshold"], "rollout_rs_threshold")
    rs_lower = 1.0 / rs_upper if rs_lower is None else rs_lower
    if rs_lower <= 0 or rs_upper <= 0:
        raise ValueError(f"rollout_rs_threshold {data['rollout_rs_threshold']!r} must be positive, as in verl")
    # verl bounds -log w by [log lower, log upper]: it keeps w in [1 / upper, 1 / lower]
    low, high = 1.0 / rs_upper, 1.0 / rs_lower
    if upper < high:
        raise ValueError(
            f"rollout_is_threshold ({upper:g}) below the rejection's upper bound ({high:g}) would truncate the "
            "kept weights too, which plugrl's mask mode does not; raise rollout_is_threshold to at least it"
        )
    return {"mode": "mask", "level": level, "low": low, "high": high}
