"""Using a trained or imported model on text: what `attn translate/generate/classify/embed` call.

Each function takes a `Bundle` from `attn.artifacts.load_model` (an `attn` checkpoint, a run
directory, a local Hugging Face directory or a packaged model).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

import torch
from torch import Tensor

from attn.app.embeddings import embed_texts, encoder_batches
from attn.artifacts import Bundle
from attn.data.collate import pad_batch
from attn.data.framing import classifier_inputs
from attn.decoding import PAPER_EXTRA_LENGTH, Decode, GenerationConfig, generate, generate_seq2seq, stream
from attn.decoding.attention_maps import attention_maps, layer_count
from attn.decoding.beam_search import Hypothesis, beam_search, beam_search_seq2seq
from attn.errors import AttnError, GenerationError
from attn.models import Decoder, Encoder, EncoderDecoder

_KIND_NAMES = {EncoderDecoder: "an encoder-decoder", Decoder: "a decoder-only", Encoder: "an encoder-only"}
DEFAULT_NEW_TOKENS = 200  # what `generate_stream` and `continue_texts` write when the config sets no limit
_WINDOW = 4  # the last tokens a stream decodes again with each new one (see `_complete_text`)
Result = TypeVar("Result")


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
    sources = source_ids(loaded, texts)
    outputs = _in_length_order(sources, batch_size, lambda chunk: generate_seq2seq(
        loaded.model, chunk, loaded.start_id, loaded.eos_id, loaded.pad_id, config))
    return loaded.tokenizer.decode_batch(outputs)


def translate_n_best(loaded: Bundle, text: str, config: GenerationConfig) -> list[tuple[str, float]]:
    """The n best translations of one text with their scores (under `loaded.rules`, as `translate`)."""
    (hypotheses,) = translate_hypotheses(loaded, [text], config)
    return [(loaded.tokenizer.decode(h.tokens), h.score) for h in hypotheses]


def translate_hypotheses(loaded: Bundle, texts: Sequence[str], config: GenerationConfig,
                         batch_size: int = 32) -> list[list[Hypothesis]]:
    """The `config.n_best` best beam-search translations of each text (any beam size, 1 too), best first.

    Batched as `translate`, under `loaded.rules`; the tokens of each hypothesis hold no start token and no EOS.
    """
    _expect(loaded, EncoderDecoder, "translation")
    config = loaded.rules.applied_to(config)
    return _in_length_order(source_ids(loaded, texts), batch_size, lambda chunk: beam_search_seq2seq(
        loaded.model, chunk, loaded.start_id, loaded.eos_id, loaded.pad_id, config))


def alignment(loaded: Bundle, source: Sequence[int], output: Sequence[int]) -> Tensor:
    """(len(output), len(source)) cross-attention of the last decoder layer, mean over heads.

    Row i is how the decoder attended over the source ids when it chose output token i (its query
    is at decoder position i, whose input is the start token, then the output before token i).
    """
    _expect(loaded, EncoderDecoder, "alignment")
    weights = attention_maps(loaded.model, source, -1, "cross", [loaded.start_id, *output[:-1]])  # (h, T, S)
    return weights.mean(0)[: len(output)]  # no rows for an empty output


def source_ids(loaded: Bundle, texts: Sequence[str]) -> list[list[int]]:
    """The encoder-decoder's source ids of each text, framed as `loaded.rules` says (what `translate` feeds)."""
    return _texts_to_ids(loaded, texts, add_special=loaded.rules.frame_sources)


