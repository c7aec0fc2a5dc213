"""The RL math: advantage inputs/outputs, policy loss, KL estimators, loss aggregation.

Pure functions over tensors with documented shapes. B = sequences, T = response
tokens (padded); masks are 1.0 on response tokens, 0.0 on padding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch

if TYPE_CHECKING:
    from plugrl.specs import Registry

_metric_mode = threading.local()


@contextmanager
def metrics_as_tensors() -> Iterator[None]:
    """Within it (in this thread), the loss functions here return their metrics as detached 0-dim tensors instead of
    Python floats: the trainer reads a mini-batch's metrics in one host sync, not one ``.item()`` per metric per
    micro-batch (each of which waits for the GPU's queue to drain). Outside it, floats, as documented."""
    before = getattr(_metric_mode, "tensors", False)
    _metric_mode.tensors = True
    try:
        yield
    finally:
        _metric_mode.tensors = before


def metric_value(value: torch.Tensor) -> float | torch.Tensor:
    """A loss function's metric: a Python float, or the detached tensor within :func:`metrics_as_tensors`."""
    value = value.detach()
    return value if getattr(_metric_mode, "tensors", False) else value.item()


T_ = TypeVar("T_")


@dataclass
class StepContext:
    """What the trainer offers an estimator besides the step's samples: ``batch.context``.

    registry: what the run's plugins registered (:class:`plugrl.specs.Registry`), for an estimator that calls
        another plugin's functions (the records of a kind a plugin defines are in ``registry.plugin_records``);
        None in a batch built by hand.
    tp_lead: whether this rank computes what :meth:`share` shares (the first rank of its tensor-parallel group).
    tp_broadcast: the group's broadcast of its first rank's object, None without tensor parallelism.

    ``share(compute)`` (:meth:`share`): ``compute()`` computed once for the ranks of a tensor-parallel group, which
    train on the same samples: the first computes, the others receive its result. For work whose answer may change
    from call to call (an LLM asked over HTTP), so that the whole group trains on the same advantages; a collective.
    The trainer sets ``tp_lead`` and ``tp_broadcast``.
    """

    registry: Registry | None = None
    tp_lead: bool = True
    tp_broadcast: Callable[[Any], Any] | None = field(default=None, repr=False)

    def share(self, compute: Callable[[], T_]) -> T_:
        """``compute()``, computed once for the ranks that train on the same samples: the first rank of a
        tensor-parallel group computes it, the others receive its result. So work whose answer may change from call
        to call (an LLM asked over HTTP) gives the whole group the same advantages. A collective: every rank that
        holds this batch calls it, as often and in the same order. Without tensor parallelism: ``compute()``."""
        if self.tp_broadcast is None:
            return compute()
        return self.tp_broadcast(compute() if self.tp_lead else None)


@dataclass(frozen=True)
class PromptGroup:
    """The responses to one prompt in an :class:`AdvantageBatch`: ``rows``, their rows in the batch (ascending),
    ``prompt`` the prompt's text and ``responses`` their texts, in the order of ``rows``."""

    prompt: str
    responses: list[str]
    rows: list[int]


@dataclass
class AdvantageBatch:
    """The step context of an advantage estimator: what it sees of one rank's samples, and of the run.

    token_level_rewards: [B, T] reward per response token (the sequence score sits on
        the last response token; a KL-in-reward penalty, when on, is spread over tokens).
    response_mask: [B, T] 1.0 on response tokens.
    group_ids: [B] int64; the samples of one prompt share an id (whole groups per rank).
    values: [B, T] critic values; a declared input, only for estimators registered with needs_critic.
    prompts: [B] each sample's prompt text (repeated over its group).
    responses: [B] each sample's response text.
    baseline_scores: [B] float32, for each sample the score of a greedy (temperature 0) rollout of
        its prompt; a declared input, only for estimators registered with needs_greedy_baseline (ReMax).
    context: the run's services (:class:`StepContext`): its registry, and ``share`` for the work the ranks of a
        tensor-parallel group must agree on.

    Also: ``scores`` ([B] the sequence rewards); ``prompt_groups()``, each prompt's text with its responses' texts
    and rows (:class:`PromptGroup`), to ask something about each prompt's responses; ``prompt_rows()``, the rows
    alone.
    """

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    group_ids: torch.Tensor
    values: torch.Tensor | None = None
    prompts: list[str] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)
    baseline_scores: torch.Tensor | None = None
    context: StepContext = field(default_factory=StepContext)

    @property
    def scores(self) -> torch.Tensor:
        """[B] the sequence-level reward: sum of token_level_rewards."""
        return (self.token_level_rewards * self.response_mask).sum(-1)

    def prompt_rows(self) -> list[list[int]]:
        """The rows of each prompt's samples (the rows sharing a ``group_ids`` value, ascending), prompts in the order
        of their first row. Needs no texts."""
        return prompt_rows(self.group_ids)

    def prompt_groups(self) -> list[PromptGroup]:
        """Each prompt with its responses' texts and rows (:class:`PromptGroup`), in the order of :meth:`prompt_rows`.
        Raises ValueError when ``prompts`` or ``responses`` do not hold one text per row (a batch built without
        texts)."""
        rows = self.prompt_rows()
        size = sum(len(r) for r in rows)
        for name in ("prompts", "responses"):
            if len(getattr(self, name)) != size:
                raise ValueError(
                    f"batch.{name} holds {len(getattr(self, name))} texts for {size} rows: the per-prompt texts need "
                    f"one per row (the trainer fills them; a batch built by hand must pass {name}=...)"
                )
        return [PromptGroup(self.prompts[r[0]], [self.responses[i] for i in r], r) for r in rows]

    @property
    def extras(self) -> dict[str, Any]:
        """Deprecated (plugin API 1, plugrl 0.1): the typed fields as the dict they replaced, with a
        :class:`plugrl.PluginAPIWarning` naming the code that reads it; plugrl 0.3 removes it."""
        import sys
        import warnings

        from plugrl.api import EXTRAS, PluginAPIWarning, old_form_message, running_version

        caller = sys._getframe(1)
        where = f"{caller.f_globals.get('__name__', '?')}.{caller.f_code.co_name}"
        warnings.warn(old_form_message(EXTRAS, running_version(), where), PluginAPIWarning, stacklevel=2)
        old: dict[str, Any] = {"prompts": self.prompts, "responses": self.responses}
        if self.baseline_scores is not None:  # in 0.1 only there when the estimator needed it
            old["baseline_scores"] = self.baseline_scores
        return old


