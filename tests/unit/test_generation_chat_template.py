"""Chat messages checked and rendered with a Jinja chat template, sandboxed (sie.worker.generation.chat_template)."""

from __future__ import annotations

import re

import pytest

from sie.worker.generation.chat_template import ChatTemplate, ChatTemplateError, normalize_messages

# SmolLM2's template, as the GGUF carries it: a default system turn unless the chat starts with one.
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_chatml_renders_turns_and_an_open_assistant_turn() -> None:
    template = ChatTemplate(CHATML)
    prompt = template.render([{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    own_system = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}]
    closed = template.render(own_system, add_generation_prompt=False)
    assert closed == "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"


def test_special_tokens_and_block_trimming_follow_hugging_face() -> None:
    template = ChatTemplate(
        "{{ bos_token }}\n{% for m in messages %}\n  {{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    )
    # trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before one.
    assert template.render([{"role": "user", "content": "a"}], bos_token="<s>", eos_token="</s>") == "<s>\n  a</s>\n"


def test_text_parts_are_joined_and_other_keys_dropped() -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "input_text", "text": "two"}]
    turns = normalize_messages([{"role": "developer", "content": parts, "name": "dev"}])
    assert turns == [{"role": "developer", "content": "one\ntwo"}]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (["hello"], "messages[0] must be an object"),
        ([{"role": "tool", "content": "x"}], "messages[0].role must be one of"),
        ([{"content": "x"}], "messages[0].role must be one of"),
        ([{"role": "user", "content": 3}], "messages[0].content must be a string or a list"),
        ([{"role": "user"}], "messages[0].content must be a string or a list"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}], "messages[0].content[0] must be"),
        ([{"role": "user", "content": [{"type": "text", "text": None}]}], "messages[0].content[0].text"),
    ],
)
def test_malformed_messages_are_refused_with_their_place(messages: object, says: str) -> None:
    with pytest.raises(ChatTemplateError, match=re.escape(says)):
        ChatTemplate(CHATML).render(messages)


def test_a_template_may_refuse_with_raise_exception() -> None:
    template = ChatTemplate(
        "{% if messages[-1]['role'] != 'user' %}{{ raise_exception('the last turn must be the user') }}{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="the last turn must be the user"):
        template.render([{"role": "assistant", "content": "x"}])


def test_the_sandbox_refuses_unsafe_templates() -> None:
    escaping = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError):
        escaping.render([{"role": "user", "content": "x"}])
    mutating = ChatTemplate("{% set _ = messages.append(1) %}x")
    with pytest.raises(ChatTemplateError):
        mutating.render([{"role": "user", "content": "x"}])


def test_a_template_that_does_not_compile_is_refused() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for message in messages %}")


def test_the_environment_is_hugging_faces_loop_controls_tojson_strftime_now_and_generation_blocks() -> None:
    from datetime import datetime

    source = (
        "{% for message in messages %}{% if message['role'] == 'system' %}{% continue %}{% endif %}"
        "{% generation %}{{ message['content'] | tojson }}{% endgeneration %}{% if loop.index > 2 %}{% break %}"
        "{% endif %}{% endfor %}|{{ strftime_now('%Y') }}"
    )
    messages = [{"role": "system", "content": "skipped"}, {"role": "user", "content": "<a & 'é'>"},
                {"role": "assistant", "content": "two"}, {"role": "user", "content": "cut by break"}]  # fmt: skip
    rendered = ChatTemplate(source).render(messages)
    # JSON as json.dumps writes it (Jinja's own filter would escape <, >, & and '), non-ASCII kept
    assert rendered == f'"<a & \'é\'>""two"|{datetime.now().year}'


def test_an_instructed_prompt_leaves_the_system_and_user_text_as_placeholders() -> None:
    """An embedder's recipe that writes each text into the chat template (Qwen3-VL-Embedding's) reads the prompt once,
    with its placeholders; a template that drops a turn's text cannot give one."""
    prompt = ChatTemplate(CHATML).instructed_prompt("{instruction}", "{text}")
    assert (
        prompt
        == "<|im_start|>system\n{instruction}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"
    )
    without_system = "{% for m in messages if m['role'] == 'user' %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ChatTemplateError, match="does not show a system turn's and a user turn's text once each"):
        ChatTemplate(without_system).instructed_prompt("{instruction}", "{text}")
