"""Request validation and the command line of the engine server (pure functions)."""

from __future__ import annotations

import pytest

from lookahead_canary.scheduler import SimTokenizer
from lookahead_canary.server import (
    RequestError,
    ServingContext,
    build_parser,
    engine_info,
    parse_args,
    parse_chat,
    parse_completion,
    simulator_from_args,
)


def ctx(spec: str | None = None, max_len: int = 64) -> ServingContext:
    tok = SimTokenizer()
    return ServingContext(served_model_name="m", max_model_len=max_len, vocab_size=len(tok),
                          speculative_method=spec, tokenizer=tok, has_chat_template=False)


def err(fn, body, c=None) -> RequestError:
    with pytest.raises(RequestError) as info:
        fn(body, c or ctx())
    return info.value


def test_a_good_completion_request():
    p = parse_completion({"model": "m", "prompt": "the time of the day", "max_tokens": 5,
                          "stream": True, "stream_options": {"include_usage": True},
                          "stop": ["\n", ""], "temperature": 0}, ctx("jacobi"))
    assert len(p.prompt_ids) == 5 and p.max_tokens == 5 and p.stream and p.include_usage
    assert p.stop == ["\n"]
    assert parse_completion({"prompt": [1, 2, 3]}, ctx()).prompt_ids == [1, 2, 3]
    assert parse_completion({"prompt": ["a b"]}, ctx()).max_tokens == 16  # OpenAI's default


