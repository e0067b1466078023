"""Data: reading text files (`text`, `text_files`, `readers`, `file_formats`), tokenizers (`tokenizers` and the
`tokenizer_*`, `marian_tokenizer` and `sentencepiece_tokenizer` modules), chat templates (`chat_template`) and
conversations as training data (`chat_data`), and token ids cached (`token_cache`) and cut into training batches
(`lm_stream`, `samplers`, `collate`, `framing`, `batches`). `files` reads a file with an error that names it and the
fix, and writes a file or a directory atomically."""
