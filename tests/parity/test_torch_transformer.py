"""Parity with PyTorch's own torch.nn.Transformer layers, same weights, eval mode, float32, 1e-5.

`torch.nn.Transformer` puts a final LayerNorm after both stacks even with post-norm layers,
which the paper's model does not have; these tests compare against it with our `final_norm`
option on, and compare the layer stacks alone (no final norm) with it off.
"""

import pytest
import torch
from torch import nn

from attn.core.blocks import self_attention_inputs
from attn.core.masks import causal_mask, key_mask
from attn.models import build_model
from attn.core.presets import preset

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:torch")

D, H, FF = 32, 4, 64


def copy_attention(ours, theirs_in_w, theirs_in_b, theirs_out):
    with torch.no_grad():
        theirs_in_w.copy_(ours["in_w"])
        theirs_in_b.copy_(ours["in_b"])
        theirs_out.weight.copy_(ours["out"].weight)
        theirs_out.bias.copy_(ours["out"].bias)


def copy_norm(ours, theirs):
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)


def copy_ffn(ours, theirs):
    with torch.no_grad():
        theirs.linear1.weight.copy_(ours.w1.weight)
        theirs.linear1.bias.copy_(ours.w1.bias)
        theirs.linear2.weight.copy_(ours.w2.weight)
        theirs.linear2.bias.copy_(ours.w2.bias)


def self_attn(block):
    return {"in_w": block.attn.qkv.weight, "in_b": block.attn.qkv.bias, "out": block.attn.out}


def cross_attn(block):
    c = block.cross
    return {"in_w": torch.cat([c.q.weight, c.kv.weight]), "in_b": torch.cat([c.q.bias, c.kv.bias]), "out": c.out}


def torch_model(norm, activation, ours):
    torch_layers = nn.Transformer(
        d_model=D, nhead=H, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=FF, dropout=0.0,
        activation=activation, batch_first=True, norm_first=(norm == "pre"),
    ).eval()
    for mine, theirs in zip(ours.encoder.blocks, torch_layers.encoder.layers):
        copy_attention(self_attn(mine), theirs.self_attn.in_proj_weight, theirs.self_attn.in_proj_bias,
                       theirs.self_attn.out_proj)
        copy_ffn(mine.ffn, theirs)
        copy_norm(mine.attn_residual.norm, theirs.norm1)
        copy_norm(mine.ffn_residual.norm, theirs.norm2)
    for mine, theirs in zip(ours.blocks, torch_layers.decoder.layers):
        copy_attention(self_attn(mine), theirs.self_attn.in_proj_weight, theirs.self_attn.in_proj_bias,
                       theirs.self_attn.out_proj)
        copy_attention(cross_attn(mine), theirs.multihead_attn.in_proj_weight, theirs.multihead_attn.in_proj_bias,
                       theirs.multihead_attn.out_proj)
        copy_ffn(mine.ffn, theirs)
        copy_norm(mine.attn_residual.norm, theirs.norm1)
        copy_norm(mine.cross_residual.norm, theirs.norm2)
        copy_norm(mine.ffn_residual.norm, theirs.norm3)
    copy_norm(ours.encoder.final_norm, torch_layers.encoder.norm)
    copy_norm(ours.final_norm, torch_layers.decoder.norm)
    return torch_layers


def ours_model(norm, activation):
    cfg = preset("paper-base-tiny").replace(norm_placement=norm, activation=activation, final_norm=True, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():  # non-trivial LayerNorm parameters, so a swapped norm would be caught
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
    return model


def batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(1, 97, (3, 8), generator=g)
    tgt = torch.randint(1, 97, (3, 6), generator=g)
    src_mask = torch.ones_like(src, dtype=torch.bool)
    src_mask[1, 5:] = False
    src_mask[2, 3:] = False
    tgt_mask = torch.ones_like(tgt, dtype=torch.bool)
    tgt_mask[2, 4:] = False
    return src, tgt, src_mask, tgt_mask


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_whole_model_matches_nn_transformer(norm, activation):
    ours = ours_model(norm, activation)
    theirs = torch_model(norm, activation, ours)
    src, tgt, src_mask, tgt_mask = batch()
    with torch.no_grad():
        positions_s = torch.arange(src.size(1)).expand_as(src)
        positions_t = torch.arange(tgt.size(1)).expand_as(tgt)
        src_x = ours.encoder.embeddings(src, positions_s)
        tgt_x = ours.embeddings(tgt, positions_t)
        hidden = theirs(
            src_x, tgt_x,
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(tgt.size(1)),
            src_key_padding_mask=~src_mask, tgt_key_padding_mask=~tgt_mask, memory_key_padding_mask=~src_mask,
            tgt_is_causal=True,
        )
        expected = ours.lm_head(hidden)
        got = ours(src, tgt, src_mask, tgt_mask)
    real = tgt_mask
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_layer_stacks_without_final_norm_match(norm, activation):
    ours = ours_model(norm, activation)
    theirs = torch_model(norm, activation, ours)
    src, tgt, src_mask, tgt_mask = batch()
    x = torch.randn(3, 8, D)
    y = torch.randn(3, 6, D)
    with torch.no_grad():
        expected_memory = x
        for layer in theirs.encoder.layers:
            expected_memory = layer(expected_memory, src_key_padding_mask=~src_mask)
        positions = torch.arange(8).expand(3, 8)
        mask, rotate, bias = self_attention_inputs(ours.encoder.embeddings.positions, positions, positions,
                                                   src_mask, causal=False)
        memory = x
        for block in ours.encoder.blocks:
            memory = block(memory, mask, rotate, bias)
        torch.testing.assert_close(memory[src_mask], expected_memory[src_mask], atol=1e-5, rtol=0)

        expected = y
        for layer in theirs.decoder.layers:
            expected = layer(expected, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(6),
                             memory_key_padding_mask=~src_mask, tgt_is_causal=True)
        out = y
        self_mask = causal_mask(6)
        for block in ours.blocks:
            out = block(out, self_mask, rotate, None, block.cross.memory_kv(memory), key_mask(src_mask))
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
