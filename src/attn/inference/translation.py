"""Translating text with an encoder-decoder: what `attn translate` and the server's `/v1/translate` call.

Every translation reads its sources through `Bundle.encode_sources` and decodes under `Bundle.generation_config`,
so the model's decoding rules apply to all of them, attention maps included.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from attn.inference.inputs import checked_texts, expect_model
from attn.artifacts import Bundle
from attn.data.samplers import length_batches
from attn.decoding import GenerationConfig, generate_seq2seq
from attn.decoding.beam_search import Hypothesis, beam_search_seq2seq
from attn.models import EncoderDecoder

Result = TypeVar("Result")
# Source tokens (padding included) a batch holds at most: beam search of a marian-base model over 30-token
# sources ran fastest with about 64 sentences a batch, and a step's cost grows with rows times length.
BATCH_TOKENS = 2048


def translate(bundle: Bundle, texts: Sequence[str], config: GenerationConfig | None = None,
              batch_tokens: int = BATCH_TOKENS) -> list[str]:
    """Translates each text with the encoder-decoder (the paper's beam 4, alpha 0.6 by default).

    Texts are decoded in batches of similar length of at most `batch_tokens` source tokens, padding included (a
    longer source gets a batch of its own); the translations come back in the input order.

    Example (an untrained model, so the words are random; a trained one is loaded with `load_model`):
        >>> import torch
        >>> from attn import Bundle, GenerationConfig, Tokenizer, build_model, preset, translate
        >>> tokenizer = Tokenizer.train_chars(["in the beginning", "en el principio"])
        >>> config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size)
        >>> _ = torch.manual_seed(0)
        >>> bundle = Bundle(model=build_model(config).eval(), tokenizer=tokenizer, task="translation",
        ...                 model_config=config, path=".", start_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
        ...                 pad_id=tokenizer.pad_id)
        >>> outputs = translate(bundle, ["in the beginning"], GenerationConfig(max_new_tokens=5))
        >>> len(outputs), len(outputs[0]) <= 5
        (1, True)
    """
    return bundle.tokenizer.decode_batch(translation_ids(bundle, source_ids(bundle, texts), config, batch_tokens))


def translation_ids(bundle: Bundle, sources: list[list[int]], config: GenerationConfig | None = None,
                    batch_tokens: int = BATCH_TOKENS) -> list[list[int]]:
    """The output ids (no start token, no EOS) that `translate` decodes for these source ids, batched as it does."""
    expect_model(bundle, EncoderDecoder, "translation")
    config = bundle.generation_config(config or GenerationConfig.paper())
    return _in_length_order(sources, batch_tokens, lambda chunk: generate_seq2seq(
        bundle.model, chunk, bundle.start_id, bundle.eos_id, bundle.pad_id, config))


def translate_n_best(bundle: Bundle, text: str, config: GenerationConfig) -> list[tuple[str, float]]:
    """The n best translations of one text with their scores (under `bundle.rules`, as `translate`)."""
    (hypotheses,) = translate_hypotheses(bundle, [text], config)
    return [(bundle.tokenizer.decode(h.tokens), h.score) for h in hypotheses]


def translate_hypotheses(bundle: Bundle, texts: Sequence[str], config: GenerationConfig,
                         batch_tokens: int = BATCH_TOKENS) -> list[list[Hypothesis]]:
    """The `config.n_best` best beam-search translations of each text (any beam size, 1 too), best first.

    The tokens of each hypothesis hold no start token and no EOS."""
    config = bundle.generation_config(config)
    return _in_length_order(source_ids(bundle, texts), batch_tokens, lambda chunk: beam_search_seq2seq(
        bundle.model, chunk, bundle.start_id, bundle.eos_id, bundle.pad_id, config))


def source_ids(bundle: Bundle, texts: Sequence[str]) -> list[list[int]]:
    """The source ids of each text (without its surrounding white space) that `translate` feeds the encoder.

    Raises:
        AttnError: the model is not an encoder-decoder.
        GenerationError: no texts, or a blank one.
    """
    expect_model(bundle, EncoderDecoder, "translation")
    return bundle.encode_sources(checked_texts(texts))


def _in_length_order(sources: list[list[int]], batch_tokens: int,
                     run: Callable[[list[list[int]]], list[Result]]) -> list[Result]:
    """`run` on batches of similar source length within the token budget; results come back in the input order."""
    outputs: list[Result] = [None] * len(sources)  # type: ignore[list-item]
    with torch.inference_mode():
        for batch in length_batches([len(s) for s in sources], max_rows=batch_tokens, max_tokens=batch_tokens):
            for i, result in zip(batch, run([sources[i] for i in batch]), strict=True):
                outputs[i] = result
    return outputs
