"""Speculative decoding and batched decode in the engine, on the real test model (a rows build):
the tokens are plain decoding's, greedy and sampled with a seed, however the steps are shared.

- Drafts (app/engine/drafts.py) verified in one forward call (app/engine/batching.py): at
  temperature 0 the output is byte-identical to decoding without drafts; with sampling and a
  seed, the same tokens too (rows are sampled in order, none past the first mismatch, so the
  random stream and the penalties' history advance as in plain decoding).
- Several sequences decoding at once share forward calls (a step taken along by the sequence
  holding the step gate), and each still gets its output alone.
"""

from __future__ import annotations

import threading

import pytest

from app.engine import Engine, GenerationRequest, NativeModel, SamplingParams

GREEDY = SamplingParams(temperature=0.0)
CODE = '''def mean(xs):
    """The arithmetic mean of xs."""
    total = 0
    for x in xs:
        total += x
    return total / len(xs)


def variance(xs):
    """The population variance of xs."""
    m = mean(xs)
    total = 0
    for x in xs:
        total += (x - m) ** 2
    return total / len(xs)
'''


@pytest.fixture(scope="module")
def model(model_dir):
    m = NativeModel(model_dir / "model.pte")  # its own: the served model's engine keeps its slots
    yield m
    m.close()


@pytest.fixture(scope="module")
def prompts(served_model):
    def chat(text):
        return served_model.tokenizer.encode(served_model.template.render([{"role": "user", "content": text}]))

    return [
        chat("Copy this code exactly, then stop:\n\n" + CODE),
        chat("Write a short poem about the sea."),
        chat("List the numbers from 1 to 30, separated by commas."),
        chat("Rename `total` to `acc` in this code and show all of it:\n\n" + CODE),
    ]


def engine(model, **options) -> Engine:
    """An engine whose outputs are compared: no prefix reuse, and prompts read in whole chunks
    whatever the host's load (prefill_step_s 0: shrunken chunks round differently)."""
    return Engine(model, prefix_reuse=False, prefill_step_s=0, **options)


def generate(engine: Engine, ids: list[int], n: int, sampling=GREEDY):
    gen = engine.generate(GenerationRequest(ids, n, sampling, frozenset({2})))
    return [e.token_id for e in gen], gen.stats


def together(engine: Engine, prompts, n: int, sampling=GREEDY):
    out = [None] * len(prompts)

    def one(i):
        out[i] = generate(engine, prompts[i], n, sampling)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_greedy_output_is_plain_decodings_with_drafts_and_shared_steps(model, prompts):
    draft_max = 31  # up to a whole rows call of one sequence's draft (the default clamps to it)
    plain = engine(model, slots=4, draft_max=0)
    alone = [generate(plain, p, 80)[0] for p in prompts]
    spec = engine(model, slots=4, draft_max=draft_max)
    one_by_one = [generate(spec, p, 80) for p in prompts]
    assert [t for t, _ in one_by_one] == alone
    copy_stats = one_by_one[0][1]
    assert copy_stats.draft_accepted >= 20, copy_stats  # copying code: most drafts are right
    assert copy_stats.completion_tokens > 0 and spec.model.forward_calls > 0
    assert set(spec.step_costs.measured()) - {1}, "the engine measured no drafted step's cost"
    shared = engine(model, slots=4, draft_max=draft_max)
    results = together(shared, prompts, 80)
    assert [t for t, _ in results] == alone
    assert shared.steps.shared > 0, "no decode step went along in another sequence's forward call"
    assert sum(s.drafted for _, s in results) > 0


def test_batched_decode_without_drafts(model, prompts):
    plain = engine(model, slots=4, draft_max=0)
    alone = [generate(plain, p, 40)[0] for p in prompts]
    shared = engine(model, slots=4, draft_max=0)
    assert [t for t, _ in together(shared, prompts, 40)] == alone
    assert shared.steps.shared > 0


@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=0.8, seed=1234),
    SamplingParams(temperature=1.0, top_k=40, top_p=0.9, repetition_penalty=1.1, seed=7),
])
def test_sampled_output_with_a_seed_is_plain_decodings(model, prompts, sampling):
    plain = engine(model, slots=2, draft_max=0)
    spec = engine(model, slots=2, draft_max=8, draft_sampled=True)
    for p in (prompts[0], prompts[3]):
        expected = generate(plain, p, 60, sampling)[0]
        got, stats = generate(spec, p, 60, sampling)
        assert got == expected
        assert stats.drafted > 0