def prompt_rows(group_ids: torch.Tensor) -> list[list[int]]:
    """The rows of each group id, ascending, groups in the order of their first row: ``[0, 0, 1, 0]`` gives
    ``[[0, 1, 3], [2]]``."""
    rows: dict[int, list[int]] = {}
    for row, gid in enumerate(torch.as_tensor(group_ids).reshape(-1).tolist()):
        rows.setdefault(gid, []).append(row)
    return list(rows.values())


@dataclass
class AdvantageResult:
    """advantages: [B, T] (0 on padding); returns: [B, T] value targets (critic estimators)."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- helpers

KL_KINDS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

_TINY = 1e-8  # floor of every denominator that counts mask entries: an empty mask gives 0, not NaN
_CHUNK_ELEMENTS = 1 << 25  # float32 temporaries of the [N, V] logit functions are at most this big per chunk


def _f32(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a float tensor of at least float32 precision (bf16/fp16/int/bool -> float32; float64 kept)."""
    if x.is_floating_point() and x.dtype.itemsize >= 4:
        return x
    return x.float()


def _mask_like(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A bool/int/low-precision mask as a float mask of ``x``'s dtype."""
    return mask.to(x.dtype)


def _denominator(value: float | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A positive denominator on ``like``'s device and dtype (0 becomes ``_TINY``, so 0/0 gives 0)."""
    return torch.as_tensor(value, dtype=like.dtype, device=like.device).clamp_min(_TINY)


# --------------------------------------------------------------------------- masked statistics


def response_mask(response_lens: list[int], width: int | None = None) -> torch.Tensor:
    """[B, T] float32 mask, 1.0 on the first ``response_lens[i]`` positions of row i.

    T is ``width``, by default the longest response (at least 1, so an all-empty batch keeps a column).
    """
    width = max(max(response_lens, default=0), 1) if width is None else width
    return (torch.arange(width) < torch.tensor(response_lens, dtype=torch.long).unsqueeze(1)).float()


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of ``x`` over the entries where ``mask`` is non-zero, weighted by ``mask``.

    Shapes: ``x`` and ``mask`` broadcast together (typically both [B, T]); the result drops
    ``dim`` (all dimensions when None, giving a scalar).

    Formula: ``sum_i x_i * m_i``, where entries with ``m_i == 0`` are left out entirely, so a
    NaN or inf on padding neither reaches the sum nor its gradient. Computed in float32 (or
    float64 for float64 input).
    """
    x = _f32(x)
    m = _mask_like(mask, x)
    masked = torch.where(m != 0, x * m, torch.zeros((), dtype=x.dtype, device=x.device))
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Mean of ``x`` over the entries where ``mask`` is non-zero.

    Shapes: as :func:`masked_sum`.

    Formula: ``sum_i x_i * m_i / sum_i m_i``; an all-zero mask (along ``dim``) gives 0, not NaN.
    """
    x = _f32(x)
    m = _mask_like(mask, x)
    m = m.expand(torch.broadcast_shapes(x.shape, m.shape))
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(x, m, dim) / count.clamp_min(_TINY)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over the masked entries, all dimensions together -> scalar.

    Formula: ``mu = masked_mean(x)``, ``var = masked_mean((x - mu)^2)``, times Bessel's correction
    ``n / (n - 1)`` with ``n = sum(mask)`` when ``unbiased`` (as verl's ``masked_var``).
    Raises ValueError when ``unbiased`` and the mask holds fewer than two entries.
    """
    x = _f32(x)
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        n = _mask_like(mask, x).expand(torch.broadcast_shapes(x.shape, mask.shape)).sum()
        if n.item() <= 1:
            raise ValueError(
                f"masked_var(unbiased=True) needs at least two masked-in entries, got {n.item():g}; "
                "pass unbiased=False or a larger mask"
            )
        var = var * (n / (n - 1))
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit variance over the masked entries (as verl's ``masked_whiten``).

    Shapes: ``x`` [B, T] (any shape), ``mask`` broadcastable to it; returns ``x``'s shape (float32).

    Formula: ``(x - mu) / sqrt(var + eps)`` with ``mu = masked_mean(x, mask)`` and the unbiased
    ``var = masked_var(x, mask)`` over all dimensions; with ``shift_mean=False`` the mean is added
    back: ``(x - mu) / sqrt(var + eps) + mu``. Entries outside the mask are transformed too (not
    zeroed); multiply by the mask if they must be 0. Needs at least two masked-in entries.
    """
    x = _f32(x)
    mean = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


# --------------------------------------------------------------------------- KL estimators


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from sampled-token log-probabilities (Schulman's k1/k2/k3).

    Shapes: ``logprob`` [B, T] (current or rollout policy), ``ref_logprob`` [B, T]; returns [B, T] float32.

    With ``d = logprob - ref_logprob``:

    - ``"kl"`` / ``"k1"``: ``d`` (unbiased, high variance, can be negative);
    - ``"abs"``: ``|d|``;
    - ``"mse"`` / ``"k2"``: ``0.5 * d^2``;
    - ``"low_var_kl"`` / ``"k3"``: ``r - log r - 1`` with ``log r = clamp(ref_logprob - logprob, -20, 20)``
      and ``r = exp(log r)``; the result is clamped to ``[-10, 10]`` (exactly as verl: the clamp
      also cuts the gradient of tokens beyond it). Non-negative and unbiased where unclamped.

    Raises ValueError for any other ``kind``.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid kinds: {', '.join(KL_KINDS)}")
    logprob, ref_logprob = _f32(logprob), _f32(ref_logprob)
    if kind in ("kl", "k1"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    log_ratio = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    kl = torch.exp(log_ratio) - log_ratio - 1.0
    return torch.clamp(kl, min=-10.0, max=10.0)


# --------------------------------------------------------------------------- loss aggregation


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_length: float | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss matrix into a scalar.

    Shapes: ``loss_mat`` [B, T], ``loss_mask`` [B, T] (1.0 on tokens that count); returns a float32 scalar.

    With ``S_i = sum_t loss[i, t] * mask[i, t]`` and ``n_i = sum_t mask[i, t]``:

    - ``"token-mean"``: ``sum_i S_i / num_tokens``; ``num_tokens`` defaults to ``sum_i n_i``.
      Under gradient accumulation pass the token count of the whole mini-batch (all
      micro-batches, all ranks): the micro-batch losses then add up to the exact token mean.
    - ``"seq-mean-token-sum"``: ``sum_i S_i / num_seqs``; ``num_seqs`` defaults to B.
    - ``"seq-mean-token-mean"``: ``sum_i (S_i / n_i) / num_seqs``; ``num_seqs`` defaults to B.
    - ``"seq-mean-token-sum-norm"`` (Dr. GRPO): ``sum_i S_i / norm_length / num_seqs``;
      ``norm_length`` defaults to T (pass ``data.max_response_length`` to keep it constant),
      ``num_seqs`` to B.

    A sequence with an all-zero mask contributes 0, and an all-zero mask gives 0 (never NaN).
    These are the values of this batch's share of the loss; when a data-parallel all-reduce
    *averages* gradients over ranks, the caller scales by the world size (verl's ``dp_size``).
    Raises ValueError for an unknown ``mode``.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")
    if loss_mat.dim() != 2:
        raise ValueError(f"agg_loss expects a [B, T] loss matrix, got shape {tuple(loss_mat.shape)}")
    loss_mat = _f32(loss_mat)
    mask = _mask_like(loss_mask, loss_mat).expand_as(loss_mat)
    batch, length = loss_mat.shape
    seq_sums = masked_sum(loss_mat, mask, dim=-1)  # [B]
    if mode == "token-mean":
        return seq_sums.sum() / _denominator(mask.sum() if num_tokens is None else num_tokens, seq_sums)
    seqs = _denominator(batch if num_seqs is None else num_seqs, seq_sums)
    if mode == "seq-mean-token-sum":
        return seq_sums.sum() / seqs
    if mode == "seq-mean-token-mean":
        seq_means = seq_sums / mask.sum(dim=-1).clamp_min(_TINY)
        return seq_means.sum() / seqs
    # seq-mean-token-sum-norm
    return seq_sums.sum() / _denominator(length if norm_length is None else norm_length, seq_sums) / seqs


# --------------------------------------------------------------------------- policy loss


def policy_loss(
    logprob: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_c: float = 3.0,
    agg_mode: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_length: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate with asymmetric clipping (DAPO clip-higher) and dual clip (as verl's vanilla loss).

    Shapes: ``logprob`` [B, T] (current policy, carries the gradient), ``old_logprob`` [B, T]
    (the policy that sampled), ``advantages`` [B, T], ``response_mask`` [B, T]. Returns the
    scalar loss (aggregated by :func:`agg_loss` with ``agg_mode``, ``num_tokens``, ``num_seqs``,
    ``norm_length``) and metrics as Python floats (detached tensors within :func:`metrics_as_tensors`).

    Per token, with ``A`` the advantage::

        ratio = exp(clamp(logprob - old_logprob, -20, 20))
        pg1   = -A * ratio
        pg2   = -A * clamp(ratio, 1 - clip_low, 1 + clip_high)
        clip1 = max(pg1, pg2)                       # standard PPO clip
        pg3   = -A * clip_c
        clip2 = min(pg3, clip1)                     # dual clip: bounds the loss of A < 0 tokens
        loss  = clip2 if A < 0 else clip1
        loss  = loss * rollout_is_weights           # only when given (rollout correction), before aggregation

    ``clip_c = inf`` turns the dual clip off (``loss = clip1``: TRL's loss without ``delta``).

    ``rollout_is_weights`` [B, T]: the importance weights of :mod:`plugrl.rollout_correction` (detached here);
    None (the default) leaves the loss as it is.

    Metrics (masked means over response tokens of this batch, no gradient):
    ``actor/pg_clipfrac`` = mean[pg2 > pg1]; ``actor/pg_clipfrac_lower`` = mean[clip1 > pg3 and A < 0];
    ``actor/ppo_kl`` = mean[old_logprob - logprob] (clamped like the ratio); ``actor/pg_loss`` =
    the returned loss value (this batch's share under a global ``num_tokens``).
    """
    if clip_c <= 1.0:
        raise ValueError(f"clip_c (actor.clip_ratio_c) must be > 1.0 for dual-clip PPO, got {clip_c}")
    logprob, old_logprob, advantages = _f32(logprob), _f32(old_logprob), _f32(advantages)
    log_ratio = torch.clamp(logprob - old_logprob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    if clip_c == float("inf"):  # no dual clip; -A * inf would be NaN where A is 0
        pg_losses3 = torch.full_like(clip_pg_losses1, float("inf"))
    else:
        pg_losses3 = -advantages * clip_c
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights.detach()
    loss = agg_loss(
        pg_losses, response_mask, agg_mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=norm_length
    )
    with torch.no_grad():
        clipfrac = masked_mean((pg_losses2 > pg_losses1).float(), response_mask)
        clipfrac_lower = masked_mean(((clip_pg_losses1 > pg_losses3) & (advantages < 0)).float(), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    metrics = {
        "actor/pg_clipfrac": metric_value(clipfrac),
        "actor/pg_clipfrac_lower": metric_value(clipfrac_lower),
        "actor/ppo_kl": metric_value(ppo_kl),
        "actor/pg_loss": metric_value(loss),
    }
    return loss, metrics


def step_wise_advantages(
    advantages: torch.Tensor, mask: torch.Tensor, row_episode: torch.Tensor, row_mask: torch.Tensor
) -> torch.Tensor:
    """Advantages of step-wise samples (SkyRL's step-wise trajectories): every turn of an episode, trained as
    its own sequence, gets its episode's advantage.

    advantages, mask: [E, T] the estimator's advantages over each episode's last turn, and that turn's
    response mask. row_episode: [B] int, the episode of each training row. row_mask: [B, T'] the rows' masks.
    Returns [B, T']: ``advantages[e, t0(e)]`` on every masked token of each row of episode e, where t0(e)
    is the first masked token of e's last turn (outcome estimators give a whole turn one value); 0
    elsewhere. An episode with no masked token contributes 0.
    """
    has = mask > 0
    first = has.float().argmax(dim=1)
    per_episode = advantages[torch.arange(advantages.shape[0]), first] * has.any(dim=1)
    return per_episode[row_episode][:, None].to(row_mask.dtype) * row_mask


def adaptive_kl_coef(coef: float, current_kl: float, target_kl: float, horizon: int, n_steps: int) -> float:
    """The adaptive KL controller of Ziegler et al. 2019 (as verl's ``AdaptiveKLController``)::

    error = clip(current_kl / target_kl - 1, -0.2, 0.2)
    coef  = coef * (1 + error * n_steps / horizon)
    """
    error = max(-0.2, min(0.2, current_kl / target_kl - 1.0))
    return coef * (1.0 + error * n_steps / horizon)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_range: float,
    agg_mode: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    norm_length: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss of PPO (as verl's ``compute_value_loss``).

    Shapes: ``values`` [B, T] (current critic, carries the gradient), ``old_values`` [B, T]
    (the critic when the rollout was scored), ``returns`` [B, T], ``response_mask`` [B, T]::

        v_clip = clamp(values, old_values - clip_range, old_values + clip_range)
        loss   = 0.5 * agg(max((values - returns)^2, (v_clip - returns)^2))

    Metrics: ``critic/vf_clipfrac`` = mean[(v_clip - R)^2 > (v - R)^2], ``critic/vf_loss``.
    """
    values, old_values, returns = _f32(values), _f32(old_values), _f32(returns)
    clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    losses1 = (values - returns) ** 2
    losses2 = (clipped - returns) ** 2
    loss = 0.5 * agg_loss(
        torch.maximum(losses1, losses2),
        response_mask,
        agg_mode,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        norm_length=norm_length,
    )
    with torch.no_grad():
        clipfrac = masked_mean((losses2 > losses1).float(), response_mask)
    return loss, {"critic/vf_clipfrac": metric_value(clipfrac), "critic/vf_loss": metric_value(loss)}


# --------------------------------------------------------------------------- logits


def _rowwise(fn: Any, logits: torch.Tensor, *rest: torch.Tensor) -> Any:
    """Apply ``fn(logits_rows [n, V] float32, *rest_rows) -> [n]`` (or a tuple of [n]) over row chunks
    of the flattened logits; returns the same structure shaped like ``logits.shape[:-1]``."""
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    flat_rest = [r.reshape(-1) for r in rest]
    rows = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    parts = [fn(_f32(flat[i : i + rows]), *(r[i : i + rows] for r in flat_rest)) for i in range(0, flat.shape[0], rows)]
    if not parts:  # no rows at all
        parts = [fn(_f32(flat), *flat_rest)]

    def join(chunks: list[torch.Tensor]) -> torch.Tensor:
        return (chunks[0] if len(chunks) == 1 else torch.cat(chunks)).reshape(logits.shape[:-1])

    if isinstance(parts[0], tuple):
        return tuple(join([p[k] for p in parts]) for k in range(len(parts[0])))
    return join(parts)


def _entropy_rows(x: torch.Tensor) -> torch.Tensor:
    # H is shift-invariant: subtracting the (constant, hence detached) row max keeps both terms
    # small, so large logits lose no precision to cancellation
    x = x - x.detach().amax(dim=-1, keepdim=True)
    p = torch.softmax(x, dim=-1)
    # -inf logits (masked vocabulary) have p == 0: zero them in p * x so 0 * -inf cannot make a NaN
    x_finite = x.masked_fill(~torch.isfinite(x), 0.0)
    return torch.logsumexp(x, dim=-1) - (p * x_finite).sum(dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` along the last dimension.

    Shapes: ``logits`` [..., V] -> [...] float32.

    Formula: ``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` (equal to ``-sum p log p``, but with
    no log of a probability), evaluated on ``z - max(z)`` so that large logits lose no precision
    to cancellation; ``-inf`` logits are allowed and contribute 0 (and no NaN gradient).
    Computed in float32 over row chunks so a bf16 input never needs a full float32 copy of the
    logits at once.
    """
    return _rowwise(_entropy_rows, logits)


def _logprob_rows(x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Log-probability of each label under ``softmax(logits / temperature)``.

    Shapes: ``logits`` [N, V] (or [..., V]), ``labels`` [N] (or [...]) integer token ids;
    returns [N] (or [...]) float32.

    Formula: ``log p(y) = z_y - logsumexp(z)``, ``z = logits / temperature``, equal to
    ``log_softmax(z).gather(y)`` without materialising the [N, V] log-softmax; computed in
    float32 over row chunks.
    """
    _check_labels(logits, labels)
    if temperature == 1.0:
        return _rowwise(_logprob_rows, logits, labels)
    return _rowwise(lambda x, y: _logprob_rows(x / temperature, y), logits, labels)


def _check_labels(logits: torch.Tensor, labels: torch.Tensor) -> None:
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} does not match logits shape {tuple(logits.shape)} "
            "without its last (vocabulary) dimension"
        )


class _LogprobEntropy(torch.autograd.Function):
    """Log-probs and entropies of rows of ``softmax(logits / T)`` with a hand-written backward.

    Autograd through ``logsumexp`` would keep a float32 copy of every row chunk alive until backward
    and run about ten passes over the [N, V] logits; here forward keeps only ``lse`` [N] (the
    logits themselves are the caller's), and each direction makes a few in-place float32 passes
    over one row chunk at a time. Gradients, with ``z = logits / T`` and ``p = softmax(z)``:
    ``d log p(y) / dz = onehot(y) - p``; ``dH / dz = -p * (z - sum_v p_v z_v)``; both times ``1 / T``.
    """

    @staticmethod
    def forward(ctx, logits, labels, temperature: float, entropy_grad: bool):
        rows = max(1, _CHUNK_ELEMENTS // max(logits.shape[-1], 1))
        n = logits.shape[0]
        logp = torch.empty(n, dtype=_acc_dtype(logits), device=logits.device)
        ent = torch.empty_like(logp)
        shift = torch.empty_like(logp)  # max + logsumexp: z - shift is log p
        for i in range(0, n, rows):
            z, zmax = _shifted_chunk(logits[i : i + rows], temperature)
            p = torch.exp(z)
            total = p.sum(dim=-1)
            lse = total.log()
            y = labels[i : i + rows].long().unsqueeze(-1)
            logp[i : i + rows] = z.gather(-1, y).squeeze(-1) - lse
            # H = lse - sum_v p_v z_v, with p unnormalised here (divide by its sum)
            ent[i : i + rows] = lse - torch.linalg.vecdot(p, z) / total
            shift[i : i + rows] = zmax + lse
        ctx.save_for_backward(logits, labels, shift, ent)
        ctx.temperature, ctx.entropy_grad = temperature, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        logits, labels, shift, ent = ctx.saved_tensors
        temperature = ctx.temperature
        grad = torch.empty_like(logits)
        rows = max(1, _CHUNK_ELEMENTS // max(logits.shape[-1], 1))
        use_ent = ctx.entropy_grad and g_ent is not None
        for i in range(0, logits.shape[0], rows):
            sl = slice(i, i + rows)
            z = _scaled_copy(logits[sl], temperature)
            logp_all = z.sub_(shift[sl].unsqueeze(-1))  # log p
            p = logp_all.exp()
            # d/dz: g_logp * (onehot(y) - p)  [+ g_ent * -p * (log p - E[log p]) : shift-invariant form]
            coef = -g_logp[sl].unsqueeze(-1)
            if use_ent:
                # z - E_p[z] = log p - E_p[log p] = log p + H
                out = logp_all.add_(ent[sl].unsqueeze(-1)).mul_(-g_ent[sl].unsqueeze(-1)).add_(coef).mul_(p)
            else:
                out = p.mul_(coef)
            out.scatter_add_(-1, labels[sl].long().unsqueeze(-1), g_logp[sl].unsqueeze(-1).to(out.dtype))
            if temperature != 1.0:
                out.div_(temperature)
            grad[sl].copy_(out)
        return grad, None, None, None


def _acc_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _scaled_copy(chunk: torch.Tensor, temperature: float) -> torch.Tensor:
    """``chunk / T`` as a fresh tensor of at least float32, -inf clamped to the dtype's minimum (a masked
    vocabulary entry then has p = 0 and no ``0 * inf`` NaN in ``p * z``)."""
    z = chunk.to(_acc_dtype(chunk), copy=True)
    if temperature != 1.0:
        z.div_(temperature)
    return z.clamp_(min=torch.finfo(z.dtype).min)


def _shifted_chunk(chunk: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(``chunk / T - rowmax`` [n, V] as a fresh tensor of at least float32, rowmax [n])."""
    z = _scaled_copy(chunk, temperature)
    zmax = z.amax(dim=-1)
    return z.sub_(zmax.unsqueeze(-1)), zmax


def logprobs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each label and the entropy of each row of ``softmax(logits / temperature)``,
    in one pass over the logits (they share the row max and the logsumexp).

    Shapes: ``logits`` [N, V] (or [..., V], any float dtype), ``labels`` [N] (or [...]);
    returns (logp [N], entropy [N]), both float32.

    Formulas: with ``z = logits / temperature - max``, ``lse = logsumexp(z)``:
    ``log p(y) = z_y - lse``; ``H = lse - sum_v exp(z_v - lse) * z_v``.
    ``logp`` carries gradient; ``entropy`` only with ``entropy_grad`` (it is otherwise a logged
    statistic). Row chunks are upcast to float32 one at a time, so bf16 logits never need a full
    float32 copy, and the backward is hand-written (:class:`_LogprobEntropy`): a few passes over
    the logits instead of autograd's chain through ``logsumexp``.
    """
    _check_labels(logits, labels)
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    logp, ent = _LogprobEntropy.apply(flat, labels.reshape(-1), float(temperature), bool(entropy_grad))
    shape = logits.shape[:-1]
    return logp.reshape(shape), (ent if entropy_grad else ent.detach()).reshape(shape)


# --------------------------------------------------------------------------- group statistics


def group_mean_std(scores: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Statistics of each sample's group, broadcast back to the samples (no Python loop).

    Shapes: ``scores`` [B], ``group_ids`` [B] (any integer ids; samples sharing an id form a group).
    Returns ``(mean [B], std [B], size [B] int64)`` with, for the group g of sample b:
    ``mean = sum_g r / n_g``, ``std = sqrt(sum_g (r - mean)^2 / (n_g - 1))`` (unbiased, as
    ``torch.std``) and ``size = n_g``. A single-sample group has std 0. A group whose scores
    are all equal has mean exactly that score and std exactly 0 (no rounding residue).
    """
    s = _f32(scores)
    if s.dim() != 1:
        raise ValueError(f"scores must have shape [B], got {tuple(s.shape)}")
    ids = torch.as_tensor(group_ids, device=s.device)
    if ids.shape != s.shape:
        raise ValueError(f"group_ids shape {tuple(ids.shape)} does not match scores shape {tuple(s.shape)}")
    _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    num_groups = counts.numel()
    n = counts.to(s.dtype)
    zeros = torch.zeros(num_groups, dtype=s.dtype, device=s.device)
    mean = zeros.index_add(0, inverse, s) / n
    hi = zeros.scatter_reduce(0, inverse, s, reduce="amax", include_self=False)
    lo = zeros.scatter_reduce(0, inverse, s, reduce="amin", include_self=False)
    mean = torch.where(hi == lo, hi, mean)
    centered = s - mean[inverse]
    var = zeros.index_add(0, inverse, centered * centered) / (n - 1).clamp_min(1)
    std = torch.where(counts > 1, var.sqrt(), zeros)
    return mean[inverse], std[inverse], counts[inverse]
