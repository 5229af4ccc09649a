"""`etserve` / `python -m app`: serve a model under gunicorn with the project's config.

Each flag sets its ETSERVE_* environment variable, then gunicorn starts with the packaged
config (app/gunicorn_conf.py); a deployment that sets only the environment is equivalent.
"""

from __future__ import annotations

import argparse
import os
import sys

from app.models.registry import check_quantize
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


def _build_gguf(path: str, quantize: str = "") -> str:
    """``--model FILE.gguf``: build it (with --quantize when given; cached by the file's checksum
    and the options; progress on stderr) and return the model directory. Needs the build extras
    (torch, executorch, gguf)."""
    import subprocess

    cmd = [sys.executable, "-m", "app.models", "build-gguf", path] + (["--quantize", quantize] if quantize else [])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    return proc.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    env = dict(os.environ)
    for s in SETTINGS:
        value = getattr(args, s.name)
        if value is not None:
            env[s.env] = str(value)
    quantize = env.get("ETSERVE_QUANTIZE", "")
    try:
        check_quantize(quantize)
    except ValueError as e:
        parser().error(str(e))
    model = env.get("ETSERVE_MODEL", "")
    if model.endswith(".gguf") and not env.get("ETSERVE_MODEL_PATH"):
        env["ETSERVE_MODEL_PATH"] = _build_gguf(model, quantize)
        env.pop("ETSERVE_QUANTIZE", None)  # applied: the server is given the build itself
    os.execve(sys.executable, [sys.executable, "-m", "gunicorn", "-c", CONFIG], env)


if __name__ == "__main__":
    main()
