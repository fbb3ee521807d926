"""ToolEnv.step: every malformed-call class becomes an observation, is counted, and never raises."""

import json

import pytest


def _step(env, action):
    obs, reward, terminated, truncated, info = env.step(action)
    return obs, reward, terminated, truncated, info


@pytest.mark.parametrize(
    "action, kind, needle",
    [
        ("<tool_call>{not json}</tool_call>", "parse_error", "invalid JSON"),
        ('<tool_call>{"name": "get", "arguments": {"record_id": "P01"}}', "parse_error", "never closed"),
        ("<tool_call>[1, 2]</tool_call>", "parse_error", "expected a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "parse_error", 'missing "name"'),
        ('<tool_call>{"name": "get", "arguments": "{bad"}</tool_call>', "parse_error", "is a string that is not valid JSON"),
        ('<tool_call>{"name": "get", "arguments": [1]}</tool_call>', "parse_error", "must be a JSON object"),
        ('<tool_call>{"name": "get", "record_id": "P01"}</tool_call>', "parse_error", "unexpected key"),
        (
            '<tool_call>{"name": "delete", "arguments": {}}</tool_call>',
            "unknown_tool",
            "unknown tool `delete`; available tools: search, get, answer",
        ),
        (
            '<tool_call>{"name": "get", "arguments": {"record_id": 7}}</tool_call>',
            "invalid_arguments",
            "argument `record_id` must be a string, got 7",
        ),
        ('<tool_call>{"name": "get", "arguments": {}}</tool_call>', "invalid_arguments", "missing required argument `record_id`"),
        ('<tool_call>{"name": "get", "arguments": {"record_id": "P01", "x": 1}}</tool_call>', "invalid_arguments", "unknown argument `x`"),
        ('<tool_call>{"name": "get", "arguments": {"record_id": "Z99"}}</tool_call>', "tool_error", "no record 'Z99'"),
        ("I think the answer is Oslo.", "no_tool_call", "no tool call found"),
        ("stray </tool_call> tag", "parse_error", "without a matching"),
    ],
)
def test_malformed_calls_become_observations(records_env, action, kind, needle):
    records_env.reset(seed=0)
    obs, reward, terminated, truncated, info = _step(records_env, action)
    assert needle in obs
    assert info["errors"][kind] == 1
    assert sum(info["errors"].values()) == 1
    assert [e["kind"] for e in info["turn_errors"]] == [kind]
    assert reward == 0.0 and not terminated and not truncated


def test_errors_accumulate_and_good_calls_still_run(records_env):
    records_env.reset(seed=0)
    action = (
        '<tool_call>{"name": "get", "arguments": {"record_id": "P01"}}</tool_call>'
        "<tool_call>{oops}</tool_call>"
        '<tool_call>{"name": "get", "arguments": {"record_id": "P02"}}</tool_call>'
    )
    obs, _, _, _, info = _step(records_env, action)
    assert "id=P01" in obs and "id=P02" in obs and "invalid JSON" in obs
    assert info["tool_calls"] == 2 and info["errors"]["parse_error"] == 1
    _, _, _, _, info = _step(records_env, "<tool_call>{oops}</tool_call>")
    assert info["errors"]["parse_error"] == 2


def test_parsed_calls_and_dicts_are_accepted(records_env):
    from toolgym import ToolCall

    records_env.reset(seed=0)
    obs, *_ = _step(records_env, [ToolCall(name="get", arguments={"record_id": "P01"}), {"name": "get", "arguments": {"record_id": "P02"}}])
    assert "id=P01" in obs and "id=P02" in obs


def test_final_tool_ends_episode_and_later_calls_are_ignored(records_env):
    records_env.reset(seed=0, options={"task": 0})
    answer = records_env.task.hidden.answer
    action = (
        f"<tool_call>{json.dumps({'name': 'answer', 'arguments': {'text': answer}})}</tool_call>"
        '<tool_call>{"name": "get", "arguments": {"record_id": "P01"}}</tool_call>'
    )
    obs, reward, terminated, truncated, info = _step(records_env, action)
    assert terminated and not truncated and reward == 1.0
    assert "ignored: the episode already ended" in obs and info["tool_calls"] == 1
    import gymnasium

    with pytest.raises(gymnasium.error.ResetNeeded):
        records_env.step("anything")


def test_wrong_answer_scores_zero(records_env):
    records_env.reset(seed=0, options={"task": 0})
    _, reward, terminated, _, _ = _step(records_env, [{"name": "answer", "arguments": {"text": "Atlantis"}}])
    assert terminated and reward == 0.0


def test_max_turns_truncates(records_env):
    records_env.max_turns = 3
    records_env.reset(seed=0)
    flags = [_step(records_env, "hmm")[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]


def test_step_before_reset_is_a_clear_error():
    import gymnasium

    import toolgym

    env = toolgym.make("records-v0").unwrapped
    with pytest.raises(gymnasium.error.ResetNeeded, match="call reset"):
        env.step("x")


def test_long_observation_is_capped(records_env):
    records_env.reset(seed=0)
    records_env.max_observation_chars = 20
    obs, *_ = _step(records_env, [{"name": "get", "arguments": {"record_id": "P01"}}])
    assert "more characters cut" in obs
