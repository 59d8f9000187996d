"""kiln.compile(persistent_decode=True) on the CPU machine: a Llama decode step of the shape the
persistent kernel takes (hidden 1024, head_dim 64, two query heads a kv head, bf16) becomes one
decode-layers step (a persistent kernel step in an sm_90-only module, the packed weights made at
load, a sync state of its own) beside the embedding, lm_head and argmax; what it cannot take keeps
the usual plan with the reason in the export log. The step's numerics are checked on the GPU
(benchmarks/micro/decode_layers_persistent.cu runs its source; the generation example its engine)."""

import logging
import re
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "llm_generate"))
import llama_kv  # noqa: E402
from llama_kv import KVLlama, LlamaSize  # noqa: E402

import kiln  # noqa: E402
from kiln.inspect import describe, inspect_pte  # noqa: E402

pytestmark = pytest.mark.needs_compiler

# The benchmark model's layer shape, two layers, a small vocabulary.
LAYERS = 2
SHAPE = LlamaSize(hidden=1024, intermediate=4096, layers=LAYERS, heads=16, kv_heads=8, vocab=512)
MAX_LEN = 96


def decode_program(size: LlamaSize, dtype=torch.bfloat16, max_len=MAX_LEN, return_logits=False):
    llama_kv.SIZES["_persistent_test"] = size
    try:
        lm = llama_kv.build_hf("_persistent_test", seed=5, dtype=dtype)
    finally:
        del llama_kv.SIZES["_persistent_test"]
    model = KVLlama(lm, max_len, return_logits).eval()
    return torch.export.export(model, (torch.tensor([[3]]), torch.tensor([7])))


def compile_decode(program, capsys, **options):
    compiled = kiln.compile({"decode": program}, **options)
    lines = [line for line in capsys.readouterr().err.splitlines() if "persistent_decode" in line]
    return compiled, lines


@pytest.fixture(scope="module")
def bench_decode():
    return decode_program(SHAPE)


# A short cache: the attention is one kernel a layer (five steps a layer); a long one: split over
# the keys with a combine (six). Both fold, and the mask and cos/sin gathers go with them.
@pytest.mark.parametrize("max_len,per_layer", [(MAX_LEN, 5), (768, 6)])
def test_the_layers_become_one_step(max_len, per_layer, tmp_path, capsys):
    program = decode_program(SHAPE, max_len=max_len)
    compiled, lines = compile_decode(program, capsys, target_sms=[90], persistent_decode=True)
    assert lines == [f"kiln: persistent_decode: the embedding, the decode layers and the head (final norm, lm_head, "
                     f"argmax) are one persistent kernel ({per_layer * LAYERS + 7} steps -> 1)"]
    pte = tmp_path / "decode.pte"
    kiln.save(compiled, pte)
    info = inspect_pte(pte)
    engine, fallback = info["engines"]
    text = describe(info)
    titles = [line for line in text.splitlines() if line.startswith("engine ")]
    assert titles[0].startswith("engine 0 (KilnBackend in 'decode'): ")
    # The kernel takes positions in [0, max_len) only (the cache update it replaced wraps negative
    # ones): its engine refuses the rest before a launch; the fallback keeps PyTorch's range.
    positions = [line for line in text.splitlines() if line.startswith("  input 1: positions")]
    assert len(positions) == 2, positions
    assert f"indexes the persistent decode kernel's cache positions (max_len {max_len}): values in [0, {max_len})" \
        in positions[0], positions
    assert f"values in [-{max_len}, {max_len})" in positions[1], positions
    assert titles[1].startswith("engine 0 (KilnBackend in 'decode') fallback 1 (runs where the engine before it cannot")
    # The usual engine rides along as the persistent one's fallback (alternatives of one variant set),
    # on the same named weights: nothing stored twice.
    assert engine["variant"]["alternative"] == 0 and fallback["variant"]["alternative"] == 1
    assert not any(s.get("min_blocks", 0) for s in fallback["steps"]) and not fallback["derived_weights"]
    assert len(fallback["steps"]) > 4
    keys = {n["key"] for n in engine["named_weights"]}
    extra = [n for n in fallback["named_weights"] if n["key"] not in keys]  # small constants the fold drops
    total = sum(n["nbytes"] for n in fallback["named_weights"])
    assert sum(n["nbytes"] for n in extra) < total / 1000, extra
    labels = [s["label"] for s in engine["steps"]]
    assert labels == ["decode_layers"]
    step = engine["steps"][0]
    assert step["min_blocks"] > 0 and step["grid"][0] >= step["min_blocks"] and step["block"] == [288, 1, 1]
    module = engine["modules"][step["module"]]
    assert module["name"] == step["function"] and module["sms"] == [90]
    # The packed copy: every layer weight once (q|k|v, o, gate|up, down) and the two norms.
    per_layer = 1024 * (2048 + 1024 + 8192) + 4096 * 1024 + 2 * 1024
    (derived,) = engine["derived_weights"]
    assert derived["nbytes"] == 2 * LAYERS * per_layer
    assert derived["copies"] > 0 and derived["copied_bytes"] == derived["nbytes"]
    states = [t["name"] for t in engine["tensors"] if t["storage"] == "state"]
    assert len(states) == 2 * LAYERS + 1  # the caches and the sync area
    assert sum(name.endswith("/decode_layers_sync") for name in states) == 1


