"""Loading a reward model, rendering (prompt, response) pairs with its tokenizer, and scoring them.

:class:`LocalScorer` holds the model in this process; :class:`ShardedScorer` holds this rank's shard of it, the
model sharded with FSDP2 over every rank (``shard: true`` under torchrun); :class:`SeparateScorer` runs a
:class:`LocalScorer` in a child process (``process: separate``). All answer
``score(prompts, completions) -> (raw scores, truncated)``.
:func:`scorer` keeps one of them per distinct model options for the life of the process (or until
:func:`release`), so the model loads once and stays loaded across steps.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from plugrl.placement import Topology, rank_gpu

from .options import WHERE, Options

log = logging.getLogger("plugrl.reward_model")

Message = dict[str, Any]


class RewardModelError(RuntimeError):
    """The reward model cannot be used as configured; the message names the option and the fix."""


# --------------------------------------------------------------------------- what the model reads


def render(tokenizer: Any, prompt: str | list[Message], completion: str | list[Message], chat_template: bool) -> str:
    """The text the reward model reads for one sample, as TRL renders it for a reward model.

    A chat prompt (messages; the completion then comes as ``[{"role": "assistant", ...}]``, as the kernel's batch
    rewards get it) is rendered with the reward model's own chat template when it has one (and
    ``chat_template`` is on), else as ``role: content`` lines. A text prompt is joined to the completion as is.
    """
    if isinstance(prompt, str):
        return prompt + (completion if isinstance(completion, str) else "".join(m["content"] for m in completion))
    reply = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion)
    messages = [*prompt, *reply]
    if chat_template and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False)
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)


def token_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices grouped so that each group's padded size (longest x count) stays within ``budget`` tokens;
    longest first, so similar lengths share a batch. A sequence longer than the budget is a batch alone."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


# --------------------------------------------------------------------------- the model in this process


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RewardModelError(f"{WHERE}.device={name!r}, but torch sees no CUDA device here; set device: auto or cpu")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    from plugrl.precision import resolve_dtype as kernel_dtype

    if name == "float16":
        return torch.float16
    return getattr(torch, kernel_dtype(name, device, key=f"{WHERE}.dtype"))


def check_model_config(opts: Options) -> list[str]:
    """Problems with the model at ``path`` that its config tells (it loads no weights): one output, a trained
    sequence-classification head."""
    from transformers import AutoConfig

    from plugrl.models import resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(opts.path), trust_remote_code=opts.trust_remote_code)
    except Exception as e:
        return [
            f"{WHERE}.path={opts.path!r}: no model config loads from it ({type(e).__name__}: {str(e)[:300]}); "
            "point it at a directory (or Hub id) holding a sequence classifier's config.json and weights"
        ]
    problems = []
    archs = list(getattr(config, "architectures", None) or [])
    if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
        problems.append(
            f"{WHERE}.path={opts.path!r} is a {', '.join(archs)}, not a sequence classifier: transformers would give "
            "it a random score head. Use a reward model (AutoModelForSequenceClassification with one output)"
        )
    if config.num_labels != 1:
        problems.append(
            f"{WHERE}.path={opts.path!r} has num_labels={config.num_labels}: a reward model gives one score per "
            "text (num_labels 1 in its config.json); use such a model"
        )
    return problems


class LocalScorer:
    """The reward model and its tokenizer, in this process, in eval mode, without gradients."""

    def __init__(self, opts: Options):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from plugrl.models import resolve_model_path

        problems = check_model_config(opts)
        if problems:
            raise RewardModelError("; ".join(problems))
        path = resolve_model_path(opts.path)
        self.device = resolve_device(opts.device)
        self.dtype = resolve_dtype(opts.dtype, self.device)
        kwargs: dict[str, Any] = {"dtype": self.dtype, "trust_remote_code": opts.trust_remote_code}
        if opts.attn_implementation:
            kwargs["attn_implementation"] = opts.attn_implementation
        self.tokenizer = AutoTokenizer.from_pretrained(
            resolve_model_path(opts.tokenizer_path or opts.path), trust_remote_code=opts.trust_remote_code
        )
        model = self._load(AutoModelForSequenceClassification, path, kwargs, opts)
        # HF pools the score at the last token that is not padding; batches need a padding id to find it
        pad = model.config.pad_token_id
        if pad is None:
            pad = (
                self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
            )
            model.config.pad_token_id = pad
        self.pad_id = 0 if pad is None else int(pad)
        self.model = model
        limit = getattr(model.config, "max_position_embeddings", None)
        self.positions = int(limit) if limit else None  # max_length when the options set none
        self._lock = threading.Lock()  # one forward at a time (validation and training may share the model)

    def _load(self, cls: Any, path: str, kwargs: dict[str, Any], opts: Options) -> Any:
        """The whole model, on this scorer's device, in eval mode, without gradients."""
        return cls.from_pretrained(path, **kwargs).to(self.device).eval().requires_grad_(False)

    def encode(
        self, prompts: Sequence[Any], completions: Sequence[Any], opts: Options
    ) -> tuple[list[list[int]], list[bool]]:
        """Token ids of each sample (at most max_length, the end kept: the score is read there) and whether it
        was cut."""
        limit = opts.max_length or self.positions
        ids, cut = [], []
        for p, c in zip(prompts, completions, strict=True):
            text = render(self.tokenizer, p, c, opts.chat_template)
            # as TRL: the text holds its special tokens already (chat template), none are added
            row = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            over = limit is not None and len(row) > limit
            ids.append(row[-limit:] if over else row)
            cut.append(bool(over))
        return ids, cut

    @torch.inference_mode()
    def forward(self, ids: Sequence[list[int]], budget: int) -> list[float]:
        """One score per sequence, in batches of at most ``budget`` tokens (right padding: positions as unpadded)."""
        scores = [math.nan] * len(ids)
        for batch in token_batches([max(1, len(r)) for r in ids], budget):
            for i, value in zip(batch, self._logits([ids[i] for i in batch]), strict=True):
                scores[i] = value
        return scores

    def _logits(self, rows: Sequence[list[int]]) -> list[float]:
        """One forward pass over ``rows`` (right-padded): the score of each."""
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for k, r in enumerate(rows):
            input_ids[k, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[k, : len(r)] = 1
        with torch.autocast(self.device.type, enabled=False):  # its own dtype, whatever the trainer's autocast
            logits = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device)).logits
        return [float(v) for v in logits[:, 0].float().cpu()]

    def score(
        self, prompts: Sequence[Any], completions: Sequence[Any], opts: Options
    ) -> tuple[list[float], list[bool]]:
        """Raw scores and truncation flags; ``opts``: the call's options (one loaded model serves every set of
        options that loads the same weights the same way: batching, length and template are per call)."""
        with self._lock:
            ids, cut = self.encode(prompts, completions, opts)
            return self.forward(ids, opts.max_tokens_per_batch), cut

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


