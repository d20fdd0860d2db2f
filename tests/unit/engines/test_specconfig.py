"""One model of the reference engine's --speculative-config: what the operator renders is what
the engine parses, key for key, and bad input names the key."""


import pytest

from lookahead_canary import specconfig
from lookahead_canary.server import build_parser
from lookahead_operator.engines import reference_speculative_config
from lookahead_operator.api.spec import LookaheadConfig


@pytest.mark.parametrize("lookahead", [
    {"method": "jacobi"},
    {"method": "jacobi", "window": 3, "ngram": 4, "guessSet": 2, "promptLookupTokens": 6},
    {"method": "ngram", "numSpeculativeTokens": 6, "promptLookupMin": 1, "promptLookupMax": 3},
])
def test_what_the_operator_renders_the_engine_parses_to_the_same_values(lookahead):
    cfg = LookaheadConfig.model_validate(lookahead)
    text = reference_speculative_config(cfg)
    parsed = build_parser().parse_args(["--speculative-config", text]).speculative_config
    if cfg.method == "jacobi":
        assert (parsed["window"], parsed["ngram"], parsed["guess_set"]) == (cfg.window, cfg.ngram, cfg.guess_set)
        assert parsed["prompt_lookup_tokens"] == cfg.prompt_lookup_tokens
        assert parsed["window_with_draft"] is (cfg.prompt_lookup_tokens == 0)
    else:
        assert (parsed["num_speculative_tokens"], parsed["prompt_lookup_min"], parsed["prompt_lookup_max"]) == (
            cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max)


@pytest.mark.parametrize("text, words", [
    ('{"method":"jacobi","windw":3}', "windw"),
    ('{"method":"jacobi","window":0}', "window"),
    ('{"method":"jacobi","window":"3"}', "window"),
    ('{"method":"ngram","prompt_lookup_min":5,"prompt_lookup_max":2}', "prompt_lookup_min"),
    ('{"method":"medusa"}', "method"),
    ('[1]', "JSON object"),
    ('{', "JSON"),
])
def test_bad_configs_name_the_key(text, words):
    with pytest.raises(specconfig.SpecConfigError, match=words):
        specconfig.parse(text)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--speculative-config", text])