def _in_length_order(sources: list[list[int]], batch_size: int,
                     run: Callable[[list[list[int]]], list[Result]]) -> list[Result]:
    """`run` on batches of similar source length; its results come back in the input order."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: list[Result] = [None] * len(sources)  # type: ignore[list-item]
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            for i, result in zip(chunk, run([sources[i] for i in chunk]), strict=True):
                outputs[i] = result
    return outputs


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
    ids = prompt_ids(loaded, prompt)
    decode = loaded.tokenizer.decode
    tokens = stream(loaded.model, ids, _default_limit(config, loaded, len(ids)), eos_id=loaded.eos_id, decode=decode)
    return _text_pieces(tokens, decode, config.stop)


@dataclasses.dataclass(frozen=True)
class GeneratedToken:
    """One new token of a continuation, with its text and log-probabilities (see `CompletionText`).

    Attributes:
        id: the token id (the final EOS too).
        text: the text that arrives with this token; "" while text is held back (a character not
            yet complete, or what may be the start of a stop string: it comes with a later token).
        logprob: the token's log-probability under the scores it was chosen from.
        top: the most likely tokens of this step as (id, log-probability), best first.
        finish: None, except on the last token: "stop" (EOS or a stop string) or "length" (the limit).
    """

    id: int
    text: str
    logprob: float
    top: list[tuple[int, float]]
    finish: str | None = None


class CompletionText:
    """A continuation's tokens, pushed one at a time as a decoder chooses them, as `GeneratedToken`s.

    The texts of all tokens add up to what `generate_stream` shows for the same tokens (whole
    characters, nothing from the first stop string on). Log-probabilities are the log-softmax of
    the scores the token was chosen from (after the logit adjustments, before temperature, top-k
    and top-p), so sampling settings do not change them.

    Args:
        loaded: the decoder-only model's bundle (its tokenizer and EOS id).
        stop: the stop strings.
        top_logprobs: how many of each step's most likely tokens `GeneratedToken.top` holds.

    Example:
        >>> import torch
        >>> from attn import Bundle, Tokenizer, build_model, preset
        >>> tokenizer = Tokenizer.train_chars(["hello"])
        >>> config = preset("char-gpt-tiny").replace(vocab_size=tokenizer.vocab_size)
        >>> bundle = Bundle(build_model(config).eval(), tokenizer, "lm", config, ".", eos_id=tokenizer.eos_id)
        >>> text = CompletionText(bundle, stop=["lo"], top_logprobs=1)
        >>> scores = torch.zeros(tokenizer.vocab_size)
        >>> [text.push(tokenizer.token_to_id(c), scores, None).text for c in "hel"]
        ['h', 'e', '']
        >>> token = text.push(tokenizer.token_to_id("o"), scores, "stop")  # uniform scores: log(1 / V)
        >>> token.text, token.finish, round(token.logprob * -1 - torch.tensor(tokenizer.vocab_size).log().item(), 5)
        ('', 'stop', 0.0)
    """

    def __init__(self, loaded: Bundle, stop: Sequence[str] = (), top_logprobs: int = 0) -> None:
        self._text = TextStream(loaded.tokenizer.decode, stop)
        self._eos = loaded.eos_id
        self._top = top_logprobs

    def push(self, token: int, scores: Tensor, finish: str | None) -> GeneratedToken:
        """The next token, from its (V,) scores; `finish` is set on the continuation's last token."""
        text = self._text.push(token) if token != self._eos else ""
        if finish is not None:
            text += self._text.finish()
        logprobs = scores.float().log_softmax(-1)
        values, ids = logprobs.topk(min(self._top, logprobs.numel()))
        top = [(i, v) for i, v in zip(ids.tolist(), values.tolist(), strict=True) if v > -math.inf]
        return GeneratedToken(token, text, float(logprobs[token]), top, finish)


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
    ids = [prompt_ids(loaded, prompt) for prompt in prompts]
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


