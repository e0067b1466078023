"""The model core: the paper's parts, their successors, and the configuration that chooses among them.

`config` (`ModelConfig`) and `presets` choose; `masks` (the one mask convention), `attention`, `positional`, `layers`
(FFNs, norms, residual wrappers, embeddings), `blocks`, `linear`, `kv_cache` and `quantized` (int8 and int4 layers)
are the parts; `errors` and `faults` (the crash tests' fault points) serve every layer. The architectures built from
these parts are `attn.models`.
"""
