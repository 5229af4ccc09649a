"""Write deploy/etserve.env.example from app/settings.py, so the list of settings cannot drift.

    .venv/bin/python deploy/gen_env_example.py > deploy/etserve.env.example

tests/e2e/test_service.py checks the file names every setting.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import SETTINGS  # noqa: E402

# Read outside app/settings.py (by gunicorn's config, the runtime or the model tools), with their defaults.
EXTRA = (
    ("ETSERVE_LOG_LEVEL", "info", "gunicorn's log level (debug, info, warning, error); etserve's own lines are logged at info whatever it says"),
    ("ETSERVE_CACHE", "", "where built models live, in models/NAME/VARIANT/ (default ~/.cache/etserve)"),
    ("ETSERVE_NATIVE_LIB", "", "the native runtime library to load (default: the one in the installed package, "
                               "else native/build in the checkout)"),
    ("ETSERVE_ISA", "", "force a lower CPU kernel tier than the best this CPU runs: scalar, avx2, avx512 or amx "
                        "(x86-64); scalar, neon or neon-dotprod (aarch64); the start-up log names the tier"),
    ("ETSERVE_NATIVE_LOG_LEVEL", "", "the ExecuTorch runtime's log messages at or above this level reach the log "
                                     "(0 debug, 1 info, 2 warning, 3 error, 4 fatal; default 2)"),
)

HEADER = """\
# etserve's environment, for systemd's EnvironmentFile=/etc/etserve.env (deploy/etserve.service)
# or any process manager. Generated from app/settings.py by deploy/gen_env_example.py.
# Each setting is also a flag of `etserve` (etserve --help); a commented line shows the default.
# Lines are KEY=value: no `export`, no spaces around `=`.
"""


def entry(env: str, default: str, help: str, flag: str | None = None) -> str:
    about = f"{help} ({flag})" if flag else help
    lines = [f"# {line}" for line in textwrap.wrap(about, 94, break_on_hyphens=False)]
    lines.append(f"#{env}={default}")
    return "\n".join(lines)


def render() -> str:
    parts = [HEADER.rstrip()]
    for s in SETTINGS:
        parts.append(entry(s.env, s.default, s.help, s.flag))
    parts.append("# --- read by gunicorn's config, the runtime and the model tools, no flag ---")
    for env, default, help in EXTRA:
        parts.append(entry(env, default, help))
    return "\n\n".join(parts) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
