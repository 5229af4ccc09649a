"""The one per-choice output pipeline: its stream folds to its whole output, whatever the token cuts,
and each stage (stops, reasoning, tools) acts in order. Pure logic over a scripted generation."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from app.engine import Generation, GenerationStats, TokenEvent
from app.output import ChoicePipeline, ContentDelta, OutputOptions, ReasoningDelta, ToolArgumentsDelta, ToolCallStart
from app.text.reasoning import split_reasoning
from app.tools import parse_tool_calls

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
EOS = 0


class PieceTokenizer:
    """Token id i > 0 stands for pieces[i - 1]; id 0 is a special end-of-turn token."""

    def __init__(self, pieces: list[str]):
        self.pieces = pieces

    def token_bytes(self, token_id: int) -> bytes:
        return b"" if token_id == EOS else self.pieces[token_id - 1].encode()

    def is_special(self, token_id: int) -> bool:
        return token_id == EOS


def scripted(pieces: list[str], finish: str = "stop") -> tuple[Generation, PieceTokenizer]:
    stats = GenerationStats(prompt_tokens=3)

    def events():
        for i in range(1, len(pieces) + 1):
            stats.completion_tokens += 1
            yield TokenEvent(i, -0.5)
        stats.finish_reason = finish

    return Generation(events(), stats), PieceTokenizer(pieces)


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in zip(points, points[1:]) if b > a]


def streamed(pieces, options):
    generation, tok = scripted(pieces)
    pipeline = ChoicePipeline(generation, tok, options)
    return list(pipeline), pipeline


OUTPUTS = [
    "plain answer, no markup",
    "<think>\nlet me see\n</think>\n\nIt is sunny.",
    "<think>weigh it</think><tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
    "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "answer then STOP and more",
    "ends inside <think> the reasoning",
]


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, len(OUTPUTS) - 1), cuts=st.lists(st.integers(0, 400), max_size=25),
       parallel=st.booleans())
def test_stream_folds_to_the_whole_output_and_to_each_stage_run_alone(index, cuts, parallel):
    text = OUTPUTS[index]
    options = OutputOptions(stops=("STOP",), reasoning_started=False, tools=TOOLS, parallel_tool_calls=parallel)
    deltas, pipeline = streamed(cut(text, cuts), options)
    whole_gen, tok = scripted(cut(text, [7]))
    whole = ChoicePipeline(whole_gen, tok, options).run()

    reasoning = "".join(d.text for d in deltas if isinstance(d, ReasoningDelta))
    content = "".join(d.text for d in deltas if isinstance(d, ContentDelta))
    names = [d.name for d in deltas if isinstance(d, ToolCallStart)]
    assert (reasoning, content, names) == (whole.reasoning, whole.content, [c.name for c in whole.tool_calls])
    # each stage in order, run over the whole text, says the same
    before_stop = text.split("STOP")[0]
    split = split_reasoning(before_stop, started=False)
    parsed = parse_tool_calls(split.content, TOOLS, parallel=parallel)
    assert whole.reasoning == split.reasoning
    assert whole.content == parsed.content
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == \
        [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]
    assert pipeline.finish_reason == ("tool_calls" if parsed.tool_calls else "stop")


def test_tool_call_arguments_stream_as_fragments_of_the_final_arguments():
    text = OUTPUTS[3]
    deltas, pipeline = streamed(list(text), OutputOptions(tools=TOOLS))
    fragments: dict[int, str] = {}
    for d in deltas:
        if isinstance(d, ToolArgumentsDelta):
            fragments[d.index] = fragments.get(d.index, "") + d.fragment
    assert [json.loads(fragments[i])["city"] for i in sorted(fragments)] == ["Rome", "Paris"]
    assert pipeline.finish_reason == "tool_calls"


def test_stop_sequence_is_reported_and_cuts_the_text():
    deltas, pipeline = streamed(["answer then S", "TOP and more"], OutputOptions(stops=("TOP", "STOP")))
    assert "".join(d.text for d in deltas) == "answer then "
    assert pipeline.finish_reason == "stop"
    assert pipeline.stop_sequence == "STOP"  # the earliest match, not the shorter one later in it


def test_without_tools_or_reasoning_markup_is_content():
    text = OUTPUTS[2]
    deltas, _ = streamed([text], OutputOptions())
    assert deltas == [ContentDelta(text)]


def test_a_cancelled_choice_flushes_nothing_more():
    stats = GenerationStats()

    def events():
        yield TokenEvent(1, 0.0)
        stats.finish_reason = "cancelled"

    pipeline = ChoicePipeline(Generation(events(), stats), PieceTokenizer(["<think>half a thought</thi"]),
                              OutputOptions(reasoning_started=False, tools=TOOLS))
    assert list(pipeline) == [ReasoningDelta("half a thought")]  # the held "</thi" is not flushed out
    assert pipeline.cancelled and pipeline.finish_reason == "cancelled"


@pytest.mark.parametrize("started", [True, False])
def test_reasoning_started_by_the_prompt(started):
    deltas, _ = streamed(["thinking</think>answer"], OutputOptions(reasoning_started=started))
    if started:
        assert deltas == [ReasoningDelta("thinking"), ContentDelta("answer")]
    else:
        assert deltas == [ContentDelta("thinking</think>answer")]
