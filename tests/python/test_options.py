"""Argument validation of kiln.compile / kiln.executorch.export / kiln.save.
Validation happens before any lowering, so these need no compiler."""

import pytest
import torch

import kiln
from kiln import _options as kiln_options
from kiln._options import KilnOptions, validate_options

from _helpers import MLP


def test_not_an_exported_program():
    with pytest.raises(TypeError, match=r"got .*MLP.*torch\.export\.export"):
        kiln.compile(MLP())
    with pytest.raises(TypeError, match="kiln.executorch.export: expected a torch.export.ExportedProgram"):
        kiln.executorch.export("model.pt")


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(enabled_precisions={torch.float64}), ValueError, "enabled_precisions: torch.float64"),
        (dict(enabled_precisions={torch.int8}), ValueError, "enabled_precisions"),
        (dict(enabled_precisions=set()), ValueError, "enabled_precisions: must name"),
        (dict(enabled_precisions={"float8"}), ValueError, "enabled_precisions: 'float8'"),
        (dict(enabled_precisions={1}), TypeError, "enabled_precisions"),
        (dict(enabled_precisions=42), TypeError, "enabled_precisions"),
        (dict(min_block_size=0), ValueError, "min_block_size: must be >= 1, got 0"),
        (dict(min_block_size=2.0), TypeError, "min_block_size"),
        (dict(min_block_size=True), TypeError, "min_block_size"),
        (dict(target_sms=(69, 90)), ValueError, "target_sms: SM 69"),
        (dict(target_sms=(60,)), ValueError, "target_sms: SM 60"),
        (dict(target_sms=(8.7,)), TypeError, "target_sms: each SM must be an int"),
        (dict(target_sms=("sm_90",)), TypeError, "target_sms"),
        (dict(target_sms=(True,)), TypeError, "target_sms"),
        (dict(target_sms="90"), TypeError, "target_sms"),
        (dict(target_sms=()), ValueError, "target_sms: must name"),
        (dict(target_sms=(900,)), ValueError, "target_sms"),
        (dict(use_cuda_graphs=1), TypeError, "use_cuda_graphs"),
        (dict(use_cuda_graphs="yes"), TypeError, "use_cuda_graphs"),
    ],
)
def test_bad_options(mlp_program, kwargs, error, message):
    with pytest.raises(error, match=message):
        kiln.compile(mlp_program, **kwargs)
    with pytest.raises(error, match=message):
        kiln.executorch.export(mlp_program, **kwargs)


@pytest.mark.parametrize(
    "arg_inputs, error, message",
    [
        ([torch.randn(8, 64), torch.randn(8, 64)], ValueError, r"takes 1 input\(s\) \(x\), got 2"),
        ((torch.randn(8, 64).half(),), ValueError, r"arg_inputs\[0\] \('x'\): dtype torch.float16"),
        ((torch.randn(4, 64),), ValueError, r"arg_inputs\[0\] \('x'\): shape \[4, 64\]"),
        ((3.0,), TypeError, r"arg_inputs\[0\] \('x'\): expected a torch.Tensor"),
        (torch.randn(8, 64), TypeError, "arg_inputs: expected a tuple or list"),
    ],
)
def test_bad_arg_inputs(mlp_program, arg_inputs, error, message):
    with pytest.raises(error, match=message):
        kiln.compile(mlp_program, arg_inputs=arg_inputs)


def test_default_target_sms_cover_every_sm_cuda13_builds_from_ampere_on():
    options = validate_options()
    assert options.target_sms == kiln_options.DEFAULT_TARGET_SMS == (80, 86, 87, 89, 90, 100, 110, 120)
    assert options.emit_ptx
    specs = {s.key: s.value for s in options.to_compile_specs()}
    assert specs["target_sms"] == b"80,86,87,89,90,100,110,120"
    assert kiln_options.KilnOptions.from_compile_specs(options.to_compile_specs()).target_sms == options.target_sms


