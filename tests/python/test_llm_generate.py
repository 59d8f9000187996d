"""examples/llm_generate on the CPU machine: the export wrapper (static KV
cache, rotary tables and mask by position, argmax) generates exactly Hugging
Face's greedy tokens; the Kiln export has two methods sharing one set of
weights and the caches as engine state, nothing on the CPU, the fused
rotary and argmax steps, and the constant methods the C++ loop reads; the
weight recipe rebuilds the .ptd byte for byte; and the C++ example checks
its inputs and says plainly that it needs a GPU. (tests/gpu/
llm_generate_test.py runs it on the GPU against HF greedy.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples" / "llm_generate"))
import export_llama  # noqa: E402
import llm_weights  # noqa: E402
from llama_kv import KVLlama, build_hf, hf_greedy, kv_greedy  # noqa: E402

from _helpers import has_gpu  # noqa: E402
from kiln.inspect import describe, inspect_pte  # noqa: E402

pytestmark = pytest.mark.needs_compiler
BINARY = ROOT / os.environ.get("KILN_BUILD_DIR", "build") / "examples" / "llm_generate" / "llm_generate"


def test_wrapper_generates_hf_greedy_tokens():
    lm = build_hf("tiny", seed=3)
    prompt = torch.randint(1, 512, (1, 7), generator=torch.Generator().manual_seed(4))
    tokens, logits = kv_greedy(KVLlama(lm, 32, return_logits=True).eval(), prompt, 12)
    assert tokens == hf_greedy(lm, prompt, 12)
    assert len(logits) == 12 and logits[0].shape == (1, 512)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("llm")
    export_llama.main(["--size", "tiny", "--prompt-len", "6", "--new-tokens", "9", "--logits", "--reference",
                       "--external-weights", "--out", str(out)])
    return out


def test_export_has_two_methods_sharing_weights_and_state(exported):
    pte = exported / "llama_tiny_float32.pte"
    info = inspect_pte(pte)
    text = describe(info)
    assert "shared with method 'decode'" in text and "shared with method 'prefill'" in text
    # Both methods' index inputs carry the values they may hold, checked before each run: token ids
    # within the vocabulary, positions within the 64-slot cache (the rotary table is as long).
    assert text.count("input 0: tokens int64 [1, ") == 2, text
    assert text.count("indexes dim 0 (size 512) of 'p_lm_lm_head_weight': values in [0, 512)") == 2, text
    assert text.count(": values in [-64, 64), checked before each run when passed from host memory") == 2, text
    assert (exported / "expected_tokens.txt").read_text().count(",") == 8
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte, data_path=exported / "llama_tiny_float32.ptd")
    assert {"prefill", "decode", "get_max_seq_len", "get_prompt_len", "get_vocab_size"} <= set(program.method_names)
    assert program.load_method("get_max_seq_len").execute([]) == [64]
    assert program.load_method("get_prompt_len").execute([]) == [6]


def test_llm_generate_refuses_token_ids_past_the_vocabulary(exported):
    """A prompt id the embedding has no row for is named before anything runs (the engines'
    index bounds refuse it too, where PyTorch raises: tests/gpu/state_test.cpp checks that)."""
    if not BINARY.exists():
        pytest.fail(f"llm_generate not built at {BINARY}; run scripts/setup.sh (or set KILN_BUILD_DIR)")
    run = subprocess.run([str(BINARY), "--model", str(exported / "llama_tiny_float32.pte"), "--data_path",
                          str(exported / "llama_tiny_float32.ptd"), "--prompt", "1,2,3,4,5,512"],
                         capture_output=True, text=True)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "prompt token 5 is 512; this model's vocabulary is 512 ids (0 to 511)" in run.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_plan_is_fused(tmp_path, dtype):
    """The decode step of a layer: norm, the q|k|v projection, then one
    launch (a launch group) for q's rotary, k's rotary computed by its cache
    update and v's cache update (run by the projection's own kernel when it
    is a matrix-vector kernel), attention, ...; argmax on the GPU. In float32 (whose rows are long enough for the
    matrix-vector kernel) each norm is the prologue of the product it feeds. In
    bfloat16 the softmax runs in float32 between casts (as HF's eager
    attention writes it), which must still fuse into one attention step
    reading the cache in place (no copy of it)."""
    import kiln

    lm = build_hf("tiny", seed=5, dtype=dtype)
    model = KVLlama(lm, 16).eval()
    example = (torch.zeros(1, 1, dtype=torch.long), torch.tensor([3]))
    compiled = kiln.compile(torch.export.export(model, example), arg_inputs=example, debug_dir=tmp_path)
    assert not compiled.summary.ops_on_cpu
    plan = next(tmp_path.glob("partition_0/*_lower.txt")).read_text()
    labels = [line.split(":")[0].split(" ", 2)[2] for line in plan.splitlines() if line.startswith("step ")]
    layers = lm.config.num_hidden_layers
    if dtype == torch.float32:
        # both norms of each layer are the prologue of the product they feed
        # (q|k|v; gate|up, merged although SiLU reads the gate twice, as
        # gate * sigmoid(gate), whose kernel also computes SiLU(gate) * up),
        # and so is the final one (lm_head); the q|k|v kernel runs the
        # rotary and cache-write launch group in its epilogue
        assert labels.count("rms_norm+linear+rotary+rotary_state_update+state_update") == layers, labels
        assert labels.count("rms_norm+linear") == 1, labels
        assert labels.count("rms_norm+linear+sigmoid+mul+mul") == layers, labels
        assert "slice_copy" not in labels
    else:
        # bfloat16 rows of 64 are too short for the matrix-vector kernel: the
        # q|k|v product is cuBLASLt's, and the launch group its own step
        assert labels.count("rotary+rotary_state_update+state_update") == layers, labels
    assert labels.count("attention") == layers
    assert labels[-1] == "argmax"
    assert not {"cat", "neg", "slice_copy", "softmax", "bmm", "permute_copy", "expand_copy"} & set(labels), labels


@pytest.mark.parametrize("shape", [
    # head_dim 128 with one kv head (multi-query), an odd vocabulary
    dict(hidden=256, intermediate=512, heads=2, kv_heads=1, vocab=1000),
    # four query heads a kv head, an intermediate size that is no multiple of 64
    dict(hidden=128, intermediate=344, heads=8, kv_heads=2, vocab=777),
    # seven query heads a kv head (Qwen2.5-0.5B's ratio), hidden 224
    dict(hidden=224, intermediate=608, heads=7, kv_heads=1, vocab=1001),
])
def test_other_llama_shapes_compile_whole(tmp_path, shape):
    """Beyond the shapes the examples use (head_dim 16 and 64, two or three query heads a kv
    head): other head sizes and grouped-query ratios compile whole, decode and a 5-token prefill
    alike, the attention one step a layer reading the cache in place, argmax on the GPU."""
    import kiln
    from llama_kv import LlamaSize
    from transformers import LlamaForCausalLM

    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    from hf_models import init_weights

    size = LlamaSize(layers=2, **shape)
    lm = init_weights(LlamaForCausalLM(size.hf_config()).eval(), 11).to(torch.bfloat16)
    model = KVLlama(lm, 32).eval()
    for t in (1, 5):
        example = (torch.randint(1, size.vocab, (1, t), generator=torch.Generator().manual_seed(t)),
                   torch.arange(3, 3 + t))
        debug = tmp_path / f"t{t}"
        compiled = kiln.compile(torch.export.export(model, example), arg_inputs=example, debug_dir=debug)
        assert not compiled.summary.ops_on_cpu, (t, compiled.summary.ops_on_cpu)
        plan = next(debug.glob("partition_0/*_lower.txt")).read_text()
        labels = [line.split(":")[0].split(" ", 2)[2] for line in plan.splitlines() if line.startswith("step ")]
        assert labels.count("attention") == size.layers, labels
        assert labels[-1] == "argmax", labels
        assert not {"cat", "slice_copy", "softmax", "bmm", "expand_copy"} & set(labels), labels


OTHER_ARCHITECTURES = ["mistral", "qwen2", "qwen3", "gemma", "phi3"]


@pytest.mark.parametrize("arch", OTHER_ARCHITECTURES)
def test_wrapper_matches_hf_for_other_architectures(arch):
    """The export wrapper reproduces each architecture it takes (Qwen2's biased q/k/v, Qwen3's
    per-head q/k norms and own head_dim, Gemma's scaled embedding and GELU, Phi-3's fused q|k|v):
    HF greedy's tokens, and HF's float32 logits along them within 1e-5."""
    lm = build_hf("tiny", seed=3, arch=arch)
    assert lm.config.model_type == arch
    assert_wrapper_matches_hf(lm, prompt_len=7, new_tokens=10, max_len=32)


def assert_wrapper_matches_hf(lm, prompt_len: int, new_tokens: int, max_len: int) -> None:
    """KVLlama's greedy tokens equal HF generate's, and its float32 logits along them HF's within
    1e-5 norm-relative."""
    prompt = torch.randint(1, lm.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(4))
    reference = hf_greedy(lm, prompt, new_tokens)
    tokens, logits = kv_greedy(KVLlama(lm, max_len, return_logits=True).eval(), prompt, new_tokens)
    assert tokens == reference
    with torch.no_grad():
        hf_logits = lm(torch.cat([prompt, torch.tensor([reference[:-1]])], dim=1)).logits[0, prompt_len - 1:]
    for step, (mine, theirs) in enumerate(zip(logits, hf_logits)):
        assert float((mine[0] - theirs).norm() / theirs.norm()) < 1e-5, step


def compiled_step_labels(model, vocab: int, t: int, debug: Path) -> list[str]:
    """kiln.compile of the wrapper for t new tokens: nothing left to the CPU; its steps' labels."""
    import kiln

    example = (torch.randint(1, vocab, (1, t), generator=torch.Generator().manual_seed(t)), torch.arange(3, 3 + t))
    compiled = kiln.compile(torch.export.export(model, example), arg_inputs=example, debug_dir=debug)
    assert not compiled.summary.ops_on_cpu, (t, compiled.summary.ops_on_cpu)
    plan = next(debug.glob("partition_0/*_lower.txt")).read_text()
    return [line.split(":")[0].split(" ", 2)[2] for line in plan.splitlines() if line.startswith("step ")]


