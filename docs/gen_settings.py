"""Write docs/settings.md from the settings table in app/settings.py, so the page cannot drift.

    .venv/bin/python docs/gen_settings.py           # rewrite docs/settings.md
    .venv/bin/python docs/gen_settings.py --check   # exit 1 if docs/settings.md is not current

tests/docs/test_docs.py fails when the file differs from render().
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.settings import SETTINGS  # noqa: E402

OUT = ROOT / "docs" / "settings.md"


def _extra_settings():
    """The variables read outside app/settings.py, as deploy/gen_env_example.py lists them."""
    spec = importlib.util.spec_from_file_location("_gen_env_example", ROOT / "deploy" / "gen_env_example.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.EXTRA


HEADER = """\
<!-- Generated from app/settings.py by docs/gen_settings.py: edit the settings table there, then
     run `.venv/bin/python docs/gen_settings.py`. tests/docs/test_docs.py checks this file. -->
# Settings

Each setting is a flag of `etserve` / `python -m app` and an environment variable, for plain
gunicorn deployments (`gunicorn -c python:app.gunicorn_conf`, or `gunicorn -c gunicorn.conf.py`
in a checkout) and systemd's `EnvironmentFile` (`deploy/etserve.env.example` lists them all).
`etserve --help` prints the same list.

Switches take no value on the command line; their variables take `1`/`true`/`yes`/`on` or
`0`/`false`/`no`/`off`. The flags match the ExecuTorch reference server's, so its users can
switch: `etserve --model-path model.pte --hf-tokenizer ./Qwen3-0.6B --max-context 2048 --no-think`.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    lines = [HEADER, "| env | flag | default | what |", "|---|---|---|---|"]
    for s in SETTINGS:
        flag = f"`{s.flag}` (switch)" if s.switch else f"`{s.flag}`"
        default = ("off" if s.default in ("0", "") else "on") if s.switch else (f"`{s.default}`" if s.default else "")
        lines.append(f"| `{s.env}` | {flag} | {default} | {_cell(s.help)} |")
    lines += ["", "Read outside `app/settings.py` (by gunicorn's configuration, the runtime or the model tools); "
              "no flag:", "", "| env | default | what |", "|---|---|---|"]
    for env, default, help in _extra_settings():
        lines.append(f"| `{env}` | {f'`{default}`' if default else ''} | {_cell(help)} |")
    lines += ["", "The runtime also reads `ETSERVE_ATTENTION=generic` and `ETSERVE_LINEAR=generic`, which turn "
              "off the AMX/VNNI attention and 4-bit linear kernels (`ETSERVE_ATTENTION=generic` also keeps the AVX2 tier's "
              "int8 KV caches in rows instead of tiles; for comparisons and debugging).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="write docs/settings.md from app/settings.py")
    p.add_argument("--check", action="store_true", help="exit 1 if docs/settings.md is not current")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run .venv/bin/python docs/gen_settings.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
