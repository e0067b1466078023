"""Using a trained or imported model on text: what `attn translate/generate/classify/embed` call.

Each function takes a `Bundle` from `attn.artifacts.load_model` (an `attn` checkpoint, a run
directory, a local Hugging Face directory or a packaged model).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch import Tensor

from attn.app.embeddings import embed_texts
from attn.artifacts import Bundle
from attn.data.corpora import classifier_inputs, pad_batch
from attn.decoding import Decode, GenerationConfig, generate, generate_seq2seq, stream
from attn.decoding.attention_maps import attention_maps
from attn.decoding.beam_search import beam_search, beam_search_seq2seq
from attn.errors import AttnError, GenerationError
from attn.models import Decoder, Encoder, EncoderDecoder

_KIND_NAMES = {EncoderDecoder: "an encoder-decoder", Decoder: "a decoder-only", Encoder: "an encoder-only"}
DEFAULT_NEW_TOKENS = 200  # what `generate_stream` and `continue_texts` write when the config sets no limit
_WINDOW = 4  # the last tokens a stream decodes again with each new one (see `_complete_text`)


def _expect(loaded: Bundle, kind: type, what: str) -> None:
    if not isinstance(loaded.model, kind):
        raise AttnError(f"{loaded.path} holds {_KIND_NAMES[type(loaded.model)]} model ({loaded.task}); "
                        f"{what} needs {_KIND_NAMES[kind]} model: give a checkpoint trained for it")


def _checked(texts: Sequence[str]) -> list[str]:
    texts = [t.strip() for t in texts]
    if not texts or not all(texts):
        raise GenerationError("empty input text: give at least one non-blank line per input")
    return texts


def _texts_to_ids(loaded: Bundle, texts: Sequence[str], add_special: bool) -> list[list[int]]:
    return loaded.tokenizer.encode_batch(_checked(texts), add_special=add_special)


def translate(loaded: Bundle, texts: Sequence[str], config: GenerationConfig | None = None,
              batch_size: int = 32) -> list[str]:
    """Translates each text with the encoder-decoder (the paper's beam 4, alpha 0.6 by default).

    Texts are decoded in batches of similar source length (a batch runs until its longest
    translation ends), and returned in their input order. The model's `loaded.rules` apply on top
    of `config`, so an imported Marian model translates as `transformers`' `generate` does.

    Example (an untrained model, so the words are random; a trained one is loaded with `load_model`):
        >>> import torch
        >>> from attn import Bundle, GenerationConfig, Tokenizer, build_model, preset, translate
        >>> tokenizer = Tokenizer.train_chars(["in the beginning", "en el principio"])
        >>> config = preset("paper-base-tiny").replace(vocab_size=tokenizer.vocab_size)
        >>> _ = torch.manual_seed(0)
        >>> bundle = Bundle(build_model(config).eval(), tokenizer, "translation", config, ".", tokenizer.bos_id,
        ...                 tokenizer.eos_id, tokenizer.pad_id)
        >>> outputs = translate(bundle, ["in the beginning"], GenerationConfig(max_new_tokens=5))
        >>> len(outputs), len(outputs[0]) <= 5
        (1, True)
    """
    _expect(loaded, EncoderDecoder, "translation")
    config = loaded.rules.applied_to(config or GenerationConfig.paper())
    sources = _texts_to_ids(loaded, texts, add_special=loaded.rules.frame_sources)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[list[int]] = [[] for _ in sources]
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            decoded = generate_seq2seq(loaded.model, [sources[i] for i in chunk], loaded.start_id, loaded.eos_id,
                                       loaded.pad_id, config)
            for i, tokens in zip(chunk, decoded, strict=True):
                outputs[i] = tokens
    return loaded.tokenizer.decode_batch(outputs)


def translate_n_best(loaded: Bundle, text: str, config: GenerationConfig) -> list[tuple[str, float]]:
    """The n best translations of one text with their scores (under `loaded.rules`, as `translate`)."""
    _expect(loaded, EncoderDecoder, "translation")
    source = _texts_to_ids(loaded, [text], add_special=loaded.rules.frame_sources)
    with torch.inference_mode():
        (hypotheses,) = beam_search_seq2seq(
            loaded.model, source, loaded.start_id, loaded.eos_id, loaded.pad_id, loaded.rules.applied_to(config)
        )
    return [(loaded.tokenizer.decode(h.tokens), h.score) for h in hypotheses]


def generate_stream(loaded: Bundle, prompt: str, config: GenerationConfig) -> Iterator[str]:
    """Continues a prompt with the decoder-only model, yielding text pieces as tokens arrive.

    Pieces hold whole characters only, and end before the first of `config.stop` (text that may
    be the start of a stop string is held back until it is known not to be one); together they are
    the continuation's text as `cut_at_stop(tokenizer.decode(tokens), config.stop)` gives it.

    The prompt is checked and prefilled when this is called, so its errors come before any text.
    Without `config.max_new_tokens`, at most `DEFAULT_NEW_TOKENS` tokens are written, fewer when the
    model's positions run out first.

    Raises:
        GenerationError: the prompt is too long for the model, or the config asks for more tokens than fit.
    """
    _expect(loaded, Decoder, "text generation")
    ids = _prompt_ids(loaded, prompt)
    decode = loaded.tokenizer.decode
    tokens = stream(loaded.model, ids, _default_limit(config, loaded, len(ids)), eos_id=loaded.eos_id, decode=decode)
    return _text_pieces(tokens, decode, config.stop)


@dataclasses.dataclass(frozen=True)
class Continuation:
    """One continuation of a prompt.

    Attributes:
        text: the new text (no prompt), ending before the first stop string.
        score: the beam-search score (length-normalised log-probability); None unless beam search.
    """

    text: str
    score: float | None = None


def continue_texts(loaded: Bundle, prompts: Sequence[str], config: GenerationConfig, samples: int = 1,
                   batch_size: int = 32) -> list[list[Continuation]]:
    """Continues every prompt with the decoder-only model, in left-padded batches of similar prompt length.

    A prompt gets `samples` sampled continuations (`config.sample`), its `config.n_best` best
    beam-search hypotheses (`config.beam_size > 1`, best first), or its greedy continuation. Each
    text is what `generate_stream` would show. Without `config.max_new_tokens` a batch writes at
    most `DEFAULT_NEW_TOKENS` tokens, fewer when its longest prompt leaves less room.

    Args:
        loaded: a decoder-only model and its tokenizer.
        prompts: the prompts; an empty one starts from the start token.
        config: the decoding settings.
        samples: continuations drawn per prompt (more than one needs sampling).
        batch_size: rows decoded together (a prompt's samples are rows).

    Returns:
        For every prompt, in input order, its continuations.

    Raises:
        GenerationError: no prompts; `samples` < 1, or > 1 without sampling; a prompt too long for the model.
    """
    _expect(loaded, Decoder, "text generation")
    check_samples(samples, config)
    if not prompts:
        raise GenerationError("no prompts: give at least one, as an argument or as a non-blank line of the input file")
    ids = [_prompt_ids(loaded, prompt) for prompt in prompts]
    rows = [i for i in range(len(ids)) for _ in range(samples)]  # the prompt of each row
    order = sorted(range(len(rows)), key=lambda row: len(ids[rows[row]]))
    found: list[list[Continuation]] = [[] for _ in rows]
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = [ids[rows[row]] for row in chunk]
        for row, continuations in zip(chunk, _continue_batch(loaded, batch, config), strict=True):
            found[row] = continuations
    return [[c for row in range(i * samples, (i + 1) * samples) for c in found[row]] for i in range(len(prompts))]


def check_samples(samples: int, config: GenerationConfig) -> None:
    """Raises a GenerationError unless `samples` continuations per prompt can be drawn under `config`."""
    if samples < 1:
        raise GenerationError(f"samples: must be >= 1, got {samples}")
    if samples > 1 and not config.sample:
        raise GenerationError(f"samples: greedy decoding and beam search give one continuation per prompt; sample "
                              f"to draw {samples}, or ask beam search for its n best")


def _continue_batch(loaded: Bundle, prompts: list[list[int]], config: GenerationConfig) -> list[list[Continuation]]:
    config = _default_limit(config, loaded, max(map(len, prompts)))
    text = loaded.tokenizer.decode
    if config.beam_size > 1:
        found = beam_search(loaded.model, prompts, config, loaded.eos_id)
        return [[Continuation(cut_at_stop(text(h.tokens), config.stop), h.score) for h in hs] for hs in found]
    outputs = generate(loaded.model, prompts, config, loaded.eos_id, text)
    return [[Continuation(cut_at_stop(text(tokens), config.stop))] for tokens in outputs]


def _prompt_ids(loaded: Bundle, prompt: str) -> list[int]:
    """The prompt's ids; an empty prompt is the start token alone."""
    ids = loaded.tokenizer.encode(prompt) if prompt else []
    if not ids:
        if loaded.start_id is None:
            raise GenerationError("empty prompt and the tokenizer has no start token: give a prompt")
        ids = [loaded.start_id]
    return ids


def _default_limit(config: GenerationConfig, loaded: Bundle, longest: int) -> GenerationConfig:
    """`config` with `DEFAULT_NEW_TOKENS` as its limit when it sets none, fewer when the positions run out."""
    if config.max_new_tokens is not None:
        return config
    room = loaded.model.max_positions - longest + 1  # as in generation: the last token is never fed back
    return dataclasses.replace(config, max_new_tokens=max(1, min(DEFAULT_NEW_TOKENS, room)))


def _text_pieces(tokens: Iterable[int], decode: Decode, stop: Sequence[str] = ()) -> Iterator[str]:
    """The text of a token stream in pieces, as the tokens arrive; the pieces add up to
    `cut_at_stop(decode(all tokens), stop)`."""
    return _before_stop(_complete_text(tokens, decode), stop)


def _complete_text(tokens: Iterable[int], decode: Decode) -> Iterator[str]:
    """The new text of each token, in complete characters, decoding a window of the last few tokens only.

    A byte-level tokenizer (GPT-2, byte-bpe) decodes a character split across tokens as U+FFFD
    until its last byte arrives, so a final U+FFFD is held back until the next token (at the end,
    what is left is yielded as it decodes). The window keeps `_WINDOW` tokens: a UTF-8 character
    has at most 4 bytes and a token at least one, so an unfinished character always lies inside
    it, and the earlier tokens of the window give decoders that join tokens (a metaspace or a
    space between words) the context to render the newest one as the whole text does.
    """
    window: list[int] = []
    shown = ""  # the part of decode(window) already yielded
    for token in tokens:
        window.append(token)
        ready = _finished(decode(window))
        if len(ready) > len(shown):
            yield ready[len(shown):]
        shown = ready
        if len(window) > _WINDOW:
            window = window[-_WINDOW:]
            shown = _finished(decode(window))  # all of it was yielded but a held-back last character
    rest = decode(window)[len(shown):]
    if rest:
        yield rest



def _finished(text: str) -> str:
    """The text without a final U+FFFD, which may be the start of a character still to come."""
    return text[:-1] if text.endswith("\ufffd") else text


def _before_stop(pieces: Iterable[str], stop: Sequence[str]) -> Iterator[str]:
    """The pieces up to the first stop string, holding back text that may turn out to be the start of one."""
    held = ""
    for piece in pieces:
        held += piece
        end = stop_index(held, stop)
        if end is not None:
            if end:
                yield held[:end]
            return
        keep = max((n for s in stop for n in range(1, len(s)) if held.endswith(s[:n])), default=0)
        if len(held) > keep:
            yield held[: len(held) - keep]
            held = held[len(held) - keep :]
    if held:
        yield held


def stop_index(text: str, stop: Sequence[str]) -> int | None:
    """Where the first of the stop strings found in `text` starts, or None."""
    found = [i for i in (text.find(s) for s in stop) if i >= 0]
    return min(found, default=None)


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """The text before its first stop string: what `attn generate` shows of a continuation."""
    end = stop_index(text, stop)
    return text if end is None else text[:end]


@dataclasses.dataclass(frozen=True)
class Prediction:
    label: str
    probability: float
    probabilities: dict[str, float]


def classify(
    loaded: Bundle, texts: Sequence[str], batch_size: int = 64, pairs: Sequence[str] | None = None
) -> list[Prediction]:
    """The most probable label of each text (or text pair), with the class probabilities.

    A sentence-pair classifier (trained with a `text_pair_field`) takes `pairs`, the second text of
    each pair; it reads `[CLS] text [SEP] pair [SEP]` with segment ids 0 and 1 as in training.

    Example (an untrained classifier: the probabilities are near uniform):
        >>> import torch
        >>> from attn import Bundle, Tokenizer, build_model, classify, preset
        >>> tokenizer = Tokenizer.train_wordpiece(["a fine day", "a bad day"], 60)
        >>> config = preset("bert-base-tiny").replace(vocab_size=tokenizer.vocab_size, num_labels=2)
        >>> _ = torch.manual_seed(0)
        >>> bundle = Bundle(build_model(config).eval(), tokenizer, "classification", config, ".",
        ...                 pad_id=tokenizer.pad_id, label_names=["good", "bad"])
        >>> (prediction,) = classify(bundle, ["a fine day"])
        >>> prediction.label in {"good", "bad"}, round(sum(prediction.probabilities.values()), 5)
        (True, 1.0)
    """
    _expect(loaded, Encoder, "classification")
    if not loaded.label_names:
        raise AttnError(f"{loaded.path} is not a trained classifier (no label names); train one with task=classification")
    probs = class_probabilities(loaded, texts, batch_size, pairs)
    names = loaded.label_names
    return [
        Prediction(names[int(row.argmax())], float(row.max()), {n: float(p) for n, p in zip(names, row)})
        for row in probs
    ]


def class_probabilities(
    loaded: Bundle, texts: Sequence[str], batch_size: int = 64, pairs: Sequence[str] | None = None
) -> Tensor:
    """(N, num_labels) class probabilities of each text, or of each pair (texts[i], pairs[i])."""
    ids, segments = classifier_inputs(loaded.tokenizer, _checked(texts), _checked_pairs(loaded, texts, pairs),
                                      loaded.model.stack.max_positions)
    device = next(loaded.model.parameters()).device
    rows = []
    with torch.inference_mode():
        for start in range(0, len(ids), batch_size):
            tokens, mask = pad_batch(ids[start : start + batch_size], loaded.pad_id)
            inputs = [tokens, mask]
            if segments is not None:
                inputs.append(pad_batch(segments[start : start + batch_size], 0)[0])
            rows.append(loaded.model.classify(*(t.to(device) for t in inputs)).softmax(-1).cpu())
    return torch.cat(rows)


def _checked_pairs(loaded: Bundle, texts: Sequence[str], pairs: Sequence[str] | None) -> list[str] | None:
    """The second texts, checked against what the model was trained on."""
    pair_field, text_field = loaded.fields.text_pair_field, loaded.fields.text_field
    if pairs is None and pair_field:
        raise AttnError(f"{loaded.path} classifies sentence pairs ({text_field}, {pair_field}); give the second "
                        "text of each pair too (pairs=, or TEXT<TAB>PAIR lines on the command line)")
    if pairs is None:
        return None
    if not pair_field and loaded.imported is None:  # an imported model may have been trained on pairs
        raise AttnError(f"{loaded.path} classifies single texts ({text_field}); give no second texts")
    if len(pairs) != len(texts):
        raise AttnError(f"{len(texts)} texts but {len(pairs)} second texts; give one second text per text")
    return _checked(pairs)


def embed(loaded: Bundle, texts: Sequence[str], batch_size: int = 64) -> Tensor:
    """Mean-pooled, L2-normalised sentence embeddings (N, d_model), on the CPU.

    Example:
        >>> from attn import embed, load_model
        >>> minilm = load_model("all-MiniLM-L6-v2", "cpu")
        >>> vectors = embed(minilm, ["A man is eating food.", "A man eats a meal.", "The sky is blue."])
        >>> vectors.shape
        torch.Size([3, 384])
        >>> bool(vectors[0] @ vectors[1] > vectors[0] @ vectors[2])  # unit vectors: dot = cosine
        True
    """
    _expect(loaded, Encoder, "embedding")
    return embed_texts(loaded.model, loaded.tokenizer, _checked(texts), batch_size).cpu()


@dataclasses.dataclass(frozen=True)
class AttentionView:
    """One layer's attention on a text, ready to draw or to send.

    Attributes:
        weights: (queries, keys) float, one head's weights or the mean over heads.
        queries: the attending tokens (rows), as text pieces.
        keys: the attended tokens (columns).
        title: what is shown, e.g. "cross attention, layer -1, mean over heads".
    """

    weights: Tensor
    queries: list[str]
    keys: list[str]
    title: str


def attention_of(bundle: Bundle, text: str, kind: str, layer: int, head: int | None) -> AttentionView:
    """Runs the model on `text` and returns one layer's attention (one head, or the mean over heads).

    For an encoder-decoder, "cross" and "decoder" attention are taken over the model's own greedy
    translation of `text`: cross-attention then shows the alignment between source and output.

    Raises:
        AttnError: no such layer, head or kind of attention in this model.
    """
    tok = bundle.tokenizer
    source = tok.encode(text)
    target = None
    if isinstance(bundle.model, EncoderDecoder) and kind != "encoder":
        output = generate_seq2seq(bundle.model, [source], bundle.start_id, bundle.eos_id, bundle.pad_id,
                                  GenerationConfig())[0]
        target = [bundle.start_id, *output]
    weights = attention_maps(bundle.model, source, layer, kind, target)  # (h, Tq, Tk)
    if head is not None and not 0 <= head < weights.size(0):
        raise AttnError(f"head {head} does not exist: the model has heads 0..{weights.size(0) - 1}")
    chosen = weights.mean(0) if head is None else weights[head]
    pieces = [tok.id_to_token(i) or str(i) for i in source]
    target_pieces = [tok.id_to_token(i) or str(i) for i in target] if target else pieces
    queries, keys = {"cross": (target_pieces, pieces), "decoder": (target_pieces, target_pieces)}.get(
        kind, (pieces, pieces))
    which = "mean over heads" if head is None else f"head {head}"
    return AttentionView(chosen, queries, keys, f"{kind} attention, layer {layer}, {which}")