def prompt_ids(loaded: Bundle, prompt: str) -> list[int]:
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
    `cut_at_stop(decode(all tokens), stop)`. No token after the one that completes a stop string is read."""
    text = TextStream(decode, stop)
    for token in tokens:
        piece = text.push(token)
        if piece:
            yield piece
        if text.stopped:
            return
    rest = text.finish()
    if rest:
        yield rest


class TextStream:
    """The text of a token stream, pushed one token at a time: what a server streams to its clients.

    `push` returns the new text of each token, in complete characters, decoding a window of the last
    few tokens only. A byte-level tokenizer (GPT-2, byte-bpe) decodes a character split across tokens as
    U+FFFD until its last byte arrives, so a final U+FFFD is held back until the next token. The window
    keeps `_WINDOW` tokens: a UTF-8 character has at most 4 bytes and a token at least one, so an
    unfinished character always lies inside it, and the earlier tokens of the window give decoders that
    join tokens (a metaspace or a space between words) the context to render the newest one as the
    whole text does. Text that may be the start of a stop string is held back until it is known not to
    be one; at the first stop string, `stopped` turns True and nothing more is shown. The pieces of all
    `push` calls and `finish` add up to `cut_at_stop(decode(all tokens), stop)`.

    Example:
        >>> text = TextStream(lambda ids: "".join(chr(i) for i in ids), stop=["!?"])
        >>> [text.push(ord(c)) for c in "hi!"], text.push(ord("?")), text.stopped
        (['h', 'i', ''], '', True)
    """

    def __init__(self, decode: Decode, stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._window: list[int] = []
        self._shown = ""  # the part of decode(window) already passed on
        self._held = ""  # text passed on by the window but held back as a possible stop string's start
        self.stopped = False

    def push(self, token: int) -> str:
        """The text that `token` makes ready to show ('' when all of it is held back or the stream stopped)."""
        if self.stopped:
            return ""
        self._window.append(token)
        ready = _finished(self._decode(self._window))
        piece = ready[len(self._shown):]
        self._shown = ready
        if len(self._window) > _WINDOW:
            self._window = self._window[-_WINDOW:]
            self._shown = _finished(self._decode(self._window))  # all of it was shown but a held-back last character
        return self._before_stop(piece)

    def finish(self) -> str:
        """What is left to show when the stream ends: a held-back character or possible start of a stop string."""
        if self.stopped:
            return ""
        piece = self._before_stop(self._decode(self._window)[len(self._shown):])
        if self.stopped:
            return piece
        piece, self._held = piece + self._held, ""
        return piece

    def _before_stop(self, piece: str) -> str:
        """`piece` up to the first stop string, less the end that may turn out to be the start of one."""
        if not piece:
            return ""
        self._held += piece
        end = stop_index(self._held, self._stop)
        if end is not None:
            self.stopped = True
            return self._held[:end]
        keep = max((n for s in self._stop for n in range(1, len(s)) if self._held.endswith(s[:n])), default=0)
        shown, self._held = self._held[: len(self._held) - keep], self._held[len(self._held) - keep :]
        return shown


def _finished(text: str) -> str:
    """The text without a final U+FFFD, which may be the start of a character still to come."""
    return text[:-1] if text.endswith("\ufffd") else text


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
    found = []
    with torch.inference_mode():
        for rows in encoder_batches([len(row) for row in ids], batch_size, device):
            tokens, mask = pad_batch([ids[i] for i in rows], loaded.pad_id)
            inputs = [tokens, mask]
            if segments is not None:
                inputs.append(pad_batch([segments[i] for i in rows], 0)[0])
            found.append((rows, loaded.model.classify(*(t.to(device) for t in inputs)).softmax(-1).cpu()))
    out = torch.empty(len(ids), found[0][1].size(-1), dtype=found[0][1].dtype)
    for rows, probabilities in found:
        out[rows] = probabilities
    return out


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
    tokens = _attention_tokens(bundle, text, kind)
    weights = attention_maps(bundle.model, tokens.source, layer, kind, tokens.target)  # (h, Tq, Tk)
    chosen = _one_head(weights, head)
    which = "mean over heads" if head is None else f"head {head}"
    return AttentionView(chosen, tokens.queries, tokens.keys, f"{kind} attention, layer {layer}, {which}")


@dataclasses.dataclass(frozen=True)
class AttentionLayers:
    """Several layers' and heads' attention on a text.

    Attributes:
        weights: (layers, heads, queries, keys) float.
        queries: the attending tokens, as text pieces.
        keys: the attended tokens.
        target: an encoder-decoder's greedy translation of the text, whose tokens (after the start
            token) are the queries of "decoder" and "cross" attention; None otherwise.
        layers: the layers of this kind the model has (all of them, whichever were chosen).
        heads: the heads per layer the model has.
    """

    weights: Tensor
    queries: list[str]
    keys: list[str]
    target: str | None
    layers: int
    heads: int


def attention_layers(bundle: Bundle, text: str, kind: str, layer: int | None = None,
                     head: int | None = None) -> AttentionLayers:
    """Attention of every layer (or one) and every head (or one) of `kind` on `text`.

    "self" is the only self-attention of an encoder-only or decoder-only model. For an
    encoder-decoder, "decoder" and "cross" attention are taken over its greedy translation (as
    `attention_of`).

    Raises:
        AttnError: no such layer, head or kind of attention in this model.
    """
    tokens = _attention_tokens(bundle, text, kind)
    count = layer_count(bundle.model, kind)
    chosen = range(count) if layer is None else [layer]
    weights = torch.stack([attention_maps(bundle.model, tokens.source, i, kind, tokens.target) for i in chosen])
    heads = weights.size(1)
    if head is not None:
        weights = weights[:, _checked_head(head, heads)][:, None]
    target = None if tokens.target is None else bundle.tokenizer.decode(tokens.target[1:])
    return AttentionLayers(weights, tokens.queries, tokens.keys, target, count, heads)


def next_token_attention(bundle: Bundle, ids: Sequence[int], layer: int, head: int | None) -> Tensor:
    """(T,) how the last position of `ids` attends over all of them in a decoder-only model: the
    attention with which the model chose the token that follows `ids` (one head, or the mean over heads)."""
    weights = attention_maps(bundle.model, ids, layer, "self")  # (h, T, T)
    return _one_head(weights[:, -1:], head)[0]


@dataclasses.dataclass(frozen=True)
class _AttentionTokens:
    source: list[int]
    target: list[int] | None
    queries: list[str]
    keys: list[str]


def _attention_tokens(bundle: Bundle, text: str, kind: str) -> _AttentionTokens:
    """The ids a map of `kind` is computed on (an encoder-decoder's decoder side is its greedy
    translation, after the start token) and the pieces of its queries and keys."""
    tok = bundle.tokenizer
    source = tok.encode(text)
    target = None
    if isinstance(bundle.model, EncoderDecoder) and kind != "encoder":
        # The paper's limit, less one: the start token and the output must fit the decoder's positions.
        limit = min(len(source) + PAPER_EXTRA_LENGTH, bundle.model.max_positions - 1)
        output = generate_seq2seq(bundle.model, [source], bundle.start_id, bundle.eos_id, bundle.pad_id,
                                  GenerationConfig(max_new_tokens=limit))[0]
        target = [bundle.start_id, *output]
    pieces = token_pieces(bundle, source)
    target_pieces = token_pieces(bundle, target) if target else pieces
    queries, keys = {"cross": (target_pieces, pieces), "decoder": (target_pieces, target_pieces)}.get(
        kind, (pieces, pieces))
    return _AttentionTokens(source, target, queries, keys)


def token_pieces(bundle: Bundle, ids: Sequence[int]) -> list[str]:
    """The vocabulary entry of each id (e.g. "Ġthe", "##ing"), or the id itself when it has none."""
    return [bundle.tokenizer.id_to_token(i) or str(i) for i in ids]


def _checked_head(head: int, heads: int) -> int:
    if not 0 <= head < heads:
        raise AttnError(f"head {head} does not exist: the model has heads 0..{heads - 1}")
    return head


def _one_head(weights: Tensor, head: int | None) -> Tensor:
    """(h, Tq, Tk) -> (Tq, Tk): one head, or the mean over heads."""
    return weights.mean(0) if head is None else weights[_checked_head(head, weights.size(0))]
