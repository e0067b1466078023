"""What a model family's `generate` does besides the decoding options: `DecodingRules`.

`transformers` applies some rules of a checkpoint whatever the caller asks: Marian's tokenizer ends every source
with `</s>`, its decoder starts from the pad id, opus-mt bans the pad token and forces `</s>` as the last token
allowed. `Bundle.encode_sources` and `Bundle.generation_config` apply them to every translation, and an imported
checkpoint keeps them in its task.json.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from attn.decoding import GenerationConfig
from attn.core.errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class DecodingRules:
    """The rules a checkpoint decodes under, whatever the decoding options.

    Attributes:
        frame_sources: sources are encoded with the tokenizer's frame (Marian's `… </s>`); attn's own
            translation models read sources without one.
        start_id: the decoder's first input when it is not the tokenizer's bos (Marian: the pad id).
        suppress: ids never generated (the single-token entries of `bad_words_ids`).
        force_eos: the last token allowed is EOS (`forced_eos_token_id` is the EOS id).
    """

    frame_sources: bool = False
    start_id: int | None = None
    suppress: tuple[int, ...] = ()
    force_eos: bool = False

    def applied_to(self, config: GenerationConfig) -> GenerationConfig:
        """`config` with these bans and the forced EOS added to its own."""
        suppress = tuple(sorted({*config.suppress, *self.suppress}))
        return dataclasses.replace(config, suppress=suppress, force_eos=config.force_eos or self.force_eos)

    def to_json(self) -> dict[str, Any]:
        """The JSON object `from_json` reads (stored in an imported checkpoint's task.json)."""
        return {**dataclasses.asdict(self), "suppress": list(self.suppress)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> DecodingRules:
        """Reads `to_json`'s object; None gives the defaults, an unknown key or wrong type a CheckpointError."""
        if data is None:
            return cls()
        fields = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, Mapping) or set(data) - fields:
            raise CheckpointError(f"task.json: 'decoding' must be an object with keys among {sorted(fields)}, "
                                  f"got {data!r}; convert the model again")
        suppress = data.get("suppress", [])
        start = data.get("start_id")
        if not (isinstance(suppress, list) and all(type(i) is int for i in suppress)) or not (
                start is None or type(start) is int):
            raise CheckpointError(f"task.json: 'decoding' has ids that are not integers ({data!r}); "
                                  "convert the model again")
        return cls(bool(data.get("frame_sources", False)), start, tuple(suppress), bool(data.get("force_eos", False)))


def hf_decoding_rules(settings: Mapping[str, Any], start_id: int | None, frame_sources: bool = False) -> DecodingRules:
    """The rules that `generate` reads from a directory's generation settings.

    Args:
        settings: generation_config.json when the directory has one, else config.json.
        start_id: config.json's `decoder_start_token_id`, used when `settings` has none.
        frame_sources: whether the family's tokenizer frames sources (a tokenizer fact, not a setting).

    Raises:
        CheckpointError: a multi-token `bad_words_ids` entry, or a `forced_eos_token_id` other than the EOS id.
    """
    bad = settings.get("bad_words_ids") or []
    if not all(isinstance(words, list) and len(words) == 1 and type(words[0]) is int for words in bad):
        raise CheckpointError(f"generation settings: bad_words_ids={bad!r} bans token sequences; attn bans "
                              "single tokens only: keep the one-token entries")
    forced, eos = _one_id(settings.get("forced_eos_token_id")), _one_id(settings.get("eos_token_id"))
    if forced is not None and forced != eos:
        raise CheckpointError(f"generation settings: forced_eos_token_id={forced} is not eos_token_id={eos}; "
                              "attn forces only the EOS token: make them equal or remove forced_eos_token_id")
    start = settings.get("decoder_start_token_id", start_id)
    return DecodingRules(frame_sources, start, tuple(sorted({words[0] for words in bad})), forced is not None)


def _one_id(value: Any) -> int | None:
    """`transformers` accepts one id or a list of them; a list of one is that id."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value
