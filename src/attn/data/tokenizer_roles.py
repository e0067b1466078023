"""The roles of a tokenizer's special tokens (pad, unk, bos, eos, cls, sep, mask) and the id of each.

A role's id is that of the first special token of the vocabulary whose text is one of the names in `ROLE_TOKENS`
(so GPT-2's `<|endoftext|>` is both bos and eos, BERT's `[CLS]`/`[SEP]` are cls/sep); a role with no such token
has id `None`. A file that states its roles' ids (a GGUF file: SmolLM2's bos is `<|im_start|>`) declares them
instead; `checked_roles` checks what it declares.
"""

from __future__ import annotations

from collections.abc import Mapping

import tokenizers as hf

from attn.core.errors import ConfigError

ROLE_TOKENS: dict[str, tuple[str, ...]] = {
    "pad": ("<pad>", "[PAD]"),
    "unk": ("<unk>", "[UNK]"),
    "bos": ("<s>", "<|endoftext|>"),
    "eos": ("</s>", "<|endoftext|>"),
    "cls": ("<cls>", "[CLS]"),
    "sep": ("<sep>", "[SEP]"),
    "mask": ("<mask>", "[MASK]"),
}


def find_roles(added_tokens: Mapping[int, hf.AddedToken]) -> dict[str, int | None]:
    """Role -> id for every role of `ROLE_TOKENS`, found by name among the special tokens; None where none is.

    Args:
        added_tokens: the vocabulary's added tokens by id (`get_added_tokens_decoder()` of a pipeline).
    """
    specials = {t.content: i for i, t in added_tokens.items() if t.special}
    return {
        role: next((specials[name] for name in names if name in specials), None)
        for role, names in ROLE_TOKENS.items()
    }


def checked_roles(roles: object, vocab_size: int) -> dict[str, int | None]:
    """Roles that a file declares, checked: known role names, each an id of the vocabulary or None.

    Raises:
        ConfigError: not a mapping, an unknown role, or an id outside 0 to `vocab_size` - 1.
    """
    if not isinstance(roles, Mapping):
        raise ConfigError("roles", f"expected a mapping of role names to ids, got {type(roles).__name__}")
    for role, token_id in roles.items():
        if role not in ROLE_TOKENS:
            raise ConfigError("roles", f"unknown role {role!r}; use one of {', '.join(ROLE_TOKENS)}")
        in_vocab = isinstance(token_id, int) and not isinstance(token_id, bool) and 0 <= token_id < vocab_size
        if token_id is not None and not in_vocab:
            raise ConfigError("roles", f"{role} id {token_id!r} is not an id of this vocabulary (0 to {vocab_size - 1})")
    return dict(roles)
