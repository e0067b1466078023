"""The application layer: what people run. `cli` with its `commands` (the `attn` command), `serve`, `quickstart`,
`runs` and `tasks`, `guard` and `baselines` (is a trained model better than a trivial one), `plots` and `report`."""
