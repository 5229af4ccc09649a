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


def test_a_prompt_over_budget_keeps_the_lines_nearest_the_cursor(load_tok):
    tok = load_tok("qwen")
    fim = FimTokens.of(tok)
    prefix = "".join(f"above_{i} = {i}\n" for i in range(300)) + "def add(a, b):\n    "
    suffix = "\n" + "".join(f"below_{i} = {i}\n" for i in range(300))
    extra = [ExtraFile(f"f{i}.py", f"chunk_{i} = {i}\n" * 20) for i in range(10)]
    full = fim.prompt(tok, prefix, suffix, extra=extra, typed="ret")
    ids, truncated = fim.fit(tok, prefix, suffix, extra=extra, typed="ret", budget=400)
    assert truncated and len(ids) <= 400 < len(full)
    text = tok.decode(ids)
    head, rest = text.split("<|fim_prefix|>")
    kept_prefix, rest = rest.split("<|fim_suffix|>")
    kept_suffix, typed = rest.split("<|fim_middle|>")
    assert typed == "ret"
    assert kept_prefix.endswith("above_299 = 299\ndef add(a, b):\n    ")  # the cursor's side of the prefix
    assert kept_prefix.startswith("above_") and "above_0 = 0\n" not in kept_prefix  # whole lines, the far ones gone
    assert kept_suffix.startswith("\nbelow_0 = 0\n") and kept_suffix.endswith("\n")  # whole lines from the cursor
    assert len(tok.encode_text(kept_suffix)) <= 400 // 4
    assert len(tok.encode_text(kept_prefix)) > len(tok.encode_text(kept_suffix))
    # extra files: what the local context leaves, the newest (last) ones kept whole
    kept_files = [f.filename for f in extra if f"<|file_sep|>{f.filename}\n" in head]
    assert kept_files == [f.filename for f in extra[len(extra) - len(kept_files):]]
    ids_small, _ = fim.fit(tok, prefix, suffix, extra=extra, budget=60)
    assert len(ids_small) <= 60 and "<|file_sep|>" not in tok.decode(ids_small)


def test_a_prompt_within_budget_is_unchanged(load_tok):
    tok = load_tok("qwen")
    fim = FimTokens.of(tok)
    args = ("def f():\n    ", "\n", )
    extra = [ExtraFile("a.py", "x = 1\n")]
    assert fim.fit(tok, *args, extra=extra, budget=10_000) == (fim.prompt(tok, *args, extra=extra), False)


def test_one_line_longer_than_the_budget_is_cut_by_tokens_next_to_the_cursor(load_tok):
    tok = load_tok("qwen")
    fim = FimTokens.of(tok)
    ids, truncated = fim.fit(tok, "x = [" + ", ".join(str(i) for i in range(2000)), "]", budget=100)
    assert truncated and len(ids) <= 100
    assert tok.decode(ids).split("<|fim_suffix|>")[0].endswith("1998, 1999")
