"""The reasoning splitter over recorded-style outputs, cut into pieces every way a stream can cut them."""

from __future__ import annotations

import itertools

import pytest

from app.text.chatml import CHATML_TEMPLATE
from app.text.chat_template import ChatTemplate
from app.text.reasoning import (
    ReasoningSplitter,
    Split,
    prompt_opens_reasoning,
    split_reasoning,
    template_reasons,
)

# (output text, the template opened <think> in the prompt, expected reasoning, expected content)
CASES = [
    # Qwen3 / QwQ style: the model opens and closes the block itself
    ("<think>\nThe user greets me. I should greet back.\n</think>\n\nHello! How can I help?", False,
     "The user greets me. I should greet back.", "Hello! How can I help?"),
    # DeepSeek-R1 style: the template's generation prompt ends with "<think>\n"
    ("Okay, 2 + 2 is 4.\n</think>\n\nThe answer is **4**.", True,
     "Okay, 2 + 2 is 4.", "The answer is **4**."),
    # Qwen3 with enable_thinking=false: the template wrote an empty block, the output is plain
    ("Hello there.", False, "", "Hello there."),
    # a model that does not reason: leading whitespace and text kept as is
    ("  \nplain answer with </think> and <think> inside", False, "",
     "  \nplain answer with </think> and <think> inside"),
    # an empty reasoning block
    ("<think>\n\n</think>\n\nJust the answer.", False, "", "Just the answer."),
    # output cut inside the reasoning (max_tokens): all of it is reasoning
    ("<think>\nStep 1: think.\nStep 2: </thi", False, "Step 1: think.\nStep 2: </thi", ""),
    ("still thinking, cut here", True, "still thinking, cut here", ""),
    # a tool call after the reasoning stays in the content, for the tool parser
    ("<think>I need the weather tool.</think>\n<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>",
     False, "I need the weather tool.", "<tool_call>\n{\"name\": \"w\", \"arguments\": {}}\n</tool_call>"),
    # whitespace inside the reasoning is kept; a tag inside the content is content
    ("<think>a\n\n  b</think>x <think>y</think>", False, "a\n\n  b", "x <think>y</think>"),
    # the start of a tag that never completes is text
    ("<thinking is fun", False, "", "<thinking is fun"),
    ("<thi", False, "", "<thi"),
    ("", False, "", ""),
    ("", True, "", ""),
]


def _stream(text: str, cuts: tuple[int, ...], started: bool) -> tuple[list[Split], Split]:
    splitter = ReasoningSplitter(started=started)
    bounds = [0, *cuts, len(text)]
    pieces = [splitter.push(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    return pieces, splitter.flush()


@pytest.mark.parametrize("text,started,reasoning,content", CASES)
def test_whole_output(text, started, reasoning, content):
    assert split_reasoning(text, started=started) == Split(reasoning, content)


@pytest.mark.parametrize("text,started,reasoning,content", CASES)
def test_every_two_and_three_piece_cut_gives_the_same_parts(text, started, reasoning, content):
    n = len(text)
    cuts = [(i,) for i in range(n + 1)] + list(itertools.combinations(range(1, n), 2))[:4000]
    for cut in cuts:
        pieces, tail = _stream(text, cut, started)
        got_r = "".join(p.reasoning for p in pieces) + tail.reasoning
        got_c = "".join(p.content for p in pieces) + tail.content
        assert (got_r, got_c) == (reasoning, content), cut


@pytest.mark.parametrize("text,started,reasoning,content", CASES)
def test_character_by_character_never_leaks_a_tag(text, started, reasoning, content):
    pieces, tail = _stream(text, tuple(range(1, len(text))), started)
    for p in pieces:
        if "<think>" not in reasoning + content:
            assert "<think>" not in p.reasoning and "<thi" not in p.reasoning[-4:]
        if "</think>" not in reasoning:
            assert "</" not in p.reasoning[-2:], "a close tag's start was given out as reasoning"
    assert "".join(p.reasoning for p in pieces) + tail.reasoning == reasoning


def test_reasoning_is_given_out_as_it_comes():
    """Streaming is incremental: reasoning text leaves before the block closes."""
    s = ReasoningSplitter()
    assert s.push("<th") == Split()
    assert s.push("ink>\nLet me") == Split(reasoning="Let me")
    assert s.push(" count: 1, 2") == Split(reasoning=" count: 1, 2")
    assert s.push(".\n</") == Split(reasoning=".")
    assert s.push("think>\n\nThree") == Split(content="Three")
    assert s.push(" words.") == Split(content=" words.")
    assert s.flush() == Split()
    assert s.had_reasoning


def test_token_pieces_of_a_recorded_stream():
    """Pieces as a byte-level BPE detokenizer gives them (tags split over several tokens)."""
    pieces = ["<", "think", ">\n", "The", " user", " wants", " a", " haiku", ".\n", "</", "think", ">\n\n",
              "Autumn", " leaves", " fall"]
    s = ReasoningSplitter()
    out = [s.push(p) for p in pieces] + [s.flush()]
    assert "".join(p.reasoning for p in out) == "The user wants a haiku."
    assert "".join(p.content for p in out) == "Autumn leaves fall"
    assert all("<" not in p.reasoning + p.content and ">" not in p.reasoning + p.content for p in out)
    # the first content arrives with the token that follows the close tag, not later
    assert out[12] == Split(content="Autumn")


def test_plain_output_is_not_delayed_beyond_its_first_word():
    s = ReasoningSplitter()
    assert s.push("\n") == Split()  # could still be whitespace before <think>
    assert s.push("Hi") == Split(content="\nHi")
    assert s.push(" <think>") == Split(content=" <think>")
    assert not s.had_reasoning


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")


def test_template_reasons():
    assert template_reasons("{{ '<think>\\n' }}")
    assert template_reasons("{% set c = c.split('</think>')[-1] %}")
    assert not template_reasons("{{ messages }}")
    assert not template_reasons(None)
    assert template_reasons(None, vocab_has_tag=True)


def test_chatml_fallback_template():
    t = ChatTemplate(CHATML_TEMPLATE)
    out = t.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": None}, {"role": "tool", "content": "42"}])
    assert out == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                   "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n")
    assert not t.render([{"role": "user", "content": "x"}], add_generation_prompt=False).endswith("assistant\n")