def test_sampled_requests_draft_unless_told_not_to(model, prompts):
    sampled = SamplingParams(temperature=0.8, seed=1234)
    default = engine(model, slots=2, draft_max=8)
    assert sum(generate(default, p, 60, sampled)[1].drafted for p in (prompts[0], prompts[3])) > 0
    greedy_only = engine(model, slots=2, draft_max=8, draft_sampled=False)
    assert sum(generate(greedy_only, p, 60, sampled)[1].drafted for p in (prompts[0], prompts[3])) == 0
    _, stats = generate(greedy_only, prompts[0], 30)
    assert stats.drafted > 0  # greedy ones draft


def test_sampled_output_under_a_grammar_with_a_seed_is_plain_decodings(model, model_dir, prompts):
    """A constrained, sampled generation (a JSON schema, as response_format or a tool's arguments
    give): each verified row's mask comes from the grammar state after the rows before it."""
    from app.grammar import GrammarCompiler, json_grammar, output_grammar

    compiler = GrammarCompiler.from_file(model_dir / "tokenizer.json", model.info.vocab_size, model.info.eos_ids)
    schema = {"type": "object", "properties": {"code": {"type": "string"}, "lines": {"type": "integer"}},
              "required": ["code", "lines"]}
    grammar = compiler.compile(output_grammar(json_grammar(schema)))
    plain = engine(model, slots=2, draft_max=0)
    spec = engine(model, slots=2, draft_max=16, draft_sampled=True)
    drafted = 0
    for seed in (1, 2, 3):
        sampling = SamplingParams(temperature=0.9, top_p=0.95, seed=seed)

        def run(engine):
            gen = engine.generate(GenerationRequest(prompts[0], 60, sampling, frozenset({2}), constraint=grammar))
            return [e.token_id for e in gen], gen.stats

        expected, _ = run(plain)
        got, stats = run(spec)
        assert got == expected, seed
        drafted += stats.drafted
    assert drafted > 0


def test_a_grammars_forced_tokens_are_drafted(model, model_dir, prompts):
    """Keys a schema fixes are drafted from the grammar (nothing in a poem's prompt to copy them
    from) and accepted: the output stays plain decoding's."""
    from app.grammar import GrammarCompiler, json_grammar, output_grammar

    compiler = GrammarCompiler.from_file(model_dir / "tokenizer.json", model.info.vocab_size, model.info.eos_ids)
    schema = {"type": "object", "properties": {"the_title_of_this_poem_in_plain_words": {"type": "string"},
                                               "the_number_of_its_verses_counted_by_hand": {"type": "integer"}},
              "required": ["the_title_of_this_poem_in_plain_words", "the_number_of_its_verses_counted_by_hand"]}
    grammar = compiler.compile(output_grammar(json_grammar(schema)))
    request = GenerationRequest(prompts[1], 60, GREEDY, frozenset({2}), constraint=grammar)
    plain = engine(model, slots=2, draft_max=0)
    expected = [e.token_id for e in plain.generate(request)]
    spec = engine(model, slots=2, draft_max=16)
    gen = spec.generate(request)
    assert [e.token_id for e in gen] == expected
    assert gen.stats.draft_accepted >= 8, gen.stats  # the two keys' tokens, at least


@pytest.fixture(scope="module")
def qwen(qwen_dir):
    m = NativeModel(qwen_dir / "model.pte")
    yield m
    m.close()


def test_sampled_tool_calling_turns_are_plain_decodings_on_the_default_model(qwen, qwen_dir):
    """The case of a coding agent's turn (Codex, Claude Code): the default model (Qwen, int8
    caches, AMX where the CPU has it), its own template with tools, temperature 1 and no grammar
    (tool_choice auto): for each seed the tokens of plain decoding, so whether the model calls
    a tool is as likely with drafts as without."""
    from app.text.chat_template import ChatTemplate
    from app.text.tokenizer import Tokenizer

    tok = Tokenizer.from_files(qwen_dir / "tokenizer.json", qwen_dir / "tokenizer_config.json")
    template = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)
    tools = [{"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the project",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
    prompt = tok.encode(template.render(
        [{"role": "user", "content": "What does app/engine/drafts.py define? Read it, then tell me. Here is the "
                                     "start of it:\n\n" + CODE}], tools=tools))
    stops = frozenset(qwen.info.eos_ids)
    plain = engine(qwen, slots=2, draft_max=0)
    spec = engine(qwen, slots=2, draft_max=16)
    drafted = 0
    for seed in (11, 12, 13, 14):
        sampling = SamplingParams(temperature=1.0, top_p=1.0, seed=seed)
        expected = [e.token_id for e in plain.generate(GenerationRequest(prompt, 48, sampling, stops))]
        gen = spec.generate(GenerationRequest(prompt, 48, sampling, stops))
        assert [e.token_id for e in gen] == expected, seed
        drafted += gen.stats.drafted
    assert drafted > 0, "sampled requests draft by default"
