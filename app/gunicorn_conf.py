"""gunicorn settings for etserve: one gevent worker around one in-process model.

Part of the package, so an installed etserve needs no file beside it: `etserve` runs
`gunicorn -c python:app.gunicorn_conf`; plain gunicorn deployments use the same
(the checkout's gunicorn.conf.py imports this module). Every value comes from the
ETSERVE_* environment (app/settings.py).
"""

import os

from app.settings import Settings

try:
    _settings = Settings.from_env()
except ValueError as e:  # a bad ETSERVE_* value: say which, before gunicorn starts anything
    raise SystemExit(f"etserve: {e}") from None


def _build_gguf(path: str, quantize: str) -> str:
    """``--model FILE.gguf`` (`etserve`, or ETSERVE_MODEL under plain gunicorn): built with
    --quantize when given, once (cached by the file's checksum and the options; progress on
    stderr); the model directory. Needs the build extras (torch, executorch, gguf)."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "app.models", "build-gguf", path] + (["--quantize", quantize] if quantize else [])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:  # build-gguf said why, in one line
        raise SystemExit(proc.returncode)
    return proc.stdout.strip().splitlines()[-1]


if _settings.model.endswith(".gguf") and not _settings.model_path and not _settings.models_dir:
    # before the worker starts: it inherits the directory (and a reload finds it set)
    os.environ["ETSERVE_MODEL_PATH"] = _build_gguf(_settings.model, _settings.quantize)
    os.environ.pop("ETSERVE_QUANTIZE", None)  # applied: the server is given the build itself

wsgi_app = "app.wsgi:create_app()"
bind = [f"[{_settings.host}]:{_settings.port}" if ":" in _settings.host else f"{_settings.host}:{_settings.port}"]
workers = 1  # the model lives in the worker; generation is serialized by its lock
worker_class = "gevent"
worker_connections = 256
timeout = 60  # heartbeat only: native work runs off the gevent hub
graceful_timeout = 30
keepalive = 5
accesslog = "-"
# one line per request, carrying the id the response's X-Request-Id header shows, the client
# a proxy forwarded for, and for completions their tokens and timings (app/http/generation_resource.py)
access_log_format = ('%(h)s "%(r)s" %(s)s %(B)sB %(M)sms rid=%({x-request-id}o)s fwd=%({x-forwarded-for}i)s '
                     '%({etserve.generation}e)s')

errorlog = "-"
loglevel = os.environ.get("ETSERVE_LOG_LEVEL", "info")
# gunicorn's control socket is one fixed path per user; several servers on one
# machine (replicas, tests) would fight over it, and we do not use it.
control_socket_disable = True


def post_fork(server, worker):
    """The worker answers what gunicorn refuses itself (a request line or header it cannot parse)
    in the APIs' JSON error shape, not gunicorn's HTML page (app/http/server_errors.py)."""
    from app.http.server_errors import install

    install()


def worker_exit(server, worker):
    """Session states still being written to --session-dir reach the disk before the worker
    ends (the arbiter kills it graceful_timeout seconds after asking it to stop)."""
    from app.wsgi import shutdown

    shutdown(timeout=max(1.0, graceful_timeout - 5))
