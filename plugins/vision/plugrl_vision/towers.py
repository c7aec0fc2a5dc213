"""A vision-language model's parts: its vision encoder, the parameters of its vision side, its language model, and
the value head a critic puts on it."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

_VISION_TOWERS = ("vision_model", "vision_tower", "visual")  # Idefics3/SmolVLM, LLaVA/Gemma 3, Qwen-VL


def vision_tower(model: Any) -> Any:
    """The vision encoder module of a transformers vision-language model."""
    for holder in (getattr(model, "model", None), model):
        for name in _VISION_TOWERS:
            tower = getattr(holder, name, None)
            if tower is not None:
                return tower
    raise ValueError(f"{type(model).__name__}: no vision encoder found (looked for {', '.join(_VISION_TOWERS)})")


def vision_side_parameters(model: Any) -> list[tuple[str, Any]]:
    """(name, parameter) of a vision-language model's parameters outside its language model and LM head: the vision
    encoder's and the connector's."""
    inside = {id(p) for p in language_model(model).parameters()}
    head = model.get_output_embeddings()
    inside |= {id(p) for p in head.parameters()} if head is not None else set()
    return [(n, p) for n, p in model.named_parameters() if id(p) not in inside]


def vision_tower_name(model: Any) -> str:
    """The module name of ``model``'s vision encoder (:func:`vision_tower`), as ``named_modules`` gives it."""
    tower = vision_tower(model)
    return next(name for name, module in model.named_modules() if module is tower)


def connector_warning(model: Any, key: str) -> str | None:
    """What the start says (``key``: the LoRA section) of a connector, between the vision encoder and the language
    model, that has no linear layer to get an adapter (Gemma 3 projects by a bare weight matrix): it stays as
    loaded, never silently; None when it trains."""
    tower = {id(p) for p in vision_tower(model).parameters()}
    connector = [(n, p) for n, p in vision_side_parameters(model) if id(p) not in tower]
    if not connector or any(p.requires_grad for _, p in connector):
        return None
    modules = {n.rsplit(".", 1)[0] for n, _ in connector}
    names = sorted(m for m in modules if not any(m.startswith(o + ".") for o in modules))
    return (
        f"{key}: the connector of this vision-language model ({', '.join(names[:3])}) has no linear layer to put an "
        "adapter on: it stays as loaded; the adapters train the language model"
    )


def language_model(model: Any) -> Any:
    """The language model inside a transformers vision-language model: the module holding its decoder layers
    (``model.model.text_model`` in Idefics3/SmolVLM, ``model.model.language_model`` in LLaVA and Qwen-VL)."""
    inner = getattr(model, "model", model)
    for name in ("text_model", "language_model"):
        found = getattr(inner, name, None)
        if found is not None and getattr(found, "layers", None) is not None:
            return found
    raise ValueError(f"{type(model).__name__}: no language model found (looked for text_model, language_model)")


def add_value_head(model: Any, weights: bool) -> None:
    """A vision-language model as a critic: its LM head replaced by a scalar head (``lm_head``, hidden -> 1, with a
    bias, initialised as a token-classification head: normal(0, initializer_range), bias 0), so the same forward
    (pixels, image masks, 3-D positions) gives one value per token as ``logits`` [B, L, 1]. transformers has no
    token-classification class for vision-language models. The head is tied to nothing, and no logit soft-capping
    applies to values. ``weights``: false for an architecture on the meta device (the head's there too)."""
    import torch

    text = model.config.get_text_config()
    hidden = text.hidden_size
    std = getattr(text, "initializer_range", None) or getattr(model.config, "initializer_range", None) or 0.02
    with torch.device("meta") if not weights else nullcontext():
        head = torch.nn.Linear(hidden, 1, dtype=torch.float32)
    if weights:
        with torch.no_grad():
            head.weight.normal_(0.0, std)
            head.bias.zero_()
    model.lm_head = head
    for cfg in {id(model.config): model.config, id(text): text}.values():
        cfg.tie_word_embeddings = False
        if getattr(cfg, "final_logit_softcapping", None) is not None:
            cfg.final_logit_softcapping = None