def test_a_good_chat_request():
    p = parse_chat({"messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                    "max_completion_tokens": 7}, ctx())
    assert p.max_tokens == 7 and p.prompt_ids


@pytest.mark.parametrize("body,param,status", [
    ([1, 2], None, 400),
    ({}, "prompt", 400),
    ({"prompt": None}, "prompt", 400),
    ({"prompt": ""}, "prompt", 400),
    ({"prompt": 5}, "prompt", 400),
    ({"prompt": ["a", "b"]}, "prompt", 400),
    ({"prompt": [1, 10**9]}, "prompt", 400),
    ({"prompt": "a", "max_tokens": 0}, "max_tokens", 400),
    ({"prompt": "a", "max_tokens": -3}, "max_tokens", 400),
    ({"prompt": "a", "max_tokens": 65}, "max_tokens", 400),
    ({"prompt": "a b c", "max_tokens": 62}, "max_tokens", 400),  # prompt + max_tokens > 64
    ({"prompt": "a", "max_tokens": "5"}, "max_tokens", 400),
    ({"prompt": "a", "max_tokens": 2.5}, "max_tokens", 400),
    ({"prompt": "a", "max_tokens": True}, "max_tokens", 400),
    ({"prompt": "a", "temperature": "hot"}, "temperature", 400),
    ({"prompt": "a", "temperature": -1}, "temperature", 400),
    ({"prompt": "a", "temperature": 0.7}, "temperature", 400),
    ({"prompt": "a", "stream": "yes"}, "stream", 400),
    ({"prompt": "a", "stream_options": {"include_usage": 1}}, "stream_options", 400),
    ({"prompt": "a", "stop": 3}, "stop", 400),
    ({"prompt": "a", "stop": ["x", 3]}, "stop", 400),
    ({"prompt": "a", "n": 2}, "n", 400),
    ({"prompt": "a", "ignore_eos": True}, "ignore_eos", 400),
    ({"prompt": "a", "model": 7}, "model", 400),
    ({"prompt": "a", "model": "other"}, "model", 404),
    ({"prompt": "a " * 64}, "prompt", 400),  # longer than the context
])
def test_bad_completion_requests_name_the_param(body, param, status):
    e = err(parse_completion, body)
    assert (e.param, e.status) == (param, status), e.message
    assert e.body()["error"]["type"] == "invalid_request_error"
    assert e.body()["error"]["param"] == param


@pytest.mark.parametrize("body,param", [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": ["hi"]}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 0},
     "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "a"}], "max_tokens": 0}, "max_tokens"),
])
def test_bad_chat_requests_name_the_param(body, param):
    assert err(parse_chat, body).param == param


def test_temperature_message_names_lookahead_when_it_is_on():
    e = err(parse_completion, {"prompt": "a", "temperature": 1.0}, ctx("jacobi"))
    assert e.param == "temperature" and "lookahead" in e.message and "temperature" in e.message
    e = err(parse_completion, {"prompt": "a", "temperature": 1.0}, ctx(None))
    assert e.param == "temperature" and "greedily" in e.message


def test_command_line_as_documented():
    a = parse_args(["--host", "0.0.0.0", "--port", "8001", "--model", "tiny",
                    "--served-model-name", "chat", "--max-num-seqs", "8",
                    "--speculative-config", '{"method":"jacobi","window":7,"ngram":5,"guess_set":7}',
                    "--lookahead-max-batch-size", "4"])
    assert (a.host, a.port, a.model, a.served_model_name, a.max_num_seqs) == \
        ("0.0.0.0", 8001, "tiny", "chat", 8)
    assert a.speculative_config["method"] == "jacobi" and a.lookahead_max_batch_size == 4
    info = engine_info(a)
    assert (info["method"], info["window"], info["ngram"], info["guess_set"],
            info["max_batch_size"]) == ("jacobi", "7", "5", "7", "4")
    d = parse_args([])
    assert (d.host, d.port, d.backend, d.speculative_config, d.served_model_name) == \
        ("127.0.0.1", 8000, "model", None, "smollm2")
    assert engine_info(d)["method"] == "greedy"
    n = parse_args(["--speculative-config",
                    '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,'
                    '"prompt_lookup_max":5}'])
    assert n.speculative_config == {"method": "ngram", "num_speculative_tokens": 4,
                                    "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    # what the operator renders for `promptLookupTokens` (jacobi with prompt-seeded drafts)
    s = parse_args(["--speculative-config", '{"method":"jacobi","window":3,"ngram":4,"guess_set":2,'
                    '"prompt_lookup_tokens":24,"window_with_draft":false}'])
    assert s.speculative_config["prompt_lookup_tokens"] == 24 and s.speculative_config["window_with_draft"] is False
    # GET /version's answer: the package's by default, another release when a test presents one
    assert d.report_version is None and parse_args(["--report-version", "0.20.1"]).report_version == "0.20.1"


@pytest.mark.parametrize("argv", [
    ["--speculative-config", "{not json"],
    ["--speculative-config", '{"method":"medusa"}'],
    ["--speculative-config", '{"method":"jacobi","window":0}'],
    ["--speculative-config", '{"method":"jacobi","windows":7}'],
    ["--speculative-config", '{"method":"ngram","num_speculative_tokens":"4"}'],
    ["--speculative-config", '{"method":"jacobi","window_with_draft":"no"}'],
    ["--speculative-config", '{"method":"ngram","window_with_draft":false}'],
    ["--max-num-seqs", "0"],
    ["--lookahead-max-batch-size", "-1"],
    ["--backend", "vllm"],
    ["--sim-config", "{}"],  # needs --backend simulate
    ["--report-version", "latest"],
])
def test_bad_command_lines_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2


def test_the_server_flags_decide_what_the_simulator_speculates():
    greedy = simulator_from_args(parse_args(
        ["--backend", "simulate", "--sim-config", '{"method":"jacobi","seed":3,"time_scale":0.1}']))
    assert greedy.config.method == "greedy" and greedy.seed == 3
    assert greedy.config.time_scale == 0.1
    jac = simulator_from_args(parse_args(
        ["--backend", "simulate", "--speculative-config",
         '{"method":"jacobi","window":4,"ngram":3,"guess_set":2}']))
    assert (jac.config.method, jac.config.window, jac.config.ngram, jac.config.guess_set) == \
        ("jacobi", 4, 3, 2)
    assert "--speculative-config" in build_parser().format_help()
