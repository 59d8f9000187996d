"""Kiln's edge conversion: ExecuTorch's ``to_edge_transform_and_lower`` with
fewer re-traces of the graph, same result.

Most of a large model's export time is not Kiln's: it is ExecuTorch turning
the ATen program into an edge program, and every step of that re-traces the
whole graph with fake tensors (swin_t: ~1-2 s a trace on the 2-core machine).
ExecuTorch 1.5.1 traces it nine times. This module does the same work in
three:

- **One decomposition.** ExecuTorch functionalizes the exported program
  (``run_decompositions({})``) and then decomposes it with the table minus
  the partitioner's kept ops; one ``run_decompositions(table)`` does both.
  Taken only when every partitioner gives no per-node check (Kiln's
  one-decomposition case, ``KilnPartitioner.single_decomposition``);
  otherwise ExecuTorch's own path runs, unchanged.
- **Fused op-replacement passes.** The edge passes that only rewrite one
  operator at a time (``call_operator`` overrides: view -> view_copy,
  transpose normalization, broken views, scalar -> tensor, SymInt -> tensor,
  mixed-type casts, ATen -> edge ops) run as one pass per run of
  consecutive such passes: a class whose MRO chains them, so each node goes
  through them in their order, exactly as one pass after another would see
  it. Passes that rewrite the graph as a whole run alone, in their place;
  that leaves two runs (before and after the in-place no-op removals).

Everything else (the pass lists and their order, the verifier, the
partitioners, the lowering) is ExecuTorch's. The result is the same program,
byte for byte (tests/python/test_edge_conversion.py compares the ``.pte`` of
both paths over several models); ``stock=True`` runs ExecuTorch's
``to_edge_transform_and_lower`` itself.

Written against ExecuTorch 1.5.1's ``exir.program._program``; the private
names it uses are imported in one place below, so a version that moves them
fails at import, loudly, and the test above catches one that changes them.
"""

from __future__ import annotations

from typing import Any

from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower
from executorch.exir.pass_base import ExportPass
from executorch.exir.passes import (
    OpReplacePass,
    base_post_op_replace_passes,
    convert_constant_dim_order_pass,
    remove_unused_parameters_pass,
)
from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
from executorch.exir.passes.remove_graph_asserts_pass import RemoveNonCoreAtenOpGraphAssertsPass
from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import (
    ReplaceBrokenOpsWithFunctionalOpsPass,
)
from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
from executorch.exir.passes.replace_sym_size_op_pass import ReplaceSymSizeOpPass
from executorch.exir.passes.scalar_to_tensor_pass import ScalarToTensorPass
from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass
from executorch.exir.program import _program as et_program
from executorch.exir.tracer import _default_decomposition_table
from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
from torch._export.passes import ReplaceViewOpsWithViewCopyOpsPass
from torch._export.passes import replace_view_ops_with_view_copy_ops_pass as torch_view_copy
from torch._ops import HigherOrderOperator
from torch.export import ExportedProgram


class ViewToViewCopyPass(ExportPass):
    """torch's ReplaceViewOpsWithViewCopyOpsPass (view ops -> their _copy
    variants, with torch's own tables), on ExecuTorch's pass base so that it
    can run fused with the per-node passes after it."""

    def call_operator(self, op, args, kwargs, meta):
        replaced = torch_view_copy._NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS.get(op)
        if replaced is None and not isinstance(op, HigherOrderOperator):
            replaced = torch_view_copy.get_view_copy_of_view_op(op._schema)
        return super().call_operator(replaced or op, args, kwargs, meta)


# Passes that only override call_operator (one node in, its replacement out,
# no state across nodes), so chaining them per node equals running them one
# after another. ScalarToTensorPass also overrides call(), only to report
# whether it changed anything.
PER_NODE_PASSES = (
    ViewToViewCopyPass,
    NormalizeTransposePass,
    ReplaceBrokenOpsWithFunctionalOpsPass,
    ScalarToTensorPass,
    SymToTensorPass,
    RemoveMixedTypeOperators,
    OpReplacePass,
)


def fuse_per_node_passes(passes: list) -> list:
    """`passes` with each run of consecutive PER_NODE_PASSES instances
    replaced by one pass that applies them in order to every node."""
    fused: list = []
    run: list = []

    def flush() -> None:
        if len(run) == 1:
            fused.append(run[0])
        elif run:
            classes = tuple(type(p) for p in run)
            name = "Fused_" + "_".join(c.__name__ for c in classes)
            # Each class's call_operator ends in super().call_operator(...),
            # which the MRO (classes in order, then ExportPass) turns into the
            # next pass's call_operator: the chain one-pass-after-another
            # would apply to this node. Nodes a pass inserts (self.call_operator)
            # go through the whole chain; the earlier passes leave them as
            # they are (tests/python/test_edge_conversion.py).
            fused.append(type(name, classes, {})())
        run.clear()

    for p in passes:
        # ExecuTorch's pass lists hold pass-manager wrappers (functools.wraps
        # around the pass object)
        unwrapped = getattr(p, "__wrapped__", p)
        if type(unwrapped) in PER_NODE_PASSES:
            run.append(unwrapped)
        else:
            flush()
            fused.append(p)
    flush()
    return fused


