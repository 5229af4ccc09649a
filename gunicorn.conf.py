"""`gunicorn -c gunicorn.conf.py` from a checkout: the packaged settings, app/gunicorn_conf.py
(an installed etserve uses `gunicorn -c python:app.gunicorn_conf`)."""

from app.gunicorn_conf import *  # noqa: F401,F403