@pytest.mark.parametrize("arch", OTHER_ARCHITECTURES)
def test_other_architectures_compile_whole(tmp_path, arch):
    """Each of them in bfloat16, decode and a 5-token prefill: nothing left to the CPU, attention
    one step a layer reading the cache in place, argmax on the GPU, and no copy of a slice or chunk
    of a merged projection (Qwen3's per-head norms read their columns in place, Phi-3's q|k|v and
    gate|up chunks are slices read where they are used)."""
    lm = build_hf("tiny", seed=11, dtype=torch.bfloat16, arch=arch)
    model = KVLlama(lm, 32).eval()
    for t in (1, 5):
        labels = compiled_step_labels(model, 512, t, tmp_path / f"t{t}")
        assert labels.count("attention") == lm.config.num_hidden_layers, labels
        assert labels[-1] == "argmax", labels
        assert not {"cat", "slice_copy", "split_with_sizes_copy", "softmax", "bmm", "expand_copy"} & set(labels), labels


def test_export_llama_takes_another_architecture(tmp_path):
    """export_llama.py --arch qwen3: the file, its manifest and HF's reference tokens."""
    export_llama.main(["--arch", "qwen3", "--size", "tiny", "--prompt-len", "5", "--new-tokens", "6", "--reference",
                       "--out", str(tmp_path)])
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["arch"] == "qwen3" and manifest["pte"] == "qwen3_tiny_float32.pte"
    assert manifest["reference"]["how"].startswith("transformers Qwen3ForCausalLM.generate")
    assert (tmp_path / "expected_tokens.txt").read_text().count(",") == 5
    assert "shared with method 'prefill'" in describe(inspect_pte(tmp_path / "qwen3_tiny_float32.pte"))


