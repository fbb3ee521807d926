"""Prefix-stability proofs on the tiny template and the Qwen2.5 / Qwen3 / Llama-3 formats."""

import pytest

from conftest import run_cli
from toolgym.harness.chat import ChatRenderer, TemplateError
from toolgym.harness.template_check import check_model_or_format, check_template, tokenizer_for_format


@pytest.mark.parametrize("target", ["tiny", "qwen2.5", "llama3"])
def test_prefix_stable_templates_pass(target):
    report = check_model_or_format(target)
    assert report.ok, report.explanation
    assert report.incremental_tokens > 50 and report.mismatch_at is None


def test_qwen3_template_is_reported_with_the_reason():
    report = check_model_or_format("qwen3")
    assert not report.ok
    assert "reasoning" in report.explanation and "<think>" in report.explanation


def test_stripping_earlier_reasoning_is_found_token_exactly():
    # A template that drops <think> blocks from every assistant turn but the last: the classic
    # Qwen3-style rewrite. Incremental assembly keeps what the policy really produced.
    tokenizer, _ = tokenizer_for_format("qwen3")
    template = tokenizer_for_format("qwen2.5")[1].replace(
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}",
        "{%- set c = message.content.split('</think>')[-1].lstrip('\\n') if (message.role == 'assistant' and not loop.last) else message.content %}"
        "{{- '<|im_start|>' + message.role + '\\n' + c + '<|im_end|>\\n' }}")
    report = check_template(tokenizer, template, name="stripper")
    assert not report.ok and report.mismatch_at is not None
    assert "<think>" in report.incremental_text and "<think>" not in report.full_text
    assert "reasoning" in report.explanation


def test_delta_for_llama3_uses_eot_id():
    tokenizer, template = tokenizer_for_format("llama3")
    r = ChatRenderer(tokenizer, None, chat_template=template)
    assert r.eot == "<|eot_id|>"
    delta = r.delta_text([{"role": "tool", "content": "42"}])
    assert delta == "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"


def test_renderer_refuses_a_template_that_rewrites_history():
    tokenizer, template = tokenizer_for_format("qwen3")
    with pytest.raises(TemplateError, match="changes earlier turns"):
        ChatRenderer(tokenizer, None, chat_template=template).delta_text([{"role": "tool", "content": "x"}])


def test_check_template_cli_exit_codes():
    ok = run_cli("check-template", "qwen2.5")
    assert ok.returncode == 0 and "PASS" in ok.stdout
    bad = run_cli("check-template", "qwen3")
    assert bad.returncode == 1 and "FAIL" in bad.stdout and "reasoning" in bad.stdout
