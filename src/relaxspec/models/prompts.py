"""From prompt text to token ids, as Hugging Face does it, and the context-length guard rail.

With a chat template (instruction-tuned models such as SmolLM2-Instruct) a prompt is the user turn of a
conversation, optionally after a system turn, followed by the assistant's generation prompt:
`tokenizer.apply_chat_template(messages, add_generation_prompt=True)`. Without one (the built-in family)
a prompt is encoded as plain text, `tokenizer(prompt)["input_ids"]`.
"""

from __future__ import annotations

CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_prompts(tokenizer, prompts, *, chat_template: str = "auto", system: str | None = None) -> list[list[int]]:
    """Token ids of each prompt. chat_template "auto": through the tokenizer's chat template when it has one,
    plain text otherwise; "on": the template is required; "off": plain text. `system` is a system turn (needs
    a template). An empty or whitespace-only prompt is a ValueError naming its index."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"chat_template must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")
    if isinstance(prompts, str):
        prompts = [prompts]
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts given")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise ValueError(f"prompt {i} is not a string ({type(prompt).__name__})")
        if not prompt.strip():
            raise ValueError(f"prompt {i} is empty or whitespace only")
    templated = chat_template == "on" or (chat_template == "auto" and has_chat_template(tokenizer))
    if templated and not has_chat_template(tokenizer):
        raise ValueError("chat_template 'on' asked for, but the tokenizer has no chat template "
                         "(use 'auto' or 'off')")
    if system is not None and not templated:
        raise ValueError("a system prompt needs a chat template, and this one is not used "
                         f"(chat_template {chat_template!r}, tokenizer "
                         f"{'has one' if has_chat_template(tokenizer) else 'has none'})")
    if not templated:
        encoded = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    else:
        head = [] if system is None else [{"role": "system", "content": system}]
        encoded = [list(tokenizer.apply_chat_template(head + [{"role": "user", "content": prompt}],
                                                      add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)["input_ids"])
                   for prompt in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise ValueError(f"prompt {i} encodes to no tokens")
    return encoded


def context_limit(*models) -> int | None:
    """The smallest `max_position_embeddings` of the models (None when no model states one)."""
    limits = [lm.max_position_embeddings for lm in models if lm is not None and lm.max_position_embeddings]
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
            raise ValueError(f"prompt {i} ({len(ids)} tokens) {what} of {limit} positions; shorten it, lower "
                             f"max_new_tokens, or ask for truncation")
        out.append(ids[-room:] if len(ids) > room else ids)
    return out
