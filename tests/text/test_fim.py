"""FIM prompts in the model's own tokens: Qwen2.5-Coder has them (and the repo-level ones), SmolLM2 has none."""

from __future__ import annotations

from app.text.fim import ExtraFile, FimTokens


def test_qwen_fim_prompt_is_prefix_suffix_middle_by_id(load_tok):
    tok = load_tok("qwen")
    fim = FimTokens.of(tok)
    assert fim is not None and fim.repo is not None and fim.file_sep is not None
    ids = fim.prompt(tok, "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
    assert ids[0] == fim.prefix and ids[-1] == fim.middle and ids.count(fim.suffix) == 1
    assert tok.decode(ids) == ("<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n"
                               "<|fim_middle|>")
    assert fim.end_ids >= {fim.file_sep, fim.repo}


def test_text_that_looks_like_a_fim_token_stays_text(load_tok):
    tok = load_tok("qwen")
    fim = FimTokens.of(tok)
    ids = fim.prompt(tok, "x = '<|fim_middle|>'", "")
    assert ids.count(fim.middle) == 1 and ids[-1] == fim.middle  # only the one we put there


def test_repo_level_prompt_with_extra_files(load_tok):
    tok = load_tok("qwen")
    fim = FimTokens.of(tok)
    ids = fim.prompt(tok, "import util\n", "", extra=[ExtraFile("util.py", "def helper(): pass\n")], typed="ut")
    assert tok.decode(ids) == ("<|repo_name|>myproject\n<|file_sep|>util.py\ndef helper(): pass\n"
                               "<|file_sep|>filename\n<|fim_prefix|>import util\n<|fim_suffix|><|fim_middle|>ut")


def test_a_model_without_fim_tokens_has_none(load_tok):
    assert FimTokens.of(load_tok("smollm2")) is None
