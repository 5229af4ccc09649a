"""app/models/lowering.py changes how the lowering runs, not what it computes: the patched
library functions are restored afterwards, and provenance chains recorded with shared NodeSource
objects equal the deep-copied ones. (That the written program is byte-identical is checked by
tests/models/test_pipeline.py: our pipeline lowers inside ``faster_lowering``, ``export_llama``
does not.)"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from app.models import lowering  # noqa: E402


def test_patches_are_restored():
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir import lowered_backend_module as lbm
    from executorch.exir.backend import backend_api
    from torch.fx import traceback as fx_traceback

    before = (XnnpackBackend.copy_exported_program_for_preprocess, XnnpackBackend.preprocess_multimethod,
              lbm.legalize_graph, backend_api._create_partitions, fx_traceback.NodeSource.__init__)
    with lowering.faster_lowering():
        assert fx_traceback.NodeSource.__init__ is lowering._node_source_init  # torch is the version it replaces
        assert lbm.legalize_graph is not before[2]
    after = (XnnpackBackend.copy_exported_program_for_preprocess, XnnpackBackend.preprocess_multimethod,
             lbm.legalize_graph, backend_api._create_partitions, fx_traceback.NodeSource.__init__)
    assert after == before
    assert "copy_exported_program_for_preprocess" not in XnnpackBackend.__dict__


def _rerun(gm):
    from torch.fx import Interpreter

    def run(a):
        return Interpreter(gm).run(a)

    return run


def _provenance_after_passes(n: int):
    """Trace a small function, then retrace it ``n`` times with node meta preserved (as export passes
    do); returns the last graph's provenance, as dicts."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import preserve_node_meta

    def f(x):
        return torch.relu(x * 2 + 1).sum()

    x = torch.randn(4)
    with preserve_node_meta():
        gm = make_fx(f)(x)
        for _ in range(n):
            gm = make_fx(_rerun(gm))(x)
    chains = [[s.to_dict() for s in node.meta.get("from_node", [])] for node in gm.graph.nodes]
    ids: dict[int, int] = {}  # graph ids are id()s of this run's graphs: number them by first appearance

    def renumber(d):
        return {**d, "graph_id": ids.setdefault(d["graph_id"], len(ids)), "from_node": [renumber(s) for s in d["from_node"]]}

    return [[renumber(d) for d in chain] for chain in chains]


def test_shared_provenance_equals_deep_copies():
    reference = _provenance_after_passes(3)
    assert any(reference) and max(len(str(c)) for c in reference) > 300  # chains three passes deep
    with lowering.shared_provenance():
        shared = _provenance_after_passes(3)
    assert shared == reference
