"""Errors carry the setting they concern, which the CLI turns into a flag and the server into `param`."""

import pytest

from attn.app.commands.io import flag_error
from attn.decoding import check_samples
from attn.app.serve.routes import _invalid
from attn.decoding import GenerationConfig
from attn.core.errors import AttnError, ConfigError, DataFormatError, GenerationError


def test_an_error_about_a_field_names_it_first():
    error = ConfigError("train.metric", "unknown metric 'f2'")
    assert (str(error), error.field, error.detail) == ("train.metric: unknown metric 'f2'", "train.metric",
                                                       "unknown metric 'f2'")
    plain = AttnError("the engine is closed")
    assert (str(plain), plain.field, plain.detail) == ("the engine is closed", None, "the engine is closed")
    assert DataFormatError("a.tsv", "no tab", line=3).field is None


def test_decoding_errors_carry_their_argument():
    with pytest.raises(GenerationError) as found:
        GenerationConfig(top_p=0.0)
    assert found.value.field == "top_p" and str(found.value).startswith("top_p: must be in (0, 1]")
    with pytest.raises(GenerationError) as found:
        GenerationConfig(beam_size="four")  # a type error of coerce_fields, a ConfigError, becomes a GenerationError
    assert found.value.field == "beam_size"
    with pytest.raises(GenerationError) as found:
        check_samples(2, GenerationConfig())
    assert found.value.field == "samples" and found.value.detail.startswith("greedy decoding and beam search")


def test_the_cli_names_the_flag_and_the_server_the_request_field():
    error = GenerationError("must be >= 1, got 0", "max_new_tokens")
    assert str(flag_error(error)) == "--max-new-tokens: must be >= 1, got 0"
    assert str(flag_error(GenerationError("x", "samples"), {"samples": "--n"})) == "--n: x"
    unnamed = GenerationError("every prompt needs at least one token")
    assert flag_error(unnamed) is unnamed
    api = _invalid(error, "prompt")
    assert (api.status, api.param, api.message) == (422, "max_tokens", "max_tokens: must be >= 1, got 0")
    api = _invalid(GenerationError("a prompt of 9 tokens, but max_new_tokens=5"), "prompt")
    assert (api.param, api.message) == ("prompt", "a prompt of 9 tokens, but max_tokens=5")