def test_wrapper_refuses_what_it_does_not_reproduce():
    from transformers import AutoModelForCausalLM, GraniteConfig, MistralConfig

    granite = AutoModelForCausalLM.from_config(GraniteConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                             num_attention_heads=4, num_key_value_heads=2,
                                                             vocab_size=512))
    with pytest.raises(ValueError, match=r"model_type 'granite'\) is not one the wrapper takes: llama, mistral"):
        KVLlama(granite, 32)
    windowed = AutoModelForCausalLM.from_config(MistralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                                              num_attention_heads=4, num_key_value_heads=2,
                                                              vocab_size=512, sliding_window=16))
    with pytest.raises(ValueError, match="a sliding window of 16 positions is shorter than the cache's 32"):
        KVLlama(windowed, 32)
    KVLlama(windowed, 16)  # a window as long as the cache changes nothing


def test_weight_recipe_rebuilds_the_ptd(exported, tmp_path):
    ptd = exported / "llama_tiny_float32.ptd"
    llm_weights.main(["pack", "--ptd", str(ptd), "--size", "tiny", "--dtype", "float32", "--out", str(tmp_path)])
    llm_weights.main(["unpack", "--recipe", str(tmp_path), "--out", str(tmp_path / "rebuilt.ptd")])
    assert (tmp_path / "rebuilt.ptd").read_bytes() == ptd.read_bytes()
    # Another seed's weights do not pass the checksum.
    import json
    recipe = json.loads((tmp_path / "recipe.json").read_text())
    recipe["seed"] += 1
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    with pytest.raises(SystemExit, match="sha256"):
        llm_weights.main(["unpack", "--recipe", str(tmp_path), "--out", str(tmp_path / "bad.ptd")])


