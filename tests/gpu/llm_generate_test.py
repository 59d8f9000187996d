"""GPU test of examples/llm_generate (issue 12, item 4): runs the C++
generation loop on programs exported by examples/llm_generate/export_llama.py
and compares with Hugging Face's greedy generation on the same weights
(computed at export, float32):

  float32  every new token equals HF's; the logits of every step within 1e-4
           norm-relative of the float32 reference; the same tokens again
           without CUDA graphs.
  float16  the first tokens equal HF's (at least --fp16-min-match of them) and,
           while the tokens agree, the logits stay within 1e-2 norm-relative.
In both, the decode loop must move only its token and position in and one
token (plus the logits, when exported with them) out per step: the counters
printed by llm_generate are checked against those sizes, so a copy of the KV
cache would fail the test.

    python3 tests/gpu/llm_generate_test.py --bundle .gpu_carry/llm \\
        --binary build-gpu/examples/llm_generate/llm_generate

Needs numpy (and torch + transformers when a .ptd comes as a recipe). Folders under --bundle: fp32/, fp16/ (manifest.json each);
*.xz files are unpacked first.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def unpack(folder: Path, manifest: dict) -> None:
    """Unpacks *.xz; a .ptd carried as a recipe (llm_weights.py pack) is rebuilt
    from its seed (needs torch + transformers)."""
    ptd = manifest.get("ptd")
    if ptd and not (folder / ptd).exists() and (folder / "recipe").is_dir():
        subprocess.run([sys.executable, str(ROOT / "examples" / "llm_generate" / "llm_weights.py"), "unpack",
                        "--recipe", str(folder / "recipe"), "--out", str(folder / ptd)], check=True)
    for packed in folder.glob("*.xz"):
        target = packed.with_suffix("")
        if not target.exists():
            with lzma.open(packed) as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 24):
                    dst.write(chunk)


def run(binary: str, folder: Path, manifest: dict, extra: list[str]) -> tuple[int, str]:
    cmd = [binary, "--model", str(folder / manifest["pte"])]
    if manifest.get("ptd"):
        cmd += ["--data_path", str(folder / manifest["ptd"])]
    cmd += ["--prompt_file", str(folder / "prompt.txt"), "--new_tokens", str(manifest["new_tokens"])] + extra
    if manifest.get("device_io"):  # exported with --device-io: the tokens stay on the GPU
        cmd.append("--device_io")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    print("\n".join("    " + line for line in out.strip().splitlines() if not line.startswith("I ")))
    return proc.returncode, out


def tokens_of(out: str) -> list[int]:
    m = re.search(r"^tokens:(.*)$", out, re.M)
    return [int(t) for t in m.group(1).split()] if m else []


def traffic_ok(out: str, manifest: dict, vocab: int, itemsize: int) -> tuple[bool, str]:
    m = re.search(r"decode host<->GPU traffic: (\d+) copies in \((\d+) bytes\), (\d+) copies out \((\d+) bytes\)",
                  out)
    if not m:
        return False, "no traffic line"
    steps = manifest["new_tokens"] - 1
    copies_in, bytes_in, copies_out, bytes_out = map(int, m.groups())
    want_in = steps * 16  # token + position, int64 each
    want_out = steps * (8 + (vocab * itemsize if manifest["logits"] else 0))
    if manifest.get("device_io"):  # the delegate copies nothing: the caller's buffers are on the GPU
        want_in = want_out = 0
    ok = bytes_in == want_in and bytes_out == want_out
    return ok, (f"{bytes_in} bytes in (expected {want_in}), {bytes_out} bytes out (expected {want_out}) "
                f"over {steps} decode steps")


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def check_sampling(binary: str, folder: Path, manifest: dict, greedy: list[int]) -> bool:
    """The host sampler on the program's logits (llm_generate --temperature): top_k 1 is the
    greedy choice whatever the temperature; a seed repeats its generation (--runs 2 compares
    them) and another seed draws another; --stop ends at the first stop id emitted."""
    _, top1 = run(binary, folder, manifest, ["--temperature", "1.7", "--top_k", "1", "--seed", "9"])
    ok = tokens_of(top1) == greedy
    print(f"{'PASS' if ok else 'FAIL'}  {folder.name}: sampling with top_k 1 gives the greedy tokens")
    rc_a, out_a = run(binary, folder, manifest, ["--temperature", "1.5", "--top_p", "0.95", "--seed", "1", "--runs", "2"])
    rc_b, out_b = run(binary, folder, manifest, ["--temperature", "1.5", "--top_p", "0.95", "--seed", "2"])
    a, b = tokens_of(out_a), tokens_of(out_b)
    vocab = manifest["config"]["vocab"]
    drawn = rc_a == 0 and rc_b == 0 and len(a) == len(b) == len(greedy) and a != b and \
        all(0 <= t < vocab for t in a + b)
    print(f"{'PASS' if drawn else 'FAIL'}  {folder.name}: sampled generations repeat with their seed "
          f"(exit {rc_a}) and differ across seeds ({sum(x != y for x, y in zip(a, b))} of {len(a)} tokens differ)")
    stop_id = greedy[len(greedy) // 2]
    end = greedy.index(stop_id) + 1
    _, out_s = run(binary, folder, manifest, ["--stop", str(stop_id)])
    stopped = tokens_of(out_s) == greedy[:end]
    print(f"{'PASS' if stopped else 'FAIL'}  {folder.name}: --stop {stop_id} ends the generation after "
          f"{end} tokens")
    return ok and drawn and stopped


def check(binary: str, folder: Path, fp16_min_match: int) -> bool:
    manifest = json.loads((folder / "manifest.json").read_text())
    unpack(folder, manifest)
    dtype = manifest["dtype"]
    vocab = manifest["config"]["vocab"]
    itemsize = 4 if dtype == "float32" else 2
    expected = [int(t) for t in (folder / "expected_tokens.txt").read_text().replace(",", " ").split()]
    ref_logits = np.fromfile(folder / "expected_logits.f32", dtype=np.float32).reshape(len(expected), vocab)
    logits_file = Path("/tmp") / f"llm_logits_{dtype}.f32"
    print(f"{folder.name}: {manifest['size']} {manifest.get('arch', 'llama')} ({manifest['parameters'] / 1e6:.1f}M parameters), {dtype}, "
          f"prompt {manifest['prompt_len']}, {manifest['new_tokens']} new tokens")
    rc, out = run(binary, folder, manifest, ["--logits_out", str(logits_file)])
    got = tokens_of(out)
    ok = True
    if rc not in (0, 5) or len(got) != len(expected):
        print(f"FAIL  {folder.name}: llm_generate exit {rc}, {len(got)} tokens")
        return False
    match = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), len(expected))
    logits = np.fromfile(logits_file, dtype=np.float32).reshape(-1, vocab)
    errors = [rel_err(logits[i], ref_logits[i]) for i in range(min(match + 1, len(expected)))]
    worst = max(errors)
    traffic, why = traffic_ok(out, manifest, vocab, itemsize)
    if dtype == "float32":
        ok = match == len(expected) and worst <= 1e-4
        print(f"{'PASS' if ok else 'FAIL'}  {folder.name}: {match}/{len(expected)} tokens equal HF greedy; "
              f"logits max norm-relative error {worst:.2e} (<= 1e-4)")
        rc2, out2 = run(binary, folder, manifest, ["--no_cuda_graphs"])
        same = tokens_of(out2) == got
        print(f"{'PASS' if same else 'FAIL'}  {folder.name}: the same tokens without CUDA graphs")
        ok = ok and same
        if manifest["logits"] and not manifest.get("device_io"):
            ok = check_sampling(binary, folder, manifest, got) and ok
    else:
        ok = match >= min(fp16_min_match, len(expected)) and worst <= 1e-2
        print(f"{'PASS' if ok else 'FAIL'}  {folder.name}: first {match}/{len(expected)} tokens equal HF greedy "
              f"(float32; need >= {fp16_min_match}); logits while they agree: max norm-relative error "
              f"{worst:.2e} (<= 1e-2)")
    print(f"{'PASS' if traffic else 'FAIL'}  {folder.name}: decode traffic {why}")
    return ok and traffic


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--binary", required=True)
    parser.add_argument("--fp16-min-match", type=int, default=8)
    args = parser.parse_args()
    folders = sorted(p.parent for p in args.bundle.glob("*/manifest.json"))
    if not folders:
        sys.exit(f"no */manifest.json under {args.bundle}")
    results = [check(args.binary, f, args.fp16_min_match) for f in folders]
    print(f"llm_generate: {sum(results)}/{len(results)} programs pass")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
