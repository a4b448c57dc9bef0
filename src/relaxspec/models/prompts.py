"""From prompt text to token ids, as Hugging Face does it, the context-length guard rail, and a digest of a
tokenizer's vocabulary (`vocab_key`: the pair check and the weight cache).

With a chat template (instruction-tuned models such as SmolLM2-Instruct) a prompt is the user turn of a
conversation, optionally after a system turn, followed by the assistant's generation prompt:
`tokenizer.apply_chat_template(messages, add_generation_prompt=True)`. Without one (the built-in family)
a prompt is encoded as plain text, `tokenizer(prompt)["input_ids"]`. A template is applied once: under
"auto" a prompt that already holds the template's markers (e.g. `<|im_start|>`) is left as it is, and a
prompt given as a list of messages ({"role", "content"} dicts) is one conversation, templated as a whole.
"""

from __future__ import annotations

import hashlib
import json

CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_markers(tokenizer) -> list[str]:
    """The tokenizer's special tokens that its chat template writes around a turn (e.g. `<|im_start|>`)."""
    if not has_chat_template(tokenizer):
        return []
    sentinel = "\u2063relaxspec\u2063"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": sentinel}], tokenize=False,
                                             add_generation_prompt=True).replace(sentinel, "")
    return [t for t in getattr(tokenizer, "all_special_tokens", []) if len(t) > 1 and t in rendered]


def _is_conversation(prompt) -> bool:
    return (isinstance(prompt, (list, tuple)) and bool(prompt)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in prompt))


def prompt_list(prompts) -> list:
    """`prompts` as a list: a string or a list of messages is one prompt; any other iterable (a list, a
    generator) is read once. Bytes and non-iterables are a ValueError, as is an empty list."""
    if isinstance(prompts, str) or _is_conversation(prompts):
        return [prompts]
    if isinstance(prompts, (bytes, bytearray)) or not hasattr(prompts, "__iter__") or isinstance(prompts, dict):
        raise ValueError(f"prompts must be a string, a list of strings or a list of messages, "
                         f"got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts given")
    return prompts


def check_text(text: str, what: str) -> None:
    """ValueError '<what> holds a lone surrogate ...' for a string that is not Unicode text (a surrogate code point
    without its pair, e.g. JSON's "\\ud800" alone, which no tokenizer can encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} holds a lone surrogate (U+{ord(text[e.start]):04X} at character {e.start}), which "
                         "is not text: give the character itself, or both halves of its surrogate pair") from None


def encode_prompts(tokenizer, prompts, *, chat_template: str = "auto", system: str | None = None) -> list[list[int]]:
    """Token ids of each prompt. chat_template "auto": through the tokenizer's chat template when it has one,
    unless the prompt already holds the template's markers (already templated: left as it is), plain text
    otherwise; "on": the template is required; "off": plain text. A prompt may be a list of messages
    ({"role", "content"} dicts; a list of such dicts alone is one prompt), templated once as a whole.
    `system` is a system turn (needs a template). An empty or whitespace-only prompt is a ValueError naming
    its index."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"chat_template must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")
    prompts = prompt_list(prompts)
    for i, prompt in enumerate(prompts):
        if _is_conversation(prompt):
            for message in prompt:
                check_text(message["content"], f"prompt {i} ({message['role']} turn)")
            continue
        if not isinstance(prompt, str):
            raise ValueError(f"prompt {i} is not a string or a list of {{'role', 'content'}} messages "
                             f"({type(prompt).__name__})")
        if not prompt.strip():
            raise ValueError(f"prompt {i} is empty or whitespace only")
        check_text(prompt, f"prompt {i}")
    wants = chat_template == "on" or (chat_template == "auto" and has_chat_template(tokenizer))
    if (wants or any(_is_conversation(p) for p in prompts)) and not has_chat_template(tokenizer):
        raise ValueError(f"chat_template {chat_template!r} or a list of messages asked for a chat template, but "
                         "the tokenizer has no chat template (use 'auto' or 'off' with text prompts)")
    if chat_template == "off" and any(_is_conversation(p) for p in prompts):
        raise ValueError("a list of messages needs the chat template, and chat_template is 'off'")
    markers = chat_markers(tokenizer) if chat_template == "auto" else []
    templated = [_is_conversation(p) or (wants and not any(m in p for m in markers)) for p in prompts]
    if system is not None and not all(templated):
        i = templated.index(False)
        raise ValueError(f"a system prompt needs a chat template, and prompt {i} does not get one "
                         f"(chat_template {chat_template!r}, tokenizer "
                         f"{'has one' if has_chat_template(tokenizer) else 'has none'}"
                         f"{', the prompt is already templated' if wants else ''})")
    head = [] if system is None else [{"role": "system", "content": system}]
    encoded = []
    for prompt, template in zip(prompts, templated):
        if not template:
            encoded.append(tokenizer(prompt)["input_ids"])
            continue
        messages = list(prompt) if _is_conversation(prompt) else [{"role": "user", "content": prompt}]
        if messages[0]["role"] == "system" and head:
            raise ValueError("a system prompt was given, and the messages already start with a system turn")
        encoded.append(list(tokenizer.apply_chat_template(head + messages, add_generation_prompt=True, tokenize=True,
                                                          return_dict=True)["input_ids"]))
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"prompt {i} encodes to no tokens")
    return encoded


def context_limit(*models) -> int | None:
    """The smallest `max_position_embeddings` of the models (None when no model states one; a drafter
    without a context of its own, e.g. prompt lookup or a head on the verifier's features, states none)."""
    limits = [getattr(lm, "max_position_embeddings", None) for lm in models]
    limits = [limit for limit in limits if limit]
    return min(limits) if limits else None


def check_context(prompt_ids: list[list[int]], max_new_tokens: int, *models, truncate: bool = False) -> list[list[int]]:
    """Guard rail before generating: every prompt plus `max_new_tokens` must fit in the context of every model
    (verifier and drafter). A prompt that does not fit is a ValueError naming it, unless `truncate`: then its
    oldest tokens are dropped (left truncation) so that it fits. Returns the (possibly truncated) ids."""
    limit = context_limit(*models)
    if limit is None:
        return prompt_ids
    if max_new_tokens >= limit:
        raise ValueError(f"max_new_tokens {max_new_tokens} leaves no room for a prompt in the context of "
                         f"{limit} positions; use at most {limit - 1}")
    room = limit - max_new_tokens
    out = []
    for i, ids in enumerate(prompt_ids):
        if len(ids) > room and not truncate:
            what = ("is longer than the model's context" if len(ids) >= limit
                    else f"+ max_new_tokens {max_new_tokens} exceeds the model's context")
            raise ValueError(f"prompt {i} ({len(ids)} tokens) {what} of {limit} positions; shorten it or lower "
                             f"max_new_tokens")
        out.append(ids[-room:] if len(ids) > room else ids)
    return out


def vocab_key(tokenizer) -> str:
    """A digest of the tokenizer's vocabulary, kept on the tokenizer while its size stays the same (generate checks
    the pair on every call; reading a vocabulary costs ~0.3 ms)."""
    cached = getattr(tokenizer, "_relaxspec_vocab_key", None)
    if cached is None or cached[0] != len(tokenizer):
        items = sorted(tokenizer.get_vocab().items())
        cached = (len(tokenizer), hashlib.sha256(json.dumps(items).encode()).hexdigest())
        try:
            tokenizer._relaxspec_vocab_key = cached
        except AttributeError:  # (a tokenizer that refuses attributes is read every time)
            pass
    return cached[1]
