"""The kinds of tokenizer (`Tokenizer.kind`): how each is made, and when `decode(encode(x)) == x` holds.

- `bpe` (`train_bpe`): BPE over NFC-normalised characters, words marked by a Metaspace `▁`. Exact for NFC text
  of characters seen in training, less one leading space.
- `byte-bpe` (`train_bpe(byte_level=True)`): BPE over UTF-8 bytes, as GPT-2. Exact for every string (with
  `skip_special=False`).
- `unigram` (`train_unigram`): the Unigram language model of SentencePiece, trained by `tokenizers`'
  own `UnigramTrainer`, over the same NFC + Metaspace pipeline as `bpe`, with the same round trip.
  Its vocabulary holds every character of the training texts, so `vocab_size` must leave room for them.
- `wordpiece` (`train_wordpiece`): BERT's WordPiece. Equal up to BERT's normalisation (lower case, no accents, no
  control characters) and whitespace, when no `[UNK]` is produced.
- `chars` (`train_chars`): one token per character. Exact for text of characters seen in training.
- `gpt2` (`from_gpt2_files`): GPT-2's byte-level BPE. Exact for every string.
- `bert` (`from_bert_vocab`): BERT's WordPiece; as `wordpiece`.
- `file` (`from_file`): whatever the `tokenizer.json` holds.
- `gguf` (`attn.artifacts.pretrained.gguf.read_gguf`): the byte-level BPE or SentencePiece vocabulary that a GGUF
  file describes in its metadata, encoded as llama.cpp encodes it. Byte-level: exact for every string (with
  `skip_special=False`), as `gpt2`; SentencePiece: exact for text without special tokens or "▁", as SentencePiece.
- `sentencepiece` (`from_sentencepiece`): a SentencePiece model file (`*.model`, `*.spm`), read with the
  `sentencepiece` package: SentencePiece's own ids and text (see `attn.data.sentencepiece_tokenizer`).
- `marian-spm` (`from_marian_files`): a Marian model's `source.spm` + `target.spm` + `vocab.json`, read with the
  `sentencepiece` package; gives the ids and text of `transformers`' `MarianTokenizer` (see
  `attn.data.marian_tokenizer`). `encode` cuts with the source model, `decode` reads model ids.

In every kind but `sentencepiece` the text of a special token (`<s>`, `[CLS]`, ...) inside a text encodes to that
token's id, which `decode` leaves out by default (tests/unit/test_properties.py checks all this).

`add_special=True` (in `encode` and `encode_batch`) applies the tokenizer's own frame, the same as Hugging Face's
`add_special_tokens=True`: `<s> … </s>` for `bpe`, `byte-bpe`, `unigram` and `chars`; `[CLS] … [SEP]` for
`wordpiece` and `bert`; nothing for `gpt2` (as in HF's GPT-2); the post-processor of the file for `file`; the bos
(and eos) that the GGUF file asks for, for `gguf`; the model's bos and eos for `sentencepiece`; `… </s>` for
`marian-spm` (as `MarianTokenizer`).

The kind is saved with the tokenizer and says which files hold it (`attn.data.tokenizer_files`).
"""

MARIAN_KIND = "marian-spm"  # its files are SentencePiece models and a vocabulary, not tokenizer.json
SENTENCEPIECE_KIND = "sentencepiece"  # its file is a SentencePiece model, not tokenizer.json
TRAINED_KINDS = ("bpe", "byte-bpe", "wordpiece", "unigram", "chars")
KINDS = (*TRAINED_KINDS, "gpt2", "bert", "file", "gguf", MARIAN_KIND, SENTENCEPIECE_KIND)