@pytest.mark.skipif(has_gpu(), reason="a CUDA GPU is present: tests/gpu/llm_generate_test.py runs the loop")
def test_example_checks_inputs_then_needs_a_gpu(exported):
    if not BINARY.exists():
        pytest.fail(f"llm_generate not built at {BINARY}; run scripts/setup.sh (or set KILN_BUILD_DIR)")
    base = [str(BINARY), "--model", str(exported / "llama_tiny_float32.pte"),
            "--data_path", str(exported / "llama_tiny_float32.ptd")]
    short = subprocess.run(base + ["--prompt", "1,2,3"], capture_output=True, text=True)
    assert short.returncode == 2 and "prefill takes exactly 6" in short.stderr
    long = subprocess.run(base + ["--prompt_file", str(exported / "prompt.txt"), "--new_tokens", "100"],
                          capture_output=True, text=True)
    assert long.returncode == 2 and "exceed the KV cache of 64 positions" in long.stderr
    ok = subprocess.run(base + ["--prompt_file", str(exported / "prompt.txt"), "--new_tokens", "9"],
                        capture_output=True, text=True)
    assert "prompt 6 tokens, KV cache 64 positions, 9 new tokens" in ok.stdout
    assert ok.returncode == 3 and "needs an NVIDIA GPU" in ok.stderr
    usage = subprocess.run([str(BINARY), "--new_tokens", "0"], capture_output=True, text=True)
    assert usage.returncode == 2 and "--new_tokens '0' is not a count >= 1" in usage.stderr
    # --force (teacher forcing) needs a token for every decode step.
    forced = exported / "forced.txt"
    forced.write_text("5,6,7\n")
    few = subprocess.run(base + ["--prompt_file", str(exported / "prompt.txt"), "--new_tokens", "9",
                                 "--force", str(forced)], capture_output=True, text=True)
    assert few.returncode == 2 and "has 3 tokens; 9 new tokens feed 8" in few.stderr
    forced.write_text(",".join(str(t) for t in range(1, 9)) + "\n")
    enough = subprocess.run(base + ["--prompt_file", str(exported / "prompt.txt"), "--new_tokens", "9",
                                    "--force", str(forced)], capture_output=True, text=True)
    assert enough.returncode == 3 and "needs an NVIDIA GPU" in enough.stderr


def test_dynamic_prefill_lists_its_sizes_and_takes_any_prompt_length(tmp_path):
    """--prefill-max: `prefill` is one engine per size 2..16 (get_prefill_sizes);
    llm_generate accepts a prompt of a length no engine has (it runs as chunks
    on the GPU: tests/gpu/llm_generate_test.py checks the tokens there)."""
    export_llama.main(["--size", "tiny", "--prompt-len", "11", "--prefill-max", "16", "--new-tokens", "4",
                       "--out", str(tmp_path)])
    pte = tmp_path / "llama_tiny_float32.pte"
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(pte)
    assert program.load_method("get_prefill_sizes").execute([]) == [2, 4, 8, 16]
    text = describe(inspect_pte(pte))
    assert "dynamic shapes, 4 variants" in text
    if not BINARY.exists():
        pytest.fail(f"llm_generate not built at {BINARY}; run scripts/setup.sh (or set KILN_BUILD_DIR)")
    run = subprocess.run([str(BINARY), "--model", str(pte), "--prompt", "5,6,7", "--new_tokens", "4"],
                         capture_output=True, text=True)
    assert "prompt 3 tokens" in run.stdout, run.stdout + run.stderr
    assert run.returncode == (0 if has_gpu() else 3), run.stderr
    # The device-resident loop keeps fixed buffers, so it takes one prefill size only.
    chunked = subprocess.run([str(BINARY), "--model", str(pte), "--prompt", "5,6,7", "--new_tokens", "4",
                              "--device_io"], capture_output=True, text=True)
    assert chunked.returncode == 2 and "--device_io takes a program with a fixed prompt length" in chunked.stderr


