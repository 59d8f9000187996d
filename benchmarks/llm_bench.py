"""Language-model generation benchmark (issue 12, item 5), run on the GPU
machine: a Llama-architecture model with random weights (examples/
llm_generate/llama_kv.py, size "bench"), batch 1, prefill of the prompt and
greedy decode of N new tokens, three ways in one run:

  kiln        examples/llm_generate's C++ loop on the exported .pte + .ptd
              (prefill and decode methods, KV cache in engine state, CUDA
              graphs), timed host to host by the example itself.
  kiln_persistent  the same loop on the bundle's persistent_decode/ program
              (kiln.compile's persistent_decode: the decode layers as one
              persistent kernel, sm_90 only), same weights; reported as
              failed with the reason when the bundle has none.
  kiln_persistent_LABEL  the program in persistent_decode_LABEL/ (the same
              model exported with other persistent_decode_options, written
              in its options.txt; scripts/prepare_llm_carry.sh
              --decode-variants): an A/B of the kernel's options in the
              benchmark's own run. By default every such folder is a peer.
  kiln_device, kiln_persistent_device  the same two programs exported with
              device-resident I/O (the bundle's device_io/ and
              persistent_device_io/; export_llama.py --device-io), run with
              llm_generate --device_io: the tokens stay on the GPU between
              steps and the host waits once a generation, as compile_ro's
              loop does. Run by default when the bundle has the folder.
  hf_eager    Hugging Face `generate` (greedy, its default dynamic cache), eager.
  compile_ro  the same static-cache forward Kiln exports (KVLlama: prefill
              once, then one decode call per token, the token fed back on the
              device without a host sync) under torch.compile
              mode="reduce-overhead" (CUDA graphs).

Figures: prefill (time to first token, ms), decode tokens/s over the new
tokens, and decode as a fraction of the memory-bandwidth roofline (weights +
the KV cache read per token, over the GPU's peak: 4.8 TB/s on the H200, 3.35
on the H100 SXM; peak_bandwidth). Medians over --runs
whole generations after --warmup ones; with --rounds R the Kiln peers run R
times in turn (A B C A B C ...) and each reports the median of its rounds,
so that a drift of the GPU's clocks falls on every program alike. A peer that
fails is reported with its reason. The .ptd is rebuilt from its seed first
(llm_weights.py unpack).

    python3 benchmarks/llm_bench.py --bundle .gpu_carry/llm_bench \\
        --binary build-gpu/examples/llm_generate/llm_generate --out $OUT --commit <sha>
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "llm_generate"))
from llama_kv import KVLlama, build_hf  # noqa: E402

# Peak memory bandwidth by GPU name (the issue's roofline is the H200's); a
# GPU not listed is measured against the H200's figure, and the report says so.
PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100 80GB HBM3": 3.35e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12}
H200_BYTES_PER_S = PEAK_BYTES_PER_S["H200"]


def peak_bandwidth(gpu_name: str) -> tuple[float, str]:
    """(bytes/s, how the figure was chosen) for the GPU named `gpu_name`."""
    for key, value in PEAK_BYTES_PER_S.items():
        if key in gpu_name:
            return value, f"{value / 1e12:.2f} TB/s, the {key}'s peak"
    return H200_BYTES_PER_S, f"4.80 TB/s, the H200's peak ({gpu_name} not in the table)"
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def roofline_tokens_per_s(manifest: dict, itemsize: int, bytes_per_s: float = H200_BYTES_PER_S) -> tuple[float, float]:
    """(tokens/s, bytes per token): every weight read once (the tied
    embedding as the LM head) plus the K and V cache up to the mean context
    of the decode steps, at `bytes_per_s`."""
    c = manifest["config"]
    hd = c["hidden"] // c["heads"]
    weights = manifest["parameters"] * itemsize
    mean_context = manifest["prompt_len"] + manifest["new_tokens"] / 2
    cache = c["layers"] * 2 * c["kv_heads"] * hd * itemsize * mean_context
    total = weights + cache
    return bytes_per_s / total, total


VARIANT_PREFIX = "kiln_persistent_"
# Device-resident I/O programs (export_llama.py --device-io) and their folders.
DEVICE_PEERS = {"kiln_device": "device_io", "kiln_persistent_device": "persistent_device_io"}


def program_folder(peer: str) -> str:
    """The bundle's folder of a Kiln peer's program ("" for the bundle itself): kiln, kiln_persistent,
    kiln_persistent_LABEL (persistent_decode_LABEL/) or a DEVICE_PEERS one."""
    if peer == "kiln":
        return ""
    if peer in DEVICE_PEERS:
        return DEVICE_PEERS[peer]
    if peer == "kiln_persistent":
        return "persistent_decode"
    if peer.startswith(VARIANT_PREFIX) and len(peer) > len(VARIANT_PREFIX):
        return "persistent_decode_" + peer[len(VARIANT_PREFIX):]
    raise ValueError(f"{peer!r} is not a Kiln peer (kiln, kiln_persistent, kiln_persistent_LABEL, "
                     f"{', '.join(DEVICE_PEERS)})")


def kiln_program(bundle: Path, manifest: dict, peer: str) -> Path:
    """The .pte a Kiln peer runs (program_folder)."""
    return bundle / program_folder(peer) / manifest["pte"]


def default_peers(bundle: Path) -> list[str]:
    """kiln, kiln_persistent, one peer per persistent_decode_LABEL/ folder, the device-I/O programs
    the bundle has (kiln_device, kiln_persistent_device), hf_eager, compile_ro."""
    variants = sorted(d.name[len("persistent_decode_"):] for d in bundle.glob("persistent_decode_*") if d.is_dir())
    device = [p for p, d in DEVICE_PEERS.items() if (bundle / d).is_dir()]
    return ["kiln", "kiln_persistent", *(VARIANT_PREFIX + v for v in variants), *device, "hf_eager", "compile_ro"]


def variant_options(bundle: Path, peer: str) -> str:
    """The persistent_decode_options a Kiln peer's program was exported with, from its folder's
    options.txt ('' if none recorded)."""
    folder = program_folder(peer)
    f = bundle / folder / "options.txt"
    return f.read_text().strip() if folder and f.exists() else ""


def combine_rounds(rounds: list[dict]) -> dict:
    """One peer's result from its rounds (run_kiln's dicts): the medians of prefill and decode, each
    round's tokens/s when there were several; RuntimeError if the rounds generated different tokens."""
    if not rounds:
        raise RuntimeError("no round ran")
    first = rounds[0]["tokens"]
    for n, r in enumerate(rounds[1:], start=2):
        if r["tokens"] != first:
            same = min(len(first), len(r["tokens"]))
            at = next((i for i, (a, b) in enumerate(zip(first, r["tokens"])) if a != b), same)
            raise RuntimeError(f"round {n} generated other tokens than round 1 (from new token {at})")
    tps = [r["decode_tokens_per_s"] for r in rounds]
    out = dict(rounds[0])
    out["decode_tokens_per_s"] = statistics.median(tps)
    out["prefill_ms"] = statistics.median(r["prefill_ms"] for r in rounds)
    if len(rounds) > 1:
        out["rounds_tokens_per_s"] = [round(t, 1) for t in tps]
    return out