def test_default_targets_get_one_cubin_per_major_and_explicit_lists_are_exact():
    # An sm_80 cubin runs on sm_86/87/89 (same major, newer minor): the default
    # targets build 5 cubins, not 8; every target SM is still covered.
    options = validate_options()
    assert options.cubin_sms == kiln_options.DEFAULT_CUBIN_SMS == (80, 90, 100, 110, 120)
    specs = {s.key: s.value for s in options.to_compile_specs()}
    assert specs["cubin_sms"] == b"80,90,100,110,120"
    assert kiln_options.KilnOptions.from_compile_specs(options.to_compile_specs()) == options
    assert kiln_options.KilnOptions() == options  # a KilnPartitioner's default options agree
    # Named by hand (even the default list itself): a cubin for each, no cubin_sms spec.
    for sms in ([80, 86, 87, 89, 90, 100, 110, 120], [86, 89], [90]):
        explicit = validate_options(target_sms=sms)
        assert explicit.cubin_sms == ()
        assert "cubin_sms" not in {s.key for s in explicit.to_compile_specs()}
        assert kiln_options.KilnOptions.from_compile_specs(explicit.to_compile_specs()) == explicit
    assert kiln_options.one_cubin_per_major([89, 86, 120, 121, 90]) == (86, 90, 120)
    with pytest.raises(ValueError, match="cubin_sms"):
        validate_options(target_sms=[86, 89], cubin_sms=[89])  # sm_86 would have no cubin


def test_options_normalize_and_round_trip_through_compile_specs():
    options = validate_options(
        enabled_precisions=[torch.float16, "float32", torch.float16],
        min_block_size=3,
        target_sms=[90, 87, 90],
        use_cuda_graphs=False,
    )
    assert options.enabled_precisions == ("float32", "float16")
    assert options.target_sms == (87, 90)
    assert options.use_cuda_graphs == 0
    specs = {s.key: s.value for s in options.to_compile_specs()}
    assert specs["enabled_precisions"] == b"float32,float16"
    assert specs["target_sms"] == b"87,90"
    assert specs["use_cuda_graphs"] == b"0"
    assert specs["min_block_size"] == b"3"
    assert KilnOptions.from_compile_specs(options.to_compile_specs()) == options


def test_persistent_decode_options_round_trip_through_compile_specs():
    options = validate_options(target_sms=[90], persistent_decode=True,
                               persistent_decode_options={"kv_rows": 0, "counted_rows": 2})
    assert options.persistent_decode_options == (("counted_rows", 2), ("kv_rows", 0))
    specs = {s.key: s.value for s in options.to_compile_specs()}
    assert specs["persistent_decode_options"] == b"counted_rows=2,kv_rows=0"
    assert KilnOptions.from_compile_specs(options.to_compile_specs()) == options
    plain = validate_options(target_sms=[90], persistent_decode=True)
    assert "persistent_decode_options" not in {s.key for s in plain.to_compile_specs()}
    assert KilnOptions.from_compile_specs(plain.to_compile_specs()) == plain


def test_persistent_decode_options_text_is_parsed_with_clear_errors():
    assert kiln_options.parse_persistent_decode_options("counted_rows=1, kv_rows=-0") == {"counted_rows": 1, "kv_rows": 0}
    assert kiln_options.parse_persistent_decode_options("") == {}
    for bad in ("kv_rows", "kv_rows=x", "=3", "kv_rows=1,a_tasks=2.5"):
        with pytest.raises(ValueError, match="persistent_decode_options: expected name=int"):
            kiln_options.parse_persistent_decode_options(bad)
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    with pytest.raises(ValueError, match="expected name=int,... got 'kv_rows'"):
        KilnOptions.from_compile_specs([CompileSpec("persistent_decode", b"1"),
                                        CompileSpec("persistent_decode_options", b"kv_rows")])


def test_persistent_decode_option_names_match_the_compiler():
    # The Python list refuses unknown names before a compile starts; the compiler's list is the one
    # that sets them: they must name the same options.
    from kiln._native import native

    assert tuple(sorted(native().persistent_decode_option_names())) == kiln_options.PERSISTENT_DECODE_OPTIONS


def test_default_options():
    options = validate_options()
    assert options == KilnOptions()
    assert {s.key: s.value for s in options.to_compile_specs()}["use_cuda_graphs"] == b"-1"


def test_unknown_compile_spec_key():
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    with pytest.raises(ValueError, match="unknown compile spec key 'precision'"):
        KilnOptions.from_compile_specs([CompileSpec("precision", b"fp16")])


def test_save_rejects_non_compiled(tmp_path):
    with pytest.raises(TypeError, match="kiln.CompiledProgram"):
        kiln.save(object(), tmp_path / "x.pte")


def test_public_api():
    assert set(kiln.__all__) >= {
        "compile", "save", "CompiledProgram", "KilnPartitioner", "CompileError",
        "tensor_file", "executorch", "__version__",
    }
    assert issubclass(kiln.CompileError, RuntimeError)
    assert callable(kiln.executorch.export)
    assert isinstance(kiln.__version__, str)
