"""The commands of `attn` (`attn.app.cli` puts them together), each as its parser (`add_<name>_parser`) beside
the function that runs it (`cmd_<name>`): `inference` (translate, generate, chat, classify, embed, attention),
`training` (quickstart, train, evaluate, average, plot), `models` (convert, presets, tokenizer) and `serving`
(serve). `flags` holds the flags several commands share, `io` how they read inputs and write outputs."""
