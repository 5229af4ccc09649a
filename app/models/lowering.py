"""Changes to how ExecuTorch's ``to_edge_transform_and_lower`` runs, not to what it computes
(build time; needs torch + executorch).

Profiled on the default Qwen build (py-spy, 442 s of lowering on one core): about 160 s convert the
program to the edge dialect (``run_decompositions`` five times, then the edge passes), about 215 s
are ``to_backend`` for the two XNNPACK partitioners (244 partitions), of which

- ~145 s are ``XnnpackBackend.preprocess`` of one partition after another (a deep copy of the
  partition's program, then XNNPACK's pass manager retracing it with fake tensors, then the
  flatbuffer): each partition on its own, nothing shared between them but the read-only program;
- ~62 s are ``create_submodule_from_nodes``, whose ``legalize_graph`` copies the whole top-level
  graph once per partition and, by assigning it, regenerates and ``exec``s the top-level module's
  Python code each time (35 s of the 62): code nothing runs until the partitioning is done.

``faster_lowering()`` (a context manager around the lowering call):

1. runs the preprocess of the partitions in forked worker processes (one per core, at most two on
   the build machines we target), each doing exactly what the library does for a partition (its
   ``copy_exported_program_for_preprocess``, then ``preprocess``), and hands the results back in
   partition order: the same ``PreprocessResult`` objects, pickled;
2. inside ``to_backend``'s partitioning, keeps ``legalize_graph``'s node copies but skips the
   module recompilation its graph assignment triggers, and recompiles each affected module once
   when the partitioning returns, before anything can call it;
3. skips the ``run_decompositions`` calls that have nothing to decompose (``skip_idle_decompositions``):
   of the five retraces of the whole program (one functionalization, two per partitioner, 30-40 s
   each for Qwen), four find no operator of their table in a graph that is already functional and
   would give back the same graph; likewise two of the edge dialect passes, each a retrace, when the
   graph holds none of the operators they replace (``skip_idle_edge_passes``).

(The provenance sharing of ``shared_provenance`` also runs inside it.) The program is unchanged:
the written ``.pte`` is byte-identical to one lowered without this context (checked on the default
build). Without ``fork`` or with one CPU, preprocess runs in process as before.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import weakref
from typing import Any, Iterable, Iterator

from .cpus import usable_cpus

_JOBS: list = []  # (backend class, program, compile specs) of the running preprocess, read by the workers


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)  # no OpenMP pool in a forked child; two workers already fill two cores


def _preprocess_job(i: int):
    cls, program, specs, copy_fn = _JOBS[i]
    return cls.preprocess(copy_fn(program, specs), specs)


@contextlib.contextmanager
def _parallel_preprocess() -> Iterator[None]:
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend

    workers = usable_cpus("ETSERVE_LOWER_WORKERS")
    if workers < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield
        return
    original_copy = XnnpackBackend.__dict__.get("copy_exported_program_for_preprocess")
    original_multi = XnnpackBackend.__dict__.get("preprocess_multimethod")
    copy_fn = XnnpackBackend.copy_exported_program_for_preprocess  # bound: the library's copy

    def no_copy(cls, edge_program, compile_specs):
        return edge_program  # the worker copies it, as the library would have here

    def preprocess_multimethod(cls, edge_programs: dict, compile_specs: dict) -> dict:
        global _JOBS
        keys = []
        jobs = []
        for method, programs in edge_programs.items():
            specs = compile_specs[method]
            assert len(specs) == len(programs), f"{method}: {len(programs)} partitions, {len(specs)} compile specs"
            for j, (program, spec) in enumerate(zip(programs, specs)):
                keys.append((method, j))
                jobs.append((cls, program, spec, copy_fn))
        if len(jobs) < 2:
            results = [_run_in_process(job) for job in jobs]
        else:
            _JOBS = jobs
            try:
                results = _map_in_pool(_preprocess_job, len(jobs), min(workers, len(jobs)))
            finally:
                _JOBS = []
        out: dict[str, list[Any]] = {method: [None] * len(programs) for method, programs in edge_programs.items()}
        for (method, j), result in zip(keys, results):
            out[method][j] = result
        return out

    XnnpackBackend.copy_exported_program_for_preprocess = classmethod(no_copy)
    XnnpackBackend.preprocess_multimethod = classmethod(preprocess_multimethod)
    try:
        yield
    finally:
        for name, original in (("copy_exported_program_for_preprocess", original_copy),
                               ("preprocess_multimethod", original_multi)):
            if original is None:
                delattr(XnnpackBackend, name)
            else:
                setattr(XnnpackBackend, name, original)


def _map_in_pool(fn, n: int, workers: int) -> list:
    """``[fn(i) for i in range(n)]`` in ``workers`` forked processes. The pool is closed and joined
    (the workers read the end-of-work sentinels and exit), not terminated as ``with Pool()`` does:
    terminating sends SIGTERM to workers blocked on the task queue's lock, and a build left one of
    them blocked there for good (the build's SIGTERM handler raises SystemExit, which that worker
    never ran), with the parent waiting on it in ``Pool.__exit__``."""
    pool = multiprocessing.get_context("fork").Pool(workers, initializer=_worker_init)
    try:
        results = pool.map(fn, range(n), chunksize=1)
    except BaseException:
        pool.terminate()
        raise
    pool.close()
    pool.join()
    return results


def _run_in_process(job):
    cls, program, spec, copy_fn = job
    return cls.preprocess(copy_fn(program, spec), spec)


@contextlib.contextmanager
def _deferred_recompile() -> Iterator[None]:
    from executorch.exir import lowered_backend_module as lbm
    from executorch.exir.backend import backend_api

    original_legalize = lbm.legalize_graph
    original_create = backend_api._create_partitions
    pending: dict[int, Any] = {}
    depth = [0]

    def legalize_graph(gm):
        if not depth[0]:
            return original_legalize(gm)
        gm.recompile = lambda: None  # the graph setter's recompile, for this call only
        try:
            return original_legalize(gm)
        finally:
            del gm.recompile
            pending[id(gm)] = gm

    def create_partitions(*args, **kwargs):
        depth[0] += 1
        try:
            return original_create(*args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:
                try:
                    for gm in pending.values():
                        gm.recompile()
                finally:
                    pending.clear()

    lbm.legalize_graph = legalize_graph
    backend_api._create_partitions = create_partitions
    try:
        yield
    finally:
        lbm.legalize_graph = original_legalize
        backend_api._create_partitions = original_create


_DEEPCOPY_LINE = 'copy.deepcopy(node.meta["from_node"])'


def _node_source_init(self, node, pass_name: str = "", action=None) -> None:
    """``torch.fx.traceback.NodeSource.__init__`` (torch 2.13) with the node's provenance list
    copied one level deep instead of ``copy.deepcopy``-ed: the NodeSource objects in it are shared."""
    from torch.fx.traceback import NodeSourceAction

    self.pass_name = pass_name
    if action is None:
        action = []
    elif not isinstance(action, list):
        action = [action]
    for a in action:
        if not isinstance(a, NodeSourceAction):
            raise AssertionError(f"Expected NodeSourceAction, got {type(a)}")
    self.action = action
    if node:
        self.node_info = self.NodeInfo(name=node.name, target=str(node.target), graph_id=id(node.graph))
        self.from_node = list(node.meta["from_node"]) if "from_node" in node.meta else []
    else:
        self.node_info = None
        self.from_node = []
    self._action_string = None
    self._dict = None


@contextlib.contextmanager
def shared_provenance() -> Iterator[None]:
    """Every node a pass creates records its source node's whole provenance chain
    (``meta["from_node"]``), deep-copied: the chains grow with every retrace, so the copies grow with
    them (46 s of the lowering and writing stages of a Qwen build). Nothing mutates a recorded
    NodeSource, so sharing them gives the same chains. Left as is if torch's constructor is not the
    one this replaces."""
    import inspect

    from torch.fx import traceback as fx_traceback

    cls = fx_traceback.NodeSource
    original = cls.__init__
    try:
        source = inspect.getsource(original)
    except (OSError, TypeError):
        source = ""
    if source.count(_DEEPCOPY_LINE) != 1 or "self._dict" not in source:
        yield
        return
    cls.__init__ = _node_source_init
    try:
        yield
    finally:
        cls.__init__ = original


def _decomposes_nothing(program, decomp_table) -> bool:
    """For a functional ``program``: True if ``program.run_decompositions(decomp_table)`` has nothing
    to do, i.e. the table is empty (functionalization only) or no operator of the graph (or of a
    control-flow subgraph) is a key of it, CompositeImplicitAutograd ones included, except the
    symbolic shape queries (``sym_size`` of a dynamic dimension, in the default table): retracing
    asks the tensor its size and records the same query again. (``None`` means torch's default
    table: not judged here.)"""
    if decomp_table is None:
        return False
    if not len(decomp_table):
        return True
    import torch
    from executorch.exir.graph_module import contains_any_call_fn_target_op

    shape_queries = {torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int, torch.ops.aten.sym_numel.default,
                     torch.ops.aten.sym_storage_offset.default}
    return not contains_any_call_fn_target_op(program.graph_module, set(decomp_table.keys()) - shape_queries)


@contextlib.contextmanager
def skip_idle_decompositions(functional: Iterable = ()) -> Iterator[list]:
    """``to_edge_transform_and_lower`` calls ``run_decompositions`` five times for our two XNNPACK
    partitioners: once with an empty table (functionalization), then for each partitioner once with
    the default table minus what it keeps and once more with the whole default table after it has
    renamed the operators it keeps. Each call retraces the whole program (30-40 s for Qwen at a 32k
    context). A functional program retraced with an empty table, or with a table naming no operator
    left in its graph, comes back as the same graph: inside this block such calls return the program
    itself. Functional means produced by a ``run_decompositions`` inside the block, or one of
    ``functional`` (the caller's word: e.g. what ``LLMEdgeManager._export`` returns, which ends in
    ``run_decompositions({})``). A skipped call hands back the program it was given, which the
    library then edits in place (its operator renaming; the caller's program, if the first call
    was skipped: ours is not used again). Yields the list of decisions, ``(table size, skipped)``
    per call."""
    from torch.export import ExportedProgram

    original = ExportedProgram.__dict__["run_decompositions"]
    decomposed: "weakref.WeakSet" = weakref.WeakSet(functional)
    decisions: list = []

    def run_decompositions(self, decomp_table=None, *args, **kwargs):
        size = None if decomp_table is None else len(decomp_table)
        if self in decomposed and _decomposes_nothing(self, decomp_table):
            decisions.append((size, True))
            return self
        result = original(self, decomp_table, *args, **kwargs)
        decisions.append((size, False))
        decomposed.add(result)
        return result

    ExportedProgram.run_decompositions = run_decompositions
    try:
        yield decisions
    finally:
        ExportedProgram.run_decompositions = original


def _graph_modules(gm) -> Iterator:
    from executorch.exir.graph_module import get_control_flow_submodules

    queue = [gm]
    while queue:
        current = queue.pop(0)
        yield current
        queue.extend(sub for _, sub, _ in get_control_flow_submodules(current))


def _no_transpose_t(gm) -> bool:
    import torch

    return not any(n.op == "call_function" and n.target == torch.ops.aten.t.default
                   for g in _graph_modules(gm) for n in g.graph.nodes)


def _no_view_ops(gm) -> bool:
    import torch

    return not any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target.is_view
                   for g in _graph_modules(gm) for n in g.graph.nodes)


@contextlib.contextmanager
def _calls_replaced(patches: list) -> Iterator[None]:
    """Each ``(pass class, call)``'s ``call`` replaced inside the block, the class's own (or none:
    the inherited one) back after it."""
    originals = [(cls, cls.__dict__.get("call")) for cls, _ in patches]
    for cls, call in patches:
        cls.call = call
    try:
        yield
    finally:
        for cls, original in originals:
            if original is None:
                del cls.call
            else:
                cls.call = original


@contextlib.contextmanager
def skip_idle_edge_passes() -> Iterator[list]:
    """Two of the edge dialect passes retrace the whole program to replace operators our graph no
    longer holds by then: ``NormalizeTransposePass`` (``aten.t``) and
    ``ReplaceBrokenOpsWithFunctionalOpsPass`` (view operators: ``ReplaceViewOpsWithViewCopyOpsPass``
    ran before it). Inside this block either returns the graph unchanged when it holds none."""
    from executorch.exir.pass_base import PassResult
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import (
        ReplaceBrokenOpsWithFunctionalOpsPass,
    )

    decisions: list = []
    patched = []
    for cls, idle in ((NormalizeTransposePass, _no_transpose_t), (ReplaceBrokenOpsWithFunctionalOpsPass, _no_view_ops)):
        def call(self, graph_module, _cls=cls, _idle=idle):
            if _idle(graph_module):
                decisions.append((_cls.__name__, True))
                return PassResult(graph_module, False)
            decisions.append((_cls.__name__, False))
            return super(_cls, self).call(graph_module)

        patched.append((cls, call))
    with _calls_replaced(patched):
        yield decisions


def _holds_target(gm, target) -> bool:
    return any(n.op == "call_function" and n.target == target for n in gm.graph.nodes)


@contextlib.contextmanager
def skip_unmatchable_patterns() -> Iterator[list]:
    """Two of XNNPACK's preprocess passes look for a pattern in each partition: ``ConvertToSDPAPass``
    (a decomposed attention: every one of its patterns holds ``aten._softmax``) and
    ``ConvertToUpsampleBilinear2d`` (each of its patterns is ``aten.upsample_bilinear2d.vec``).
    Their patterns are exported and lowered on first use, 2.3 s and 3.3 s once per process, and so
    once in each preprocess worker; a partition without that operator cannot match any of them.
    Inside this block such a partition's pass runs with no patterns (the pass's own recompile and
    retrace still run): the same graph, without building what it cannot use. Yields the decisions,
    ``(pass name, skipped)`` per call."""
    from executorch.backends.xnnpack._passes.convert_to_sdpa import ConvertToSDPAPass
    from executorch.backends.xnnpack._passes.convert_to_upsample_bilinear2d import ConvertToUpsampleBilinear2d
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d, sdpa
    from executorch.exir.dialects._ops import ops as exir_ops

    decisions: list = []
    patched = []
    upsample = exir_ops.edge.aten.upsample_bilinear2d.vec
    for cls, module, getter, empty, anchor in (
            (ConvertToSDPAPass, sdpa, "get_graphs", list, exir_ops.edge.aten._softmax.default),
            (ConvertToUpsampleBilinear2d, bilinear_2d, "get_graphs_dict", dict, upsample)):
        original = cls.__dict__["call"]

        def call(self, graph_module, _cls=cls, _original=original, _module=module, _getter=getter, _empty=empty,
                 _anchor=anchor):
            if _holds_target(graph_module, _anchor):
                decisions.append((_cls.__name__, False))
                return _original(self, graph_module)
            decisions.append((_cls.__name__, True))
            patterns = getattr(_module, _getter)
            setattr(_module, _getter, _empty)
            try:
                return _original(self, graph_module)
            finally:
                setattr(_module, _getter, patterns)

        patched.append((cls, call))
    with _calls_replaced(patched):
        yield decisions


@contextlib.contextmanager
def faster_lowering(functional: Iterable = ()) -> Iterator[list]:
    """While active, ``to_edge_transform_and_lower`` preprocesses XNNPACK partitions in parallel,
    recompiles the partitioned module once, shares provenance records, builds XNNPACK's pattern graphs
    only for partitions that could match them, and skips idle decompositions
    (``functional``: see ``skip_idle_decompositions``) and edge passes (``ETSERVE_LOWER_SKIP_DECOMP=0``
    runs them all).
    Yields that skipping's decisions (see the module docstring)."""
    skip = os.environ.get("ETSERVE_LOWER_SKIP_DECOMP", "1") != "0"
    with skip_unmatchable_patterns(), _parallel_preprocess(), _deferred_recompile(), shared_provenance(), \
            (skip_idle_decompositions(functional) if skip else contextlib.nullcontext([])) as decisions, \
            (skip_idle_edge_passes() if skip else contextlib.nullcontext([])):
        yield decisions
