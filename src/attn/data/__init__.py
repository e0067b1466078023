"""Data: reading corpora (`corpora`), tokenizers (`tokenizers`, Marian's SentencePiece files in
`marian_tokenizer`), and cutting token ids into training batches (`batches`). `files` reads a file with an
error that names it and the fix."""