def run_kiln(args, bundle: Path, manifest: dict, program: Path | None = None, device_io: bool = False) -> dict:
    program = program or bundle / manifest["pte"]
    if not program.exists():
        raise FileNotFoundError(f"{program} is not in the bundle")
    cmd = [args.binary, "--model", str(program), "--data_path", str(bundle / manifest["ptd"]),
           "--prompt_file", str(bundle / "prompt.txt"), "--new_tokens", str(manifest["new_tokens"]),
           "--warmup", str(args.warmup), "--runs", str(args.runs)] + (["--device_io"] if device_io else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"llm_generate exit {proc.returncode}: {out.strip().splitlines()[-1:]}")
    ttft = float(re.search(r"time to first token: ([\d.]+) ms", out).group(1))
    tps = float(re.search(r"decode: \d+ tokens in [\d.]+ ms: ([\d.]+) tokens/s", out).group(1))
    traffic = re.search(r"decode host<->GPU traffic: (.*)", out).group(1)
    tokens = [int(t) for t in re.search(r"^tokens:(.*)$", out, re.M).group(1).split()]
    return {"prefill_ms": ttft, "decode_tokens_per_s": tps, "traffic": traffic, "tokens": tokens}


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_hf_eager(args, lm, prompt, manifest) -> dict:
    n = manifest["new_tokens"]

    def gen(k):
        with torch.no_grad():
            return lm.generate(prompt, max_new_tokens=k, min_new_tokens=k, do_sample=False, num_beams=1,
                               pad_token_id=0, eos_token_id=None)

    for _ in range(args.warmup):
        gen(n)
    firsts, totals = [], []
    for _ in range(args.runs):
        firsts.append(timed(lambda: gen(1)))
        totals.append(timed(lambda: gen(n)))
    out = gen(n)
    first, total = statistics.median(firsts), statistics.median(totals)
    return {"prefill_ms": first * 1e3, "decode_tokens_per_s": (n - 1) / (total - first),
            "tokens": out[0, prompt.shape[1]:].tolist()}


