"""Fill-in-the-middle: greedy infills of held-out Python functions, etserve vs llama.cpp's /infill.

The functions are bench/data/fim_functions.py (20, written for this bench). Each case is one
function with the middle third of its body's lines removed (at least two lines); both servers get
the same request in llama.cpp's /infill shape, as an editor plugin (llama.vscode) sends it with
the cursor where the first removed line's code starts:

    POST /infill {"input_prefix": ... + its indentation, "input_suffix": ..., "n_indent": that
                  indentation, "n_predict": 64, "temperature": 0}

(`n_indent`, which llama.cpp's server and etserve both honour, ends the middle before a line
indented less than the cursor's block: without it an instruct model writes on past the gap.)

and an infill counts when it is not blank and prefix + infill + suffix parses (`ast.parse`). The
row: etserve's count ÷ llama.cpp's (target ≥ 1.0: at least as many). Also printed: how many infills
reproduce the removed lines exactly (whitespace-trimmed), and how many cases would parse with
nothing filled in (those can only count with a non-blank infill).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import requests

from bench.table import Row, log

FUNCTIONS = Path(__file__).resolve().parent / "data" / "fim_functions.py"
NAME = "fim vs llama.cpp"
N_PREDICT = 64


@dataclass(frozen=True)
class Case:
    name: str
    prefix: str
    middle: str
    suffix: str


def cases(path: Path = FUNCTIONS) -> list[Case]:
    """Each top-level function with the middle third of its body's lines (after any docstring)
    removed."""
    source = path.read_text()
    lines = source.splitlines(keepends=True)
    out = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        body = node.body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
            body = body[1:]
        head = lines[node.lineno - 1:body[0].lineno - 1]
        rest = lines[body[0].lineno - 1:node.end_lineno]
        start, count = len(rest) // 3, max(2, len(rest) // 3)
        out.append(Case(node.name, "".join(head + rest[:start]), "".join(rest[start:start + count]),
                        "".join(rest[start + count:])))
    return out


def parses(text: str) -> bool:
    try:
        ast.parse(text)
        return True
    except SyntaxError:
        return False


def cursor(case: Case) -> str:
    """The indentation of the first removed line: where an editor's cursor stands to write it."""
    first = case.middle.splitlines()[0] if case.middle else ""
    return first[:len(first) - len(first.lstrip(" \t"))]


def infill(url: str, case: Case) -> str | None:
    """The server's infill (after the cursor's indentation), or None when it does not serve /infill."""
    indent = cursor(case)
    r = requests.post(url + "/infill", json={"input_prefix": case.prefix + indent, "input_suffix": case.suffix,
                                             "n_indent": len(indent), "n_predict": N_PREDICT, "temperature": 0},
                      timeout=600)
    if r.status_code in (404, 405, 501):
        return None
    if not r.ok:
        raise RuntimeError(f"{url}/infill: {r.status_code} {r.text[:300]}")
    body = r.json()
    if "content" in body:
        return body["content"]
    return body["choices"][0]["text"]


def score(url: str, all_cases: list[Case]) -> dict | None:
    compiled, exact, texts = 0, 0, []
    for case in all_cases:
        text = infill(url, case)
        if text is None:
            return None
        texts.append(text)
        compiled += bool(text.strip()) and parses(case.prefix + cursor(case) + text + case.suffix)
        exact += text.strip() == case.middle.strip()
    return {"compiled": compiled, "exact": exact, "infills": texts}


def fim_rows(sides: dict[str, str], results: dict, limit: int | None = None) -> list[Row]:
    """`sides`: {"etserve": url, "llama.cpp": url}, each serving the model; `limit`: the first
    cases only (a quick run)."""
    all_cases = cases()[:limit]
    trivial = sum(parses(c.prefix + c.suffix) for c in all_cases)
    scores = {}
    for side, url in sides.items():
        log(f"FIM: {len(all_cases)} infills from {side}")
        scores[side] = score(url, all_cases)
    results["fim"] = scores
    what = (f"greedy infills that parse, of {len(all_cases)} held-out Python functions with their middle removed "
            f"({FUNCTIONS.name}; {trivial} would parse with nothing filled in, a blank infill never counts)")
    theirs = scores["llama.cpp"]
    if theirs is None:
        return [Row(NAME, what, "n/a: llama.cpp's server does not serve /infill for this model")]
    if scores["etserve"] is None:
        return [Row(NAME, what, f"etserve: not served (POST /infill); llama.cpp {theirs['compiled']} "
                    f"({theirs['exact']} exact)", target=(">=", 1.0))]
    mine = scores["etserve"]
    ratio = mine["compiled"] / theirs["compiled"] if theirs["compiled"] else (1.0 if not mine["compiled"] else float("inf"))
    return [Row(NAME, what, f"{mine['compiled']} / {theirs['compiled']} (exact: {mine['exact']} / {theirs['exact']})",
                ratio, (">=", 1.0))]
