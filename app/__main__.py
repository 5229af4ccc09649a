"""`etserve` / `python -m app`: serve a model under gunicorn with the project's config.

Each flag sets its ETSERVE_* environment variable, then gunicorn starts with the packaged
config (app/gunicorn_conf.py); a deployment that sets only the environment is equivalent.
"""

from __future__ import annotations

import argparse
import os
import sys

from app.settings import SETTINGS

CONFIG = "python:app.gunicorn_conf"  # a module of the package: works from a checkout and an install


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="etserve",
        description="OpenAI-compatible server for ExecuTorch LLMs (gunicorn, one gevent worker).",
        epilog="Every flag can also be set by its environment variable.",
    )
    for s in SETTINGS:
        if s.switch:  # a flag without a value, like the ExecuTorch reference server's --no-think
            p.add_argument(s.flag, dest=s.name, default=None, action="store_const", const="1",
                           help=f"{s.help} (env {s.env}=1, default off)")
            continue
        p.add_argument(s.flag, dest=s.name, default=None, metavar=s.env,
                       help=f"{s.help} (env {s.env}, default {s.default or 'none'})")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    env = dict(os.environ)
    for s in SETTINGS:
        value = getattr(args, s.name)
        if value is not None:
            env[s.env] = str(value)
    os.execve(sys.executable, [sys.executable, "-m", "gunicorn", "-c", CONFIG], env)


if __name__ == "__main__":
    main()