# --------------------------------------------------------------------------- the model sharded over the ranks


class ShardedScorer(LocalScorer):
    """The reward model sharded with FSDP2 over every rank of the process group (``shard: true`` under torchrun),
    as the policy is (:mod:`plugrl.sharding`): every rank builds it on the meta device, rank 0 alone reads the
    weights and broadcasts them, and each keeps about 1/world of them. Scoring is a collective: every rank calls
    :meth:`score` in every round, with its items or none (the kernel calls a collective batch reward so); the
    ranks agree on the round's number of forward passes (the most any rank needs) and a rank with fewer runs
    one-token dummy passes, whose outputs it drops, so that its all-gathers meet the others'."""

    def _load(self, cls: Any, path: str, kwargs: dict[str, Any], opts: Options) -> Any:
        import torch.distributed as dist
        from transformers import AutoConfig

        from plugrl.dist import broadcast_object
        from plugrl.sharding import load_full_weights, parameters_on_meta, shard_model

        config = AutoConfig.from_pretrained(path, trust_remote_code=opts.trust_remote_code)
        with parameters_on_meta():
            model = cls.from_config(config, **kwargs)
        model.eval().requires_grad_(False)
        try:
            shard_model(model, self.device)
        except ValueError as e:
            raise RewardModelError(
                f"{WHERE}.shard: the model at path={opts.path!r} cannot be sharded ({e}); set shard: false"
            ) from None
        full: dict[str, torch.Tensor] = {}
        problem = None
        if dist.get_rank() == 0:
            try:
                full = cls.from_pretrained(path, **kwargs).state_dict()
            except Exception as e:  # said on every rank, rather than leaving the others in the broadcast below
                problem = f"{type(e).__name__}: {e}"
        problem = broadcast_object(problem)
        if problem:
            raise RewardModelError(f"{WHERE}.path={opts.path!r}: rank 0 could not read the weights ({problem})")
        load_full_weights(model, full, self.device, offload=False)
        del full
        local, whole = shard_numel(model)
        log.info(
            "reward model %s sharded with FSDP2 over %d ranks: %d of its %d parameters on this rank",
            opts.path,
            dist.get_world_size(),
            local,
            whole,
        )
        return model

    @torch.no_grad()  # as the kernel's FSDP2 models compute without gradients (log-probs, values)
    def forward(self, ids: Sequence[list[int]], budget: int) -> list[float]:
        """:meth:`LocalScorer.forward`, the same number of forward passes on every rank (a collective)."""
        from plugrl.dist import all_reduce

        scores = [math.nan] * len(ids)
        batches = token_batches([max(1, len(r)) for r in ids], budget)
        rounds = int(all_reduce([float(len(batches))], op="max")[0])
        for k in range(rounds):
            if k >= len(batches):  # this rank has no more: a dummy pass joins the others' all-gathers
                self._logits([[self.pad_id]])
                continue
            batch = batches[k]
            for i, value in zip(batch, self._logits([ids[i] for i in batch]), strict=True):
                scores[i] = value
        return scores


