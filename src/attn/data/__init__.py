"""Data: reading corpora (`corpora`), tokenizers (`tokenizers`, Marian's SentencePiece files in
`marian_tokenizer`, a SentencePiece model file in `sentencepiece_tokenizer`, training one from files in
`tokenizer_training`), and cutting token ids into training batches (`batches`). `files` reads a file with an
error that names it and the fix, and writes a directory atomically."""
