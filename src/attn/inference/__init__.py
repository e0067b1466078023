"""The library's inference API: what a loaded model does for a user.

- `translation`: `translate` (an encoder-decoder, beam search or greedy);
- `continuation`: a decoder's continuations of a prompt, whole or streamed as text;
- `chat`: a conversation through the model's chat template (`ChatSession`);
- `classification` and `embeddings`: an encoder's labels and sentence embeddings (`classify`, `embed`);
- `attention_views`: the attention weights of one input, for plots and the server's viewer;
- `evaluation` and `metrics`: the score each task reports on a data file (sacreBLEU, chrF, perplexity, accuracy);
- `inputs`: the checks of a model's kind and texts that the others share.
"""
