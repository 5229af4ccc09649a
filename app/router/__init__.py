"""Several models behind one server: --models-dir (app/router/hosting.py)."""
