"""app/models/lowering.py changes how the lowering runs, not what it computes: the patched
library functions are restored afterwards, and provenance chains recorded with shared NodeSource
objects equal the deep-copied ones. (That the written program is byte-identical is checked by
tests/models/test_pipeline.py: our pipeline lowers inside ``faster_lowering``, ``export_llama``
does not.)"""

from __future__ import annotations

import contextlib

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


def _exported(f, *args):
    return torch.export.export(f, args, strict=False)


def test_idle_decompositions_are_skipped_and_busy_ones_run():
    """On a functional program (one the block produced, or the caller vouches for), an empty table or
    one naming no operator of the graph returns the program itself; a table naming one of its
    operators, and any call on a program not known to be functional, run as before."""

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x) + 1

    ep = _exported(M(), torch.randn(4))
    table = {torch.ops.aten.sigmoid.default: lambda x: 1 / (1 + torch.exp(-x))}
    with lowering.skip_idle_decompositions() as decisions:
        functional = ep.run_decompositions({})  # not produced in the block: runs
        assert functional is not ep
        targets = {str(n.target) for n in functional.graph.nodes if n.op == "call_function"}
        assert "aten.silu.default" in targets and "aten.sigmoid.default" not in targets
        assert functional.run_decompositions(table) is functional  # no sigmoid in the graph: skipped
        silu_table = {torch.ops.aten.silu.default: lambda x: x * torch.sigmoid(x)}
        decomposed = functional.run_decompositions(silu_table)  # silu in the graph: runs
        assert decomposed is not functional
        assert "aten.silu.default" not in {str(n.target) for n in decomposed.graph.nodes}
        assert decomposed.run_decompositions({}) is decomposed  # functional already: skipped
    assert [skipped for _, skipped in decisions] == [False, True, False, True]
    with lowering.skip_idle_decompositions(functional=[functional]) as decisions:
        assert functional.run_decompositions({}) is functional  # the caller's word
        assert ep.run_decompositions({}) is not ep  # not functional as far as the block knows
    assert [skipped for _, skipped in decisions] == [True, False]
    assert type(ep).run_decompositions.__qualname__ == "ExportedProgram.run_decompositions"  # restored


def test_skipped_decompositions_lower_to_the_same_bytes():
    """``to_edge_transform_and_lower`` with both XNNPACK partitioners (as builds lower), with and
    without skipping the idle decompositions and edge passes: the same program, byte for byte."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 32)
            self.b = torch.nn.Linear(32, 8)

        def forward(self, x):
            h = torch.nn.functional.silu(self.a(x))
            return torch.softmax(self.b(h).transpose(0, 1), dim=-1), h.mean(dim=-1)

    def lower(skip: bool):
        ep = _exported(M().eval(), torch.randn(3, 16)).run_decompositions({})
        partitioners = [XnnpackPartitioner(), XnnpackPartitioner()]
        decompositions = lowering.skip_idle_decompositions(functional=[ep]) if skip else contextlib.nullcontext([])
        edge_passes = lowering.skip_idle_edge_passes() if skip else contextlib.nullcontext([])
        with decompositions as decisions, edge_passes as pass_decisions:
            program = to_edge_transform_and_lower(ep, partitioner=partitioners).to_executorch().buffer
        assert not skip or pass_decisions == [("NormalizeTransposePass", True),
                                              ("ReplaceBrokenOpsWithFunctionalOpsPass", True)]
        return program, decisions

    torch.manual_seed(0)
    reference, _ = lower(False)
    torch.manual_seed(0)
    skipping, decisions = lower(True)
    assert decisions[0] == (0, True)  # the functionalization of a functional program
    assert sum(skipped for _, skipped in decisions) >= 3
    assert skipping == reference


def _square(i: int) -> int:
    return i * i


def test_pool_returns_in_order_and_leaves_no_workers():
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork")
    assert lowering._map_in_pool(_square, 7, 2) == [i * i for i in range(7)]
    assert multiprocessing.active_children() == []  # closed and joined, not left to terminate


def test_idle_edge_passes_are_skipped_and_busy_ones_run():
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass

    def targets(gm):
        return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]

    class Fn(torch.nn.Module):
        def __init__(self, f):
            super().__init__()
            self.f = f

        def forward(self, x):
            return self.f(x)

    def graph(f):
        return _exported(Fn(f), torch.randn(3, 4)).run_decompositions({}).graph_module

    before = NormalizeTransposePass.__dict__.get("call")
    with lowering.skip_idle_edge_passes() as decisions:
        plain = graph(lambda x: x.relu())
        result = NormalizeTransposePass()(plain)
        assert result.graph_module is plain and not result.modified
        transposed = graph(lambda x: torch.t(x) * 2)
        assert "aten.t.default" in targets(transposed)
        result = NormalizeTransposePass()(transposed)
        assert "aten.t_copy.default" in targets(result.graph_module)  # the pass ran
    assert decisions == [("NormalizeTransposePass", True), ("NormalizeTransposePass", False)]
    assert NormalizeTransposePass.__dict__.get("call") is before


def test_pattern_passes_build_their_patterns_only_where_they_could_match():
    """XNNPACK's SDPA and bilinear-upsampling passes over a partition without their operator run with
    no patterns: the same program, byte for byte; a partition holding a softmax still gets its
    patterns. That skip is exact only while every pattern holds its pass's operator (a subgraph match
    needs each of the pattern's operators in the graph): checked on this executorch's patterns."""
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    class Plain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 32)

        def forward(self, x):
            return torch.nn.functional.silu(self.a(x))

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def lower(model, args, patterns):
        ep = _exported(model.eval(), *args)
        with (lowering.skip_unmatchable_patterns() if patterns == "skip" else contextlib.nullcontext([])) as decisions:
            program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
        return program.buffer, decisions

    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass

    getters = (sdpa.get_graphs, bilinear_2d.get_graphs_dict, ConvertToSDPAPass.call)
    qkv = [torch.randn(1, 2, 6, 8) for _ in range(3)]
    mask = torch.zeros(6, 6)
    plain, x = Plain(), [torch.randn(3, 16)]
    reference, _ = lower(plain, x, "all")
    program, decisions = lower(plain, x, "skip")
    assert program == reference
    assert sorted(decisions) == [("ConvertToSDPAPass", True), ("ConvertToUpsampleBilinear2d", True)]
    reference, _ = lower(Attention(), [*qkv, mask], "all")
    program, decisions = lower(Attention(), [*qkv, mask], "skip")
    assert program == reference
    assert ("ConvertToSDPAPass", False) in decisions, decisions
    assert (sdpa.get_graphs, bilinear_2d.get_graphs_dict, ConvertToSDPAPass.call) == getters
    from executorch.exir.dialects._ops import ops as exir_ops

    for patterns, anchor in ((sdpa.get_graphs(), exir_ops.edge.aten._softmax.default),
                             (bilinear_2d.get_graphs(), exir_ops.edge.aten.upsample_bilinear2d.vec)):
        assert patterns and all(lowering._holds_target(gm, anchor) for gm in patterns), anchor