def run_compile_ro(args, lm, prompt, manifest) -> dict:
    n, p = manifest["new_tokens"], manifest["prompt_len"]
    model = KVLlama(lm, manifest["max_len"]).eval()
    step = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    positions = torch.arange(p, device="cuda")
    decode_pos = [torch.tensor([p + i], device="cuda") for i in range(n)]

    def prefill():
        with torch.no_grad():
            return step(prompt, positions)

    def generate():
        with torch.no_grad():
            # CUDA-graph outputs are overwritten by the next replay: keep copies.
            token = prefill().clone()
            tokens = [token]
            for i in range(n - 1):
                token = step(token.view(1, 1), decode_pos[i]).clone()
                tokens.append(token)
            return torch.cat(tokens)

    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(max(args.warmup, 3)):  # compiles both shapes and records the graphs
            generate()
    compile_s = time.perf_counter() - t0
    firsts, totals = [], []
    with torch.no_grad():
        for _ in range(args.runs):
            firsts.append(timed(prefill))
            totals.append(timed(generate))
    first, total = statistics.median(firsts), statistics.median(totals)
    return {"prefill_ms": first * 1e3, "decode_tokens_per_s": (n - 1) / (total - first),
            "tokens": generate().tolist(), "compile_and_warmup_s": round(compile_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, required=True, help="manifest.json, .pte, prompt.txt, recipe/")
    parser.add_argument("--binary", required=True, help="llm_generate")
    parser.add_argument("--peers", default=None,
                        help="comma-separated; default: kiln, kiln_persistent, kiln_persistent_LABEL for each "
                             "persistent_decode_LABEL/ of the bundle, kiln_device and kiln_persistent_device when "
                             "the bundle has device_io/ or persistent_device_io/, hf_eager, compile_ro")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1,
                        help="the Kiln peers run this many times in turn; each reports its rounds' median")
    parser.add_argument("--timeout", type=int, default=300)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", default="unknown")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((args.bundle / "manifest.json").read_text())
    peers = args.peers.split(",") if args.peers else default_peers(args.bundle)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    kiln_peers = [p for p in peers if p.startswith("kiln")]
    for peer in peers:  # a misspelled peer fails here, before any timing
        try:
            if peer in kiln_peers:
                kiln_program(args.bundle, manifest, peer)
            elif peer not in ("hf_eager", "compile_ro"):
                raise ValueError(f"unknown peer {peer!r} (kiln, kiln_persistent, kiln_persistent_LABEL, "
                                 f"{', '.join(DEVICE_PEERS)}, hf_eager, compile_ro)")
        except ValueError as e:
            parser.error(str(e))
    ptd = args.bundle / manifest["ptd"]
    if not ptd.exists():
        subprocess.run([sys.executable, str(ROOT / "examples" / "llm_generate" / "llm_weights.py"), "unpack",
                        "--recipe", str(args.bundle / "recipe"), "--out", str(ptd)], check=True)
    dtype = DTYPES[manifest["dtype"]]
    itemsize = torch.tensor([], dtype=dtype).element_size()
    bandwidth, bandwidth_note = peak_bandwidth(torch.cuda.get_device_name())
    roof_tps, bytes_per_token = roofline_tokens_per_s(manifest, itemsize, bandwidth)
    prompt_ids = [int(t) for t in (args.bundle / "prompt.txt").read_text().replace(",", " ").split()]
    results = {"commit": args.commit, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
               "model": f"Llama {manifest['size']} ({manifest['parameters'] / 1e6:.0f}M parameters), "
                        f"{manifest['dtype']}, batch 1",
               "prompt_len": manifest["prompt_len"], "new_tokens": manifest["new_tokens"],
               "roofline_tokens_per_s": roof_tps, "bytes_per_token": bytes_per_token,
               "roofline_bandwidth": bandwidth_note, "peers": {}}

    def report(peer: str, r: dict) -> None:
        r["roofline_fraction"] = r["decode_tokens_per_s"] / roof_tps
        results["peers"][peer] = r
        print(f"llm_bench: {peer}: prefill {r['prefill_ms']:.2f} ms, decode {r['decode_tokens_per_s']:.1f} "
              f"tokens/s ({r['roofline_fraction']:.1%} of roofline)", flush=True)

    def failed(peer: str, e: Exception) -> None:  # a failing peer is reported, not fatal
        results["peers"][peer] = {"error": f"{type(e).__name__}: {e}"}
        print(f"llm_bench: {peer} FAILED: {type(e).__name__}: {e}", flush=True)
        traceback.print_exc()

    # The Kiln peers first, in turn for --rounds rounds (a peer that fails once is not run again).
    rounds: dict[str, list[dict]] = {p: [] for p in kiln_peers}
    for n in range(args.rounds):
        for peer in kiln_peers:
            if peer in results["peers"]:
                continue
            print(f"llm_bench: {peer} (round {n + 1} of {args.rounds}) ...", flush=True)
            try:
                rounds[peer].append(run_kiln(args, args.bundle, manifest, kiln_program(args.bundle, manifest, peer),
                                             device_io=peer in DEVICE_PEERS))
            except Exception as e:
                failed(peer, e)
    for peer, rs in rounds.items():
        if peer in results["peers"]:
            continue
        try:
            r = combine_rounds(rs)
        except RuntimeError as e:
            failed(peer, e)
            continue
        options = variant_options(args.bundle, peer)
        if options:
            r["persistent_decode_options"] = options
        report(peer, r)
    lm = prompt = None
    for peer in peers:
        if peer in kiln_peers:
            continue
        print(f"llm_bench: {peer} ...", flush=True)
        try:
            if lm is None:
                lm = build_hf(manifest["size"], manifest["seed"], dtype, arch=manifest.get("arch", "llama")).cuda()
                prompt = torch.tensor([prompt_ids], device="cuda")
            report(peer, {"hf_eager": run_hf_eager, "compile_ro": run_compile_ro}[peer](args, lm, prompt, manifest))
        except Exception as e:
            failed(peer, e)
    kiln_tokens = results["peers"].get("kiln", {}).get("tokens")
    for name, r in results["peers"].items():
        if kiln_tokens and "tokens" in r and name != "kiln":
            same = next((i for i, (a, b) in enumerate(zip(kiln_tokens, r["tokens"])) if a != b), len(kiln_tokens))
            r["tokens_equal_to_kiln"] = same
    lines = [f"# LLM generation, {results['model']}, {results['gpu']}, commit {args.commit}", "",
             f"prompt {manifest['prompt_len']} tokens, {manifest['new_tokens']} new tokens; roofline "
             f"{roof_tps:.0f} tokens/s ({bytes_per_token / 1e6:.0f} MB per token at {bandwidth_note})", "",
             "| peer | prefill ms | decode tokens/s | roofline | tokens equal to Kiln's |", "|---|---|---|---|---|"]
    for name, r in results["peers"].items():
        if "error" in r:
            lines.append(f"| {name} | failed: {r['error'][:120]} | | | |")
        else:
            rounds_note = (" (rounds " + " / ".join(f"{t:.1f}" for t in r["rounds_tokens_per_s"]) + ")"
                           if "rounds_tokens_per_s" in r else "")
            lines.append(f"| {name} | {r['prefill_ms']:.2f} | {r['decode_tokens_per_s']:.1f}{rounds_note} | "
                         f"{r['roofline_fraction']:.1%} | {r.get('tokens_equal_to_kiln', '-')} |")
    notes = [f"- {name}: persistent_decode_options {r['persistent_decode_options']}"
             for name, r in results["peers"].items() if r.get("persistent_decode_options")]
    if notes:
        lines += ["", *notes]
    (args.out / "llm_bench.md").write_text("\n".join(lines) + "\n")
    for r in results["peers"].values():
        r.pop("tokens", None)
    (args.out / "llm_bench.json").write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
