"""plugrl-lora: LoRA adapters through peft, behind the kernel's :mod:`plugrl.model_adapters`.

- :mod:`.fields`: the config keys (``actor.lora``, ``critic.lora``, ``rollout.lora_sync``), entry point ``lora`` of
  the group ``plugrl.config_fields``; every run config has them, so this package imports nothing heavy.
- :mod:`.kit`: the entry point of the group ``plugrl.model_adapters`` (adding, merging, saving adapters); the peft
  code itself is :mod:`.adapters`, the vLLM side :mod:`.vllm`.
"""