# The head (final norm, lm_head, argmax) folds in with the layers; the logits stay a program output
# when the program returns them (the kernel writes them). A vocabulary the head's 8-row stages do
# not divide leaves the head as its own two steps and folds the layers alone.
@pytest.mark.parametrize("case", ["logits", "odd_vocab"])
def test_the_head_folds_with_the_layers_when_it_can(case, tmp_path, capsys):
    shape = SHAPE if case == "logits" else LlamaSize(1024, 4096, LAYERS, 16, 8, vocab=500)
    program = decode_program(shape, return_logits=case == "logits")
    compiled, lines = compile_decode(program, capsys, target_sms=[90], persistent_decode=True)
    assert len(lines) == 1 and "are one persistent kernel" in lines[0], lines
    assert ("and the head" in lines[0]) == (case == "logits"), lines
    pte = tmp_path / "decode.pte"
    kiln.save(compiled, pte)
    engine = inspect_pte(pte)["engines"][0]
    labels = [s["label"] for s in engine["steps"]]
    if case == "logits":
        assert labels == ["decode_layers"]
        assert len(engine["outputs"]) == 2  # the token and the logits
    else:
        assert labels == ["decode_layers", "rms_norm+linear", "argmax"]


def test_a_prefill_says_there_is_nothing_to_fold(capsys):
    llama_kv.SIZES["_persistent_test"] = SHAPE
    try:
        lm = llama_kv.build_hf("_persistent_test", seed=5, dtype=torch.bfloat16)
    finally:
        del llama_kv.SIZES["_persistent_test"]
    prefill = torch.export.export(KVLlama(lm, MAX_LEN).eval(), (torch.tensor([[3, 4, 5, 6]]), torch.arange(4)))
    _, lines = compile_decode(prefill, capsys, target_sms=[90], persistent_decode=True)
    assert lines == ["kiln: persistent_decode: not applied: nothing to fold here: no one-token decode layer (no "
                     "q|k|v matrix-vector product carrying its layer's rotary and cache writes: a prefill method has "
                     "none, nor a layer of another form, e.g. with per-head q/k norms)"]


# The kernel computes Llama's layer and nothing else. Mistral's is the same, and so is Phi-3's once
# its split q|k|v and chunked gate|up are slices of one product (splits_to_slices), exactly as
# merge_linears makes Llama's: both fold. The others' differences (q|k|v biases, per-head q/k
# norms, Gemma's 1 + weight norms and GELU) each keep the usual plan, with the reason, and never a
# kernel that drops them.
@pytest.mark.parametrize("arch,says", [
    ("mistral", None),
    ("phi3", None),
    ("qwen2", "q|k|v is not a one-row product with a constant weight"),
    ("qwen3", "nor a layer of another form, e.g. with per-head q/k norms"),
    ("gemma", "an RMSNorm weight is not a constant of the model's dtype"),
])
def test_other_architectures_fold_only_as_llama(arch, says, capsys):
    shape = LlamaSize(hidden=1024, intermediate=4096, layers=1, heads=16, kv_heads=8, vocab=512)
    llama_kv.SIZES["_persistent_test"] = shape
    try:
        lm = llama_kv.build_hf("_persistent_test", seed=5, dtype=torch.bfloat16, arch=arch)
    finally:
        del llama_kv.SIZES["_persistent_test"]
    program = torch.export.export(KVLlama(lm, MAX_LEN).eval(), (torch.tensor([[3]]), torch.tensor([7])))
    compiled, lines = compile_decode(program, capsys, target_sms=[90], persistent_decode=True)
    assert len(lines) == 1, lines
    if says is None:
        assert "are one persistent kernel" in lines[0], lines
    else:
        assert "not applied" in lines[0] and says in lines[0], lines
    assert compiled.summary.ops_on_cpu == {}


