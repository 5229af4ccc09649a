"""Our server passes the black-box conformance suite (conformance/), run as a client would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_conformance_suite_passes_against_our_server(server, served_model):
    env = dict(os.environ, OPENAI_BASE_URL=server.base_url + "/v1", OPENAI_MODEL=served_model.id)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "conformance")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr
    print(proc.stdout[-3000:])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 15 and "skipped" not in summary, summary
