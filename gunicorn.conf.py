"""`gunicorn -c gunicorn.conf.py` from a checkout: the packaged settings, app/gunicorn_conf.py
(an installed etserve uses `gunicorn -c python:app.gunicorn_conf`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the app package beside this file

from app.gunicorn_conf import *  # noqa: E402,F401,F403