def test_not_without_the_option(bench_decode, capsys):
    compiled, lines = compile_decode(bench_decode, capsys, target_sms=[90])
    assert lines == []


@pytest.mark.parametrize("case", ["older_sm", "hidden", "fp32"])
def test_what_it_cannot_take_keeps_the_usual_plan(case, capsys):
    if case == "older_sm":
        program, targets, says = decode_program(SHAPE), [87, 90], "every target SM to be sm_90 or newer (the oldest is sm_87)"
    elif case == "hidden":
        small = LlamaSize(hidden=512, intermediate=1024, layers=1, heads=8, kv_heads=4, vocab=256)
        program, targets, says = decode_program(small), [90], "hidden size 512 (this version takes 1024)"
    else:
        program, targets, says = decode_program(SHAPE, torch.float32), [90], "bf16 or fp16"
    compiled, lines = compile_decode(program, capsys, target_sms=targets, persistent_decode=True)
    assert len(lines) == 1 and "not applied" in lines[0] and says in lines[0], lines
    assert compiled.summary.ops_on_cpu == {}


def test_option_is_checked():
    program = decode_program(LlamaSize(64, 128, 1, 4, 2, 64), torch.float32)
    with pytest.raises(TypeError, match="persistent_decode: expected a bool"):
        kiln.compile({"decode": program}, persistent_decode="yes")
    with pytest.raises(ValueError, match="persistent_decode_options: unknown option 'kv_row'; the options are a_tasks"):
        kiln.compile({"decode": program}, persistent_decode=True, persistent_decode_options={"kv_row": 128})
    with pytest.raises(TypeError, match="persistent_decode_options: 'kv_rows' takes an int, got str '128'"):
        kiln.compile({"decode": program}, persistent_decode=True, persistent_decode_options={"kv_rows": "128"})
    with pytest.raises(ValueError, match="which needs persistent_decode=True"):
        kiln.compile({"decode": program}, persistent_decode_options={"kv_rows": 128})


# The kernel's tuning options by name reach the engine (its metadata, and the sync area that
# counted rows need); values the kernel cannot take are refused naming the option and its range.
def test_kernel_options_reach_the_engine(bench_decode, tmp_path, capsys):
    options = {"counted_rows": 1, "kv_rows": 0, "a_tasks": 10}
    compiled, lines = compile_decode(bench_decode, capsys, target_sms=[90], persistent_decode=True,
                                     persistent_decode_options=options)
    assert len(lines) == 1 and "are one persistent kernel" in lines[0], lines
    pte = tmp_path / "decode.pte"
    kiln.save(compiled, pte)
    engine, fallback = inspect_pte(pte)["engines"]
    recorded = dict(item.split("=") for item in dict(engine["metadata"])["persistent_decode_options"].split(","))
    assert {k: int(recorded[k]) for k in options} == options
    assert int(recorded["stages"]) == 13  # the others keep their defaults
    assert "persistent_decode_options" not in dict(fallback["metadata"])
    (sync,) = [t for t in engine["tensors"] if t["name"].endswith("/decode_layers_sync")]
    # counters, epoch and the fp32 rows; the head's key and the overflow flag; two sets of counted rows
    assert sync["nbytes"] == 16 + 16 * 1024 + 32 + 2 * (2 * LAYERS) * 1024 * 8
    for bad, says in [({"kv_rows": 96}, "kv_rows 96 (a stage of cached rows is 64 or 128 rows; 0: by position)"),
                      ({"stages": 20}, "stages 20 (the ring's 16 KB stages: 4 to 13)"),
                      ({"a_tasks": 7}, "a phase-A block's MLP tasks are 7 (an even number, 2 to 16)")]:
        with pytest.raises(ValueError, match=re.escape("persistent_decode: " + says)):
            kiln.compile({"decode": bench_decode}, target_sms=[90], persistent_decode=True, persistent_decode_options=bad)
