"""Rollouts with transformers' ``generate``: the fallback engine, and the seeded one.

It keeps its own unsharded copy of the policy, so each rank generates without collectives, and a weight sync is
a state-dict copy. Seeded per call, so a resumed run regenerates exactly what an uninterrupted run did.

Every rollout carries each sampled token's log-prob (whatever ``rollout.calculate_log_probs`` says: they cost
nothing here) under the distribution it was sampled from, ``softmax(logits / temperature)`` with top-k / top-p
applied (greedy: the raw logits), as vLLM's ``processed_logprobs``. With top-k / top-p they differ from what the
trainer recomputes by the truncation, which ``algorithm.rollout_correction`` weighs as the sampler's mismatch.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

import torch

from plugrl.models import is_vision_model
from plugrl.rollout.types import ImagePrompt, Rollout, SamplingSettings, first_stop
from plugrl.vlm import vision_support


class HFEngine:
    def __init__(
        self,
        model_path: str,
        dtype: str,
        device: str,
        tokenizer,
        max_batch: int = 64,
        hf_overrides: dict | None = None,
        **_,
    ):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

        torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        config = AutoConfig.from_pretrained(model_path, **(hf_overrides or {}))  # model.override_config
        cls = AutoModelForImageTextToText if is_vision_model(config) else AutoModelForCausalLM
        self.model = cls.from_pretrained(model_path, config=config, dtype=torch_dtype).to(device).eval()
        # transformers 5 places Qwen2-VL's 3-D positions, and builds Gemma 3's both-ways image mask, by the tokens'
        # modality (1 = image), given as this keyword
        keyword = vision_support().image_token_types_keyword(self.model.config) if is_vision_model(config) else None
        self.token_types = keyword if keyword in inspect.signature(self.model.forward).parameters else None
        self.device = device
        self.tokenizer = tokenizer
        self.max_batch = max_batch
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}
        self.eos_ids.discard(None)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids))

    @torch.no_grad()
    def generate(self, prompts: list[list[int] | ImagePrompt], sampling: SamplingSettings) -> list[list[Rollout]]:
        gen = torch.Generator(device="cpu")
        if sampling.seed is not None:
            gen.manual_seed(sampling.seed)
        if any(isinstance(p, ImagePrompt) for p in prompts):
            # one prompt's n samples a batch: they share its images, the pixel inputs of one generate() call
            return [self._generate_image_prompt(p, sampling, gen) for p in prompts]
        flat = [p for p in prompts for _ in range(sampling.n)]
        rollouts: list[Rollout] = []
        for start in range(0, len(flat), self.max_batch):
            rollouts += self._generate_chunk(flat[start : start + self.max_batch], sampling, gen)
        return [rollouts[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def _generate_image_prompt(
        self, prompt: list[int] | ImagePrompt, s: SamplingSettings, gen: torch.Generator
    ) -> list[Rollout]:
        if not isinstance(prompt, ImagePrompt):
            return self._generate_chunk([prompt] * s.n, s, gen)
        rollouts: list[Rollout] = []
        for start in range(0, s.n, self.max_batch):
            k = min(self.max_batch, s.n - start)
            each = prompt.pixels.batch_kwargs(k, self.device, self.model.dtype)
            rollouts += self._generate_chunk([prompt.model_ids] * k, s, gen, each)
        return rollouts

    def _generate_chunk(
        self, prompts: list[list[int]], s: SamplingSettings, gen: torch.Generator, extra: dict | None = None
    ) -> list[Rollout]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        extra = dict(extra or {})
        if extra and self.token_types:
            extra[self.token_types] = (ids == self.model.config.image_token_id).int().to(self.device)
        # generate() samples from the global RNG: seed it from our generator so calls are reproducible
        torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
        out = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            do_sample=s.temperature > 0,
            temperature=s.temperature if s.temperature > 0 else None,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k > 0 else None,
            max_new_tokens=s.max_tokens,
            stop_strings=list(s.stop) or None,
            tokenizer=self.tokenizer if s.stop else None,
            pad_token_id=self.pad_id,
            output_scores=True,
            return_dict_in_generate=True,
            **extra,
        )
        new = out.sequences[:, width:].cpu()
        # [b, steps, V] the scores generate() sampled from: temperature, top-k and top-p applied (-inf outside)
        scores = torch.stack(out.scores, dim=1).float().cpu()
        logprobs = torch.log_softmax(scores, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        result = []
        for i, p in enumerate(prompts):
            row = new[i].tolist()
            cut, reason = self._sampled_end(row, s.stop)
            result.append(Rollout(list(p), row[:cut], logprobs[i, :cut].tolist(), reason))
        return result

    def _sampled_end(self, row: list[int], stop: tuple[str, ...]) -> tuple[int, str]:
        """(how many of a generated row's tokens the policy sampled, why it ended), as vLLM reports them: the first
        EOS ends a row (kept); a stop string ends it at the token that completed it (kept). generate() pads a
        finished row, often with the EOS token itself: after a stop string it was never sampled, never trained on.
        """
        eos = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
        end = len(row) if eos is None else eos
        if stop and first_stop(self.tokenizer.decode(row[:end], skip_special_tokens=True), stop) is not None:
            lo, hi = 1, end  # the shortest prefix whose text holds a stop string (texts of prefixes grow)
            while lo < hi:
                mid = (lo + hi) // 2
                if first_stop(self.tokenizer.decode(row[:mid], skip_special_tokens=True), stop) is not None:
                    hi = mid
                else:
                    lo = mid + 1
            return lo, "stop"
        if eos is not None:
            return eos + 1, "stop"
        if stop and self.pad_id not in self.eos_ids and row and row[-1] == self.pad_id:
            # stopped on a stop string its text does not show (e.g. a special token): padding follows
            cut = len(row)
            while cut > 0 and row[cut - 1] == self.pad_id:
                cut -= 1
            return cut, "stop"
        return len(row), "length"

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        for name, tensor in weights:
            params[name].data.copy_(tensor.to(params[name].device, params[name].dtype))

    def sleep(self) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def close(self) -> None:
        del self.model