def generate_edge_program(config: EdgeCompileConfig, program: ExportedProgram,
                          preserve_ops: list) -> ExportedProgram:
    """ExecuTorch's ``_generate_edge_program`` with the per-node passes fused."""
    program = remove_unused_parameters_pass(program)
    pre_op_replace_passes, post_op_replace_passes = et_program._get_aten_to_edge_passes(config)
    passes = [RemoveNonCoreAtenOpGraphAssertsPass()]
    pre = list(pre_op_replace_passes)
    # torch's view -> view_copy pass runs first in ExecuTorch, then the
    # SymInt-size op fix (in place, which only retargets aten.sym_size/
    # sym_stride/sym_numel packets, no view op), then the per-node passes.
    # Run the fix first and the view pass, as ViewToViewCopyPass, fused with
    # the per-node passes: the same rewrites in the same order per node.
    if pre and isinstance(getattr(pre[0], "__wrapped__", pre[0]), ReplaceSymSizeOpPass):
        passes += [pre.pop(0), ViewToViewCopyPass()]
    else:
        passes.append(ReplaceViewOpsWithViewCopyOpsPass())
    passes.extend(pre)
    passes.append(OpReplacePass())
    if not config._skip_dim_order:
        passes.append(et_program.MemoryFormatOpsPass())
    graph_module = program.graph_module
    for p in fuse_per_node_passes(passes):
        result = p(graph_module)
        assert result is not None
        graph_module = result.graph_module
    edge_program = ExportedProgram(
        root=graph_module,
        graph=graph_module.graph,
        graph_signature=et_program._get_updated_graph_signature(program.graph_signature, graph_module),
        state_dict=program.state_dict,
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        example_inputs=program.example_inputs,
        constants=program.constants,
        verifiers=[EXIREdgeDialectVerifier(edge_compile_config=config, class_only=True, preserve_ops=preserve_ops)],
    )
    edge_program = et_program.lift_constant_tensor_pass(edge_program)
    edge_program = convert_constant_dim_order_pass.convert_constant_dim_order_pass(edge_program)
    assert list(post_op_replace_passes) == list(base_post_op_replace_passes)
    return et_program._transform(edge_program, *post_op_replace_passes)


def _kept_ops(programs: dict[str, ExportedProgram], partitioners: dict[str, list]
              ) -> tuple[dict[str, ExportedProgram], dict[str, list]] | None:
    """Each method's program after its partitioners' pre-decomposition
    transforms, and the ops it keeps whole; None when some method has no
    partitioner or one needs ExecuTorch's per-node check (then only
    ExecuTorch's path is exact)."""
    transformed: dict[str, ExportedProgram] = {}
    kept: dict[str, list] = {}
    for name, program in programs.items():
        if not partitioners.get(name):
            return None
        for partitioner in partitioners[name]:
            program = partitioner.transform_for_pre_decomposition(program)
        ops: list = []
        for partitioner in partitioners[name]:
            curr, check = partitioner.ops_to_not_decompose(program)
            if check is not None:
                return None
            ops.extend(curr)
        transformed[name], kept[name] = program, ops
    return transformed, kept


def lower(programs: ExportedProgram | dict[str, ExportedProgram], partitioner: Any,
          compile_config: EdgeCompileConfig, transform_passes: Any = None,
          constant_methods: dict | None = None, stock: bool = False) -> EdgeProgramManager:
    """``to_edge_transform_and_lower`` (same arguments, same result), with the
    re-traces above saved when it can be exactly."""
    single = not isinstance(programs, dict)
    aten_programs = {"forward": programs} if single else dict(programs)
    partitioners = ({name: partitioner for name in aten_programs} if not isinstance(partitioner, dict)
                    else partitioner)
    found = None if stock else _kept_ops(aten_programs, partitioners)
    if found is None:
        return to_edge_transform_and_lower(
            programs, partitioner=partitioner, compile_config=compile_config,
            transform_passes=transform_passes, constant_methods=constant_methods)

    config = compile_config
    aten_programs, kept = found
    edge_programs: dict[str, ExportedProgram] = {}
    for name, program in aten_programs.items():
        table = _default_decomposition_table()
        preserved = [op for op in kept[name] if table.pop(op, None) is not None]
        kept[name] = preserved
        # functionalization and decomposition in one trace
        program = program.run_decompositions(table)
        edge_programs[name] = generate_edge_program(config, program, preserved)
    all_kept = list(set().union(*kept.values()))
    config._core_aten_ops_exception_list = list(set(config._core_aten_ops_exception_list) | set(all_kept))
    manager = EdgeProgramManager(edge_programs, constant_methods, config, all_kept)

    # From here on as to_edge_transform_and_lower does.
    if transform_passes is not None:
        manager = manager.transform(transform_passes)
        for method in manager.methods:
            et_program.lift_constant_tensor_pass(manager.exported_program(method))
    for i in range(max(len(p) for p in partitioners.values())):
        manager = manager.to_backend({name: p[i] for name, p in partitioners.items() if i < len(p)})
    for name, program in manager._edge_programs.items():
        ops: set = set()
        for p in partitioners.get(name, []):
            curr, check = p.ops_to_not_decompose(program)
            if check is not None:
                curr = et_program._remove_invalid_ops_for_not_decompose(curr)
            ops |= set(curr)
            et_program._sanity_check_graph_for_non_decomp_ops(
                name, program, ops, check, partitioner_name=p.__class__.__name__, generate_error=True)
        if config._check_ir_validity:
            EXIREdgeDialectVerifier(edge_compile_config=config, class_only=True,
                                    preserve_ops=config.preserve_ops + list(ops))()(program.graph_module)
    return manager
