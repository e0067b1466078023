"""`DecodingRules`: what an imported model decodes under, read from Hugging Face generation settings."""

import pytest

from attn.artifacts.pretrained.decoding import DecodingRules, hf_decoding_rules
from attn.decoding import GenerationConfig
from attn.core.errors import CheckpointError


def test_rules_add_to_the_options_bans_and_forced_eos():
    rules = DecodingRules(frame_sources=True, start_id=9, suppress=(9, 2), force_eos=True)
    config = rules.applied_to(GenerationConfig(suppress=(4, 9), max_new_tokens=5))
    assert (config.suppress, config.force_eos, config.max_new_tokens) == ((2, 4, 9), True, 5)
    assert DecodingRules().applied_to(GenerationConfig(force_eos=True)).force_eos  # never takes one away


def test_json_round_trip_and_absent_rules():
    rules = DecodingRules(frame_sources=True, start_id=58100, suppress=(58100,), force_eos=True)
    assert rules.to_json() == {"frame_sources": True, "start_id": 58100, "suppress": [58100], "force_eos": True}
    assert DecodingRules.from_json(rules.to_json()) == rules
    assert DecodingRules.from_json(None) == DecodingRules()


@pytest.mark.parametrize("data", [{"colour": 1}, {"suppress": ["pad"]}, {"start_id": 1.5}, [1]])
def test_malformed_stored_rules_are_refused(data):
    with pytest.raises(CheckpointError, match="task.json: 'decoding'"):
        DecodingRules.from_json(data)


def test_opus_mt_settings():
    settings = {"bad_words_ids": [[58100]], "eos_token_id": 0, "forced_eos_token_id": 0}
    assert hf_decoding_rules(settings, 58100, frame_sources=True) == DecodingRules(True, 58100, (58100,), True)
    # generation_config.json's own start id wins over config.json's; lists of one id are that id.
    settings = {"decoder_start_token_id": 7, "eos_token_id": [0], "forced_eos_token_id": [0]}
    assert hf_decoding_rules(settings, 58100) == DecodingRules(False, 7, (), True)
    assert hf_decoding_rules({}, None) == DecodingRules()


@pytest.mark.parametrize("settings, message", [
    ({"bad_words_ids": [[5, 6]]}, "bans token sequences"),
    ({"eos_token_id": 0, "forced_eos_token_id": 3}, "forced_eos_token_id=3 is not eos_token_id=0"),
])
def test_settings_attn_cannot_apply_exactly_are_refused(settings, message):
    with pytest.raises(CheckpointError, match=message):
        hf_decoding_rules(settings, None)
