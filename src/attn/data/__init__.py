"""Data: reading text files (`text`; many files as one stream in `text_files`; examples of tables in
`readers`, one parser per file format in `file_formats`), tokenizers (the `Tokenizer` class in `tokenizers`;
its kinds in `tokenizer_kinds`, the roles of its special tokens in `tokenizer_roles`, its files on disk in
`tokenizer_files`; their Hugging Face pipelines in `tokenizer_pipelines`, Marian's SentencePiece files in
`marian_tokenizer`, a SentencePiece model file in `sentencepiece_tokenizer`, training one from files in
`tokenizer_training`), and cutting token ids into training batches (`lm_stream`, `samplers`, `collate`,
`framing`, `batches`). `files` reads a file with an error that names it and the fix, and writes a file or a
directory atomically."""