def shard_numel(model: Any) -> tuple[int, int]:
    """(elements of the parameters this rank holds, elements of the whole model's): an FSDP2 parameter is a
    DTensor whose local shard is on this rank."""
    local = whole = 0
    for p in model.parameters():
        whole += p.numel()
        local += p.to_local().numel() if hasattr(p, "to_local") else p.numel()
    return local, whole


# --------------------------------------------------------------------------- the model in a child process


def _serve(conn: Any, raw: dict[str, Any]) -> None:
    """The child of :class:`SeparateScorer`: load the model, answer ``(prompts, completions, options)`` until told
    to stop (None, or the trainer's end of the pipe closing)."""
    try:
        local = LocalScorer(Options.model_validate(raw))
    except BaseException as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the trainer went away
            return
        if request is None:
            return
        try:
            prompts, completions, opts = request
            conn.send(("ok", local.score(prompts, completions, Options.model_validate(opts))))
        except BaseException as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))


def child_device(requested: str, topo: Topology) -> str:
    """The device a child process of this rank (it inherits ``CUDA_VISIBLE_DEVICES``) must use for ``requested``
    (``auto``, ``cuda``, ``cuda:N`` or ``cpu``): ``auto`` and ``cuda`` name the rank's own GPU, since a fresh process
    would take ``cuda:0`` on every rank; ``auto`` is ``cpu`` where there is no GPU; a numbered device stays."""
    if topo.device_count == 0:  # nothing to pick from: a "cuda" the caller's own check refuses
        return "cpu" if requested == "auto" else requested
    if requested in ("auto", "cuda"):
        return f"cuda:{rank_gpu(topo)}"
    return requested


def child_options(opts: Options, topo: Topology) -> Options:
    """The options the child process of :class:`SeparateScorer` loads with: ``device`` names this rank's GPU
    (:func:`child_device` for ``topo``, the rank's place on its node), since ``auto`` or ``cuda`` resolved in a fresh
    process would be ``cuda:0`` on every rank of a node."""
    return opts.model_copy(update={"device": child_device(opts.device, topo)})


