"""The model core: the paper's parts, their successors, and the configuration that chooses among them.

- `errors`: the typed errors every layer raises; `faults`: the crash tests' fault points;
- `config`: `ModelConfig`, one validated dataclass per model; `presets`: its named instances;
- `masks`: the one mask convention; `attention`: scaled dot-product and multi-head attention;
  `positional`: the position schemes behind one interface; `layers`: FFNs, norms, residual wrappers,
  embeddings; `blocks`: encoder and decoder layers built from them; `linear`: the one linear layer;
- `kv_cache`: the decoder's preallocated key/value cache;
- `quantized`: int8 and int4 layers for CPU inference.

The architectures built from these parts are `attn.models`.
"""
