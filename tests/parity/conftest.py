"""Shared fixtures of the Hugging Face parity tests: tiny random `transformers` models on disk.

Everything runs offline: nothing is fetched from the Hub. Weights are drawn from N(0, 0.2)
(LayerNorm gains from N(1, 0.2)) rather than the models' initialisation, so LayerNorms, biases
and the heads all move the outputs and a misplaced tensor cannot hide behind near-zero
activations or a unit gain.
"""

import os

import pytest
import torch
from reference_imports import require

os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"

transformers = require("transformers")  # a skip of the whole suite; an error in CI
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

TINY = {"vocab_size": 97, "max_positions": 64, "d_model": 32, "heads": 4, "d_ff": 64, "layers": 2}


@pytest.fixture
def randomised():
    """Draws every weight of a `transformers` model from N(0, 0.2), LayerNorm gains from N(1, 0.2).

    Fixed tables (Marian's sinusoids) are kept, and so are the buffers a model computes rather than
    stores (rotary frequencies, Gemma's embedding scale). Returns the model in eval mode.
    """

    def randomise(model, seed=0):
        generator = torch.Generator().manual_seed(seed)
        stored = model.state_dict()
        with torch.no_grad():
            for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
                if tensor.is_floating_point() and name in stored and "embed_positions" not in name:
                    gain = name.endswith("weight") and tensor.dim() == 1  # LayerNorm; matrices are 2-D
                    tensor.copy_(torch.randn(tensor.shape, generator=generator) * 0.2 + gain)
        return model.eval()

    return randomise


@pytest.fixture
def saved(tmp_path):
    """Saves a `transformers` model with `save_pretrained` under tmp_path; returns the folder."""

    def save(model, name="hf"):
        folder = tmp_path / name
        model.save_pretrained(folder)
        return folder

    return save


@pytest.fixture
def assert_exports_identically(tmp_path):
    """Exports our model, reloads it with `hf_class.from_pretrained`, and compares every tensor."""
    from attn.artifacts.pretrained import export_pretrained

    def check(model, info, reference, hf_class):
        folder = export_pretrained(model, info.config, tmp_path / "exported", info.family, ids=info.ids)
        reloaded = hf_class.from_pretrained(folder).state_dict()
        expected = reference.state_dict()
        assert sorted(reloaded) == sorted(expected)
        for key, tensor in expected.items():
            assert torch.equal(reloaded[key], tensor), key
        return folder

    return check


@pytest.fixture
def tokens():
    """Random ids (B, T) drawn from [0, high), reproducible."""

    def draw(batch, length, high=TINY["vocab_size"], seed=0):
        return torch.randint(0, high, (batch, length), generator=torch.Generator().manual_seed(seed))

    return draw
