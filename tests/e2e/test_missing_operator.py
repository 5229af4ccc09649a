"""A .pte that needs an operator we do not have fails at start-up, with a message naming the
operator: NativeModel raises, and a server on it reports "failed" on /health and logs why
(one line, not a stack trace) before any request comes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from app.engine import NativeError, NativeModel

OPERATOR = "etserve_test::mystery.out"

# A one-op program: our own custom op, defined here with torch.library (functional and .out
# variants), which no ExecuTorch kernel library registers. Exports in seconds.
EXPORT_SCRIPT = r'''
import sys
import torch
from executorch.exir import EdgeCompileConfig, to_edge

lib = torch.library.Library("etserve_test", "DEF")
lib.define("mystery(Tensor x) -> Tensor")
lib.define("mystery.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")

@torch.library.impl(lib, "mystery", "CompositeExplicitAutograd")
def mystery(x):
    return x + 1

@torch.library.impl(lib, "mystery.out", "CompositeExplicitAutograd")
def mystery_out(x, *, out):
    return out.copy_(x + 1)

@torch.library.register_fake("etserve_test::mystery")
def _(x):
    return torch.empty_like(x)

class Mystery(torch.nn.Module):
    def forward(self, tokens, positions):
        return torch.ops.etserve_test.mystery(tokens.float())

ep = torch.export.export(Mystery(), (torch.ones(1, 4, dtype=torch.long), torch.zeros(1, dtype=torch.long)))
prog = to_edge(ep, compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
ops = {f"{op.name}.{op.overload}" for plan in prog.executorch_program.execution_plan for op in plan.operators}
assert "etserve_test::mystery.out" in ops, ops
with open(sys.argv[1], "wb") as f:
    f.write(prog.buffer)
'''


@pytest.fixture(scope="session")
def mystery_pte(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("executorch.exir")
    path = tmp_path_factory.mktemp("mystery_op") / "model.pte"
    proc = subprocess.run([sys.executable, "-c", EXPORT_SCRIPT, str(path)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail("export of the test program failed:\n" + proc.stderr[-4000:])
    return path


def test_native_model_names_the_missing_operator(mystery_pte):
    with pytest.raises(NativeError) as info:
        NativeModel(mystery_pte)
    message = str(info.value)
    assert str(mystery_pte) in message
    assert f"the program needs operators this runtime does not have: {OPERATOR}" in message


def test_server_on_a_program_with_a_missing_operator_fails_at_startup(tmp_path, model_dir, mystery_pte,
                                                                      make_server):
    directory = tmp_path / "mystery-model"
    directory.mkdir()
    (directory / "model.pte").symlink_to(mystery_pte)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (directory / name).symlink_to(model_dir / name)
    srv = make_server({"ETSERVE_MODEL_PATH": str(directory)}, status="failed")  # no request sent yet
    health = requests.get(srv.base_url + "/health", timeout=5)
    assert health.status_code == 503 and health.json()["status"] == "failed"
    log = srv.log_path.read_text()
    lines = [line for line in log.splitlines() if "model failed to load:" in line]
    assert len(lines) == 1, log[-4000:]
    assert lines[0].endswith(f"does not have: {OPERATOR}"), lines[0]
    assert "Traceback" not in log
