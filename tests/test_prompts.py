"""Prompt rendering and encoding (plugrl.prompts) with the real SmolLM2 tokenizer."""

from __future__ import annotations

import pytest

from plugrl.config import DataConfig
from plugrl.data import DataError, Sample
from plugrl.prompts import EncodedPrompt, encode_prompts, render_prompt
from plugrl.specs import Registry, TemplateSpec

SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM"


def chat(text: str = "What is 2 + 2?", i: int = 0, **row) -> Sample:
    return Sample(
        prompt=[{"role": "user", "content": text}],
        data_source="toy",
        ground_truth="4",
        row={"question": text, **row},
        origin=f"data/train.parquet row {i}",
    )


def raw(text: str = "Q: 2 + 2 =", i: int = 0) -> Sample:
    return Sample(prompt=text, data_source="toy", ground_truth="4", row={}, origin=f"data/raw.jsonl line {i + 1}")


def test_chat_template_applied(smol_tokenizer):
    text = render_prompt(chat(), DataConfig(), smol_tokenizer, Registry())
    assert text.startswith("<|im_start|>system\n" + SMOL_SYSTEM)  # the template's default system message
    assert text.endswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
    [enc], counts = encode_prompts([chat()], DataConfig(), smol_tokenizer, Registry())
    assert isinstance(enc, EncodedPrompt) and enc.text == text
    # special tokens come from the template only, never twice
    assert enc.ids == smol_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert enc.ids.count(smol_tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3
    assert counts["data/prompts"] == 1 and counts["data/filtered_overlong"] == 0


def test_system_prompt_with_chat_template(smol_tokenizer):
    cfg = DataConfig(system_prompt="Answer in one word.")
    text = render_prompt(chat(), cfg, smol_tokenizer, Registry())
    assert text.startswith("<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\n")
    assert SMOL_SYSTEM not in text
    # a system message in the data is kept; the configured one is not added
    s = chat()
    s.prompt = [{"role": "system", "content": "Data's own."}, *s.prompt]
    text = render_prompt(s, cfg, smol_tokenizer, Registry())
    assert "Data's own." in text and "Answer in one word." not in text


def test_prefill_is_appended_at_the_end(smol_tokenizer):
    cfg = DataConfig(prefill="<think>", system_prompt="Be brief.")
    text = render_prompt(chat(), cfg, smol_tokenizer, Registry())
    assert text.endswith("<|im_start|>assistant\n<think>")
    assert render_prompt(raw(), cfg, smol_tokenizer, Registry()) == "Be brief.\nQ: 2 + 2 =<think>"


def test_raw_text_prompt(smol_tokenizer):
    cfg = DataConfig()
    [enc], _ = encode_prompts([raw()], cfg, smol_tokenizer, Registry())
    assert enc.text == "Q: 2 + 2 ="  # no chat template on raw text
    assert enc.ids == smol_tokenizer("Q: 2 + 2 =")["input_ids"]  # tokenizer defaults for raw text
    assert render_prompt(raw(), DataConfig(system_prompt="S"), smol_tokenizer, Registry()) == "S\nQ: 2 + 2 ="


def test_messages_without_chat_template(smol_tokenizer, monkeypatch, caplog):
    cfg = DataConfig(apply_chat_template=False, system_prompt="Sys")
    expected = "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(chat("hi"), cfg, smol_tokenizer, Registry()) == expected
    # no default system message of the tokenizer's template when the data has none
    no_sys = render_prompt(chat("hi"), DataConfig(apply_chat_template=False), smol_tokenizer, Registry())
    assert no_sys == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" and SMOL_SYSTEM not in no_sys
    monkeypatch.setattr(smol_tokenizer, "chat_template", None)
    [enc], _ = encode_prompts([chat("hi")], DataConfig(), smol_tokenizer, Registry())
    assert enc.text == "user: hi\nassistant:"
    assert "no chat template" in caplog.text


def test_chat_template_off_renders_the_single_file_trainers_chatml(smol_tokenizer):
    """A single-file GRPO trainer for Qwen models (TinyZero's countdown prompt) skips the chat template and
    writes ChatML by hand, the assistant's turn opened with its first words; rows of chat messages and
    ``data.apply_chat_template: false`` plus the same opening as ``data.prefill`` give the same text and ids."""
    system = "You are a careful assistant. Think first, then answer."
    user = " Using the numbers [3, 5, 2], make 16. Use + - * / and each number once. Answer in <answer> </answer>."
    # built by hand, as such a script writes it
    expected = (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\nLet me solve this step by step.\n<think>"
    )
    s = Sample(
        prompt=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        data_source="countdown",
        ground_truth=None,
        row={"target": 16, "nums": [3, 5, 2]},
        origin="countdown.jsonl line 1",
    )
    cfg = DataConfig(apply_chat_template=False, prefill="Let me solve this step by step.\n<think>")
    assert render_prompt(s, cfg, smol_tokenizer, Registry()) == expected
    [enc], _ = encode_prompts([s], cfg, smol_tokenizer, Registry())
    assert enc.text == expected and enc.messages is None
    assert enc.ids == smol_tokenizer.encode(expected)  # the script's tokenizer.encode(prompt)
    assert enc.ids.count(smol_tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3  # real special tokens
    # a ChatML chat template (SmolLM2's, like Qwen's) renders a conversation with a system message the same way
    templated = render_prompt(s, DataConfig(prefill=cfg.prefill), smol_tokenizer, Registry())
    assert templated == expected


def test_raw_template_placeholders(smol_tokenizer):
    s = chat("2 + 2", nums=[1, 3], target=4)
    s.extra_info = {"index": 7}
    cfg = DataConfig(
        raw_template="Use {nums} to make {target}. [{data_source}/{ground_truth}/{extra_info[index]}] {prompt}"
    )
    text = render_prompt(s, cfg, smol_tokenizer, Registry())
    assert text == "Use [1, 3] to make 4. [toy/4/7] 2 + 2"
    cfg = DataConfig(raw_template="{question} = {{?}}", prefill=" Answer:")
    assert render_prompt(s, cfg, smol_tokenizer, Registry()) == "2 + 2 = {?} Answer:"


def test_raw_template_missing_placeholder(smol_tokenizer):
    cfg = DataConfig(raw_template="Question: {questoin}")
    with pytest.raises(DataError) as e:
        render_prompt(chat(i=3), cfg, smol_tokenizer, Registry())
    msg = str(e.value)
    assert "data/train.parquet row 3" in msg and "{questoin}" in msg
    assert "available fields:" in msg and "question" in msg and "ground_truth" in msg
    with pytest.raises(DataError, match="not a valid template"):
        render_prompt(chat(), DataConfig(raw_template="a {} b"), smol_tokenizer, Registry())


def test_template_from_registry(smol_tokenizer):
    def countdown(sample):
        return [{"role": "user", "content": f"Make {sample.row['target']} from {sample.row['nums']}"}]

    def plain(sample):
        return f"Solve: {sample.row['question']}\n"

    reg = Registry(templates={"countdown": TemplateSpec("countdown", countdown), "plain": TemplateSpec("plain", plain)})
    s = chat(nums=[2, 2], target=4)
    text = render_prompt(s, DataConfig(template="countdown", prefill="<think>"), smol_tokenizer, reg)
    assert "<|im_start|>user\nMake 4 from [2, 2]<|im_end|>" in text and text.endswith("assistant\n<think>")
    [enc], _ = encode_prompts([s], DataConfig(template="plain"), smol_tokenizer, reg)
    assert enc.text == "Solve: What is 2 + 2?\n"
    # the template wins over raw_template
    assert render_prompt(s, DataConfig(template="plain", raw_template="{x}"), smol_tokenizer, reg).startswith("Solve")


def test_template_errors(smol_tokenizer):
    reg = Registry(
        templates={
            "b": TemplateSpec("b", lambda s: "x"),
            "a": TemplateSpec("a", lambda s: "x"),
            "bad": TemplateSpec("bad", lambda s: [{"role": "robot", "content": "x"}], plugin="myplug"),
            "boom": TemplateSpec("boom", lambda s: s.row["missing"]),
        }
    )
    with pytest.raises(DataError, match="unknown prompt template 'c'.*registered templates: a, b, bad, boom"):
        encode_prompts([chat()], DataConfig(template="c"), smol_tokenizer, reg)
    with pytest.raises(DataError, match="registered templates: none"):
        render_prompt(chat(), DataConfig(template="c"), smol_tokenizer, Registry())
    with pytest.raises(DataError, match=r"row 0: template 'bad' \(plugin myplug\) returned .*role 'robot'"):
        render_prompt(chat(), DataConfig(template="bad"), smol_tokenizer, reg)
    with pytest.raises(DataError, match="row 0: template 'boom' raised KeyError"):
        render_prompt(chat(), DataConfig(template="boom"), smol_tokenizer, reg)


def test_skip_invalid_prompts(smol_tokenizer):
    reg = Registry(templates={"t": TemplateSpec("t", lambda s: s.row.get("q") or "")})
    samples = [chat(q="fine"), chat(i=1), chat(q="also fine", i=2)]
    with pytest.raises(DataError, match="row 1: the prompt is empty"):
        encode_prompts(samples, DataConfig(template="t"), smol_tokenizer, reg)
    out, counts = encode_prompts(samples, DataConfig(template="t", skip_invalid=True), smol_tokenizer, reg)
    assert [e.text for e in out] == ["fine", "also fine"] and counts["data/invalid_prompts"] == 1


def long_and_short(n: int = 40) -> list[Sample]:
    return [raw("word " * n, 0), raw("short", 1), raw("word " * (n + 5), 2), raw("tiny", 3)]


def test_overlong_filter_count(smol_tokenizer):
    cfg = DataConfig(max_prompt_length=20, filter_overlong_prompts=True)
    out, counts = encode_prompts(long_and_short(), cfg, smol_tokenizer, Registry())
    assert [e.sample.origin for e in out] == ["data/raw.jsonl line 2", "data/raw.jsonl line 4"]
    assert counts["data/filtered_overlong"] == 2 and counts["data/prompts"] == 2
    assert all(len(e.ids) <= 20 for e in out)
    with pytest.raises(DataError, match="no prompts left of 1: 1 longer than data.max_prompt_length=20"):
        encode_prompts(long_and_short()[:1], cfg, smol_tokenizer, Registry())


def test_truncation_error_message(smol_tokenizer):
    cfg = DataConfig(max_prompt_length=20, filter_overlong_prompts=False, truncation="error")
    n = len(smol_tokenizer("word " * 40)["input_ids"])
    with pytest.raises(DataError) as e:
        encode_prompts(long_and_short(), cfg, smol_tokenizer, Registry())
    msg = str(e.value)
    assert "data/raw.jsonl line 1" in msg and f"{n} tokens" in msg and "data.max_prompt_length=20" in msg
    assert "raise data.max_prompt_length" in msg and "data.filter_overlong_prompts" in msg


def test_truncation_left_and_right(smol_tokenizer):
    full = smol_tokenizer("word " * 40 + "END")["input_ids"]
    sample = raw("word " * 40 + "END")
    left, counts = encode_prompts(
        [sample],
        DataConfig(max_prompt_length=8, filter_overlong_prompts=False, truncation="left"),
        smol_tokenizer,
        Registry(),
    )
    assert left[0].ids == full[-8:] and counts["data/truncated"] == 1
    assert left[0].text.endswith("END") and left[0].text == smol_tokenizer.decode(full[-8:])
    right, _ = encode_prompts(
        [sample],
        DataConfig(max_prompt_length=8, filter_overlong_prompts=False, truncation="right"),
        smol_tokenizer,
        Registry(),
    )
    assert right[0].ids == full[:8] and "END" not in right[0].text
    # short prompts are untouched
    [same], counts = encode_prompts(
        [raw()],
        DataConfig(max_prompt_length=8, filter_overlong_prompts=False, truncation="left"),
        smol_tokenizer,
        Registry(),
    )
    assert same.text == "Q: 2 + 2 =" and counts["data/truncated"] == 0