def test_device_io_export_keeps_both_methods_on_the_gpu(tmp_path):
    """--device-io: both methods take and return CUDA tensors (the delegates'
    target_device), the manifest says so, and llm_generate --device_io checks
    the program before it needs the GPU (tests/gpu/llm_generate_test.py runs it
    there, expecting no host copies at all)."""
    export_llama.main(["--size", "tiny", "--prompt-len", "6", "--new-tokens", "5", "--device-io",
                       "--out", str(tmp_path)])
    pte = tmp_path / "llama_tiny_float32.pte"
    assert json.loads((tmp_path / "manifest.json").read_text())["device_io"] is True
    text = describe(inspect_pte(pte))
    assert text.count("target_device=cuda:0") == 2, text
    if not BINARY.exists():
        pytest.fail(f"llm_generate not built at {BINARY}; run scripts/setup.sh (or set KILN_BUILD_DIR)")
    run = subprocess.run([str(BINARY), "--model", str(pte), "--prompt_file", str(tmp_path / "prompt.txt"),
                          "--new_tokens", "5", "--device_io"], capture_output=True, text=True)
    assert "prompt 6 tokens" in run.stdout, run.stdout + run.stderr
    if not has_gpu():
        assert run.returncode == 3 and "needs an NVIDIA GPU" in run.stderr


@pytest.mark.skipif(has_gpu(), reason="a CUDA GPU is present: tests/gpu/llm_generate_test.py samples there")
def test_sampling_flags_are_checked_before_the_gpu(exported, tmp_path):
    """--temperature/--top_k/--top_p/--seed/--stop: a bad value is named by its flag, sampling with
    --device_io or from a program without logits is refused, all before the GPU is needed."""
    if not BINARY.exists():
        pytest.fail(f"llm_generate not built at {BINARY}; run scripts/setup.sh (or set KILN_BUILD_DIR)")
    base = [str(BINARY), "--model", str(exported / "llama_tiny_float32.pte"),
            "--data_path", str(exported / "llama_tiny_float32.ptd"), "--prompt_file", str(exported / "prompt.txt"),
            "--new_tokens", "9"]

    def run(*extra):
        return subprocess.run(base + list(extra), capture_output=True, text=True)

    ok = run("--temperature", "0.8", "--top_k", "5", "--top_p", "0.9", "--seed", "7", "--stop", "2,511")
    assert ok.returncode == 3 and "needs an NVIDIA GPU" in ok.stderr, ok.stdout + ok.stderr
    assert "sampled (temperature 0.8, top_k 5, top_p 0.9, seed 7)" in ok.stdout
    for flags, message in [(["--temperature", "-1"], "--temperature -1 (0 for greedy"),
                           (["--temperature", "warm"], "--temperature 'warm' is not a number"),
                           (["--temperature", "0.5", "--top_p", "1.5"], "--top_p 1.5 (in (0, 1]"),
                           (["--temperature", "0.5", "--top_k", "-2"], "--top_k '-2' is not a count >= 0"),
                           (["--top_k", "5"], "give a --temperature above 0 with them"),
                           (["--temperature", "0.5", "--device_io"], "drop one of them"),
                           (["--stop", "512"], "--stop token 0 is 512; this model's vocabulary is 512 ids")]:
        bad = run(*flags)
        assert bad.returncode == 2 and message in bad.stderr, (flags, bad.stderr)
    # A program that returns only its argmax token has no logits to sample.
    export_llama.main(["--size", "tiny", "--prompt-len", "6", "--new-tokens", "4", "--out", str(tmp_path)])
    bare = subprocess.run([str(BINARY), "--model", str(tmp_path / "llama_tiny_float32.pte"), "--temperature", "0.7",
                           "--prompt", "1,2,3,4,5,6", "--new_tokens", "4"], capture_output=True, text=True)
    assert bare.returncode == 2 and "returns only its argmax token (export it with export_llama.py --logits)" in \
        bare.stderr, bare.stdout + bare.stderr


def test_odd_shapes_match_hf_and_compile_whole(tmp_path):
    """Size "odd" (the GPU token test carries it as llm/odd_fp32): head_dim 128 wider than
    hidden / heads, four query heads a kv head, an intermediate size and a vocabulary that are no
    multiple of 8, an lm_head of its own and Llama 3.1's scaled rotary. The wrapper gives HF
    greedy's tokens and logits, and decode and a 5-token prefill compile whole in bfloat16."""
    lm = build_hf("odd", seed=3)
    assert lm.config.head_dim == 128 and not lm.config.tie_word_embeddings
    assert lm.config.rope_scaling["rope_type"] == "llama3"
    assert_wrapper_matches_hf(lm, prompt_len=6, new_tokens=8, max_len=80)
    model = KVLlama(build_hf("odd", seed=4, dtype=torch.bfloat16), 80).eval()
    for t in (1, 5):
        labels = compiled_step_labels(model, 1003, t, tmp_path / f"t{t}")
        assert labels.count("attention") == 3 and labels[-1] == "argmax", labels
