"""`attn serve`: the HTTP server over loaded models; `engine` runs their work, batched, off the event loop."""
