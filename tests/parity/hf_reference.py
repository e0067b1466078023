"""What a `transformers` model computes for left-padded inputs: logits, and the continuations of `generate`
in the form `attn.decoding.generate` returns them."""

import torch


def hf_logits(hf, ids, mask):
    """Logits of `ids` (B, T) under the bool `mask`, positions counted over real tokens as `generate` passes them."""
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits


def hf_continuations(hf, prompts, eos, pad=0, max_new_tokens=20, **settings):
    """`hf.generate` on `prompts` left-padded with `pad`: each row's new tokens up to EOS, and the
    hypotheses' scores (None unless beam search gives them)."""
    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                          eos_token_id=eos, pad_token_id=pad, output_scores=True, return_dict_in_generate=True,
                          **settings)
    return [until(row.tolist(), eos) for row in out.sequences[:, width:]], getattr(out, "sequences_scores", None)


def until(tokens, eos):
    """`tokens` before the first `eos` (all of them when there is none)."""
    return tokens[: tokens.index(eos)] if eos in tokens else tokens
