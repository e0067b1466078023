"""The application layer: what people run. `inference` (translate, generate, classify, embed, attention),
`evaluation` and `metrics`, `guard` and `baselines` (is a trained model better than a trivial one), `embeddings`,
`plots` and `report`, `quickstart`, and `cli` with its `commands`, the `attn` command."""
