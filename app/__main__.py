"""`etserve` / `python -m app`: serve a model under gunicorn with the project's config.

Each flag sets its ETSERVE_* environment variable, then gunicorn starts with the packaged
config (app/gunicorn_conf.py); a deployment that sets only the environment is equivalent.
"""

from __future__ import annotations

import argparse
import os
import sys

from app.settings import SETTINGS, Settings

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


def _check_port_free(host: str, port: int) -> None:
    """One line where gunicorn would retry the bind for five seconds and then print a dozen."""
    import errno
    import socket

    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as e:
        sys.exit(f"etserve: cannot bind {host}:{port}: {e}")
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                sys.exit(f"etserve: {host}:{port} is in use (another server?); choose another with --port")
            sys.exit(f"etserve: cannot bind {host}:{port}: {e.strerror or e}")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    env = dict(os.environ)
    for s in SETTINGS:
        value = getattr(args, s.name)
        if value is not None:
            env[s.env] = str(value)
    try:  # every value gunicorn's config would refuse, refused before a build
        settings = Settings.from_env(env)
    except ValueError as e:
        parser().error(str(e))
    _check_port_free(settings.host, settings.port)
    # a --model FILE.gguf is built by gunicorn's config (app/gunicorn_conf.py), before the worker starts
    os.execve(sys.executable, [sys.executable, "-m", "gunicorn", "-c", CONFIG], env)


if __name__ == "__main__":
    main()