class SeparateScorer:
    """A :class:`LocalScorer` in a child process (spawned: the trainer has threads and may hold CUDA), on this rank's
    device (:func:`child_options`)."""

    START_TIMEOUT_S = 600.0

    def __init__(self, opts: Options):
        opts = child_options(opts, Topology.from_env())
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(child, opts.model_dump(mode="json")), name="plugrl-reward-model", daemon=True
        )
        self._proc.start()
        child.close()
        self._lock = threading.Lock()
        kind, what = self._receive(self.START_TIMEOUT_S)
        if kind != "ready":
            self.close()
            raise RewardModelError(f"{WHERE}: the reward model's process did not start: {what}")

    def _receive(self, timeout_s: float | None = None) -> tuple[str, Any]:
        waited = 0.0
        while not self._conn.poll(1.0):
            waited += 1.0
            if not self._proc.is_alive():
                return "error", f"its process exited (code {self._proc.exitcode}); out of memory?"
            if timeout_s is not None and waited >= timeout_s:
                return "error", f"no answer after {timeout_s:.0f}s"
        try:
            return self._conn.recv()
        except EOFError:
            return "error", "its process closed the connection"

    def score(
        self, prompts: Sequence[Any], completions: Sequence[Any], opts: Options
    ) -> tuple[list[float], list[bool]]:
        with self._lock:
            if not self._proc.is_alive():
                raise RewardModelError(f"{WHERE}: the reward model's process has exited (code {self._proc.exitcode})")
            self._conn.send((list(prompts), list(completions), opts.model_dump(mode="json")))
            kind, what = self._receive()
        if kind != "ok":
            raise RewardModelError(f"{WHERE}: the reward model's process failed: {what}")
        return what

    def close(self) -> None:
        try:
            if self._proc.is_alive():
                self._conn.send(None)
                self._proc.join(timeout=10)
        except (OSError, ValueError):
            pass
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)
        self._conn.close()


# --------------------------------------------------------------------------- one model per process


_SCORERS: dict[str, LocalScorer | SeparateScorer] = {}
_LOCK = threading.Lock()


def sharded(opts: Options) -> bool:
    """``shard: true`` applies here: a process group of more than one rank (torchrun) holds this process."""
    from plugrl.dist import is_distributed

    return opts.shard and is_distributed()


def scorer(opts: Options) -> LocalScorer | SeparateScorer:
    """The scorer for ``opts``, loaded on first use and kept until :func:`release` (with ``shard: true`` under
    torchrun a collective: every rank loads it at the same point, as :func:`plugrl_run_start` does)."""
    key = opts.model_key()
    with _LOCK:
        found = _SCORERS.get(key)
        if found is None:
            if opts.process == "separate":
                cls: type[LocalScorer] | type[SeparateScorer] = SeparateScorer
            elif sharded(opts):
                cls = ShardedScorer
            else:
                cls = LocalScorer
                if opts.shard:
                    log.warning(
                        "%s.shard: true has no effect in a single process: the whole reward model loads here. "
                        "Launch with torchrun (--nproc_per_node=N) to shard it over the ranks, or remove shard",
                        WHERE,
                    )
            found = _SCORERS[key] = cls(opts)
            how = "trainer, sharded" if cls is ShardedScorer else opts.process
            if isinstance(found, LocalScorer):  # a separate process says where it loaded in its own log
                how += f", {found.device}, {str(found.dtype).removeprefix('torch.')}"
            log.info("reward model %s loaded (%s)", opts.path, how)
        return found


def release() -> None:
    """Unload every reward model this process holds (the end of a run)."""
    with _LOCK:
        scorers = list(_SCORERS.values())
        _SCORERS.clear()
    for s in scorers:
        s.close()


# --------------------------------------------------------------------------- normalisation


@dataclass
class RunningStats:
    """Mean and (population) standard deviation of every score seen, updated batch by batch (Chan et al.)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, values: Sequence[float]) -> None:
        n = len(values)
        if not n:
            return
        mean = sum(values) / n
        m2 = sum((v - mean) ** 2 for v in values)
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0


EPS = 1e-6  # the smallest std divided by: equal scores normalise to 0, not to inf
_STATS: dict[str, RunningStats] = {}


def running_stats(opts: Options) -> RunningStats:
    return _STATS.setdefault(opts.key(), RunningStats())


def reset_stats() -> None:
    _STATS.clear()


def normalize(raw: Sequence[float], opts: Options) -> list[float]:
    """The scores the policy is trained on: ``raw`` normalised as ``opts.normalize`` says, then clipped."""
    if opts.normalize == "running":
        stats = running_stats(opts)
        stats.update(raw)
        mean, std = stats.mean, max(stats.std, EPS)
        out = [(r - mean) / std for r in raw]
    elif opts.normalize == "fixed":
        out = [(r - opts.shift) / opts.scale for r in raw]
    else:
        out = list(raw)
    if opts.clip is not None:
        out = [min(opts.clip, max(-opts.clip, v)) for v in out]
    return out
