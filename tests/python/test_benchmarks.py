"""The benchmark suite's pure-Python parts on the CPU: the ratio column and
table (on a synthetic results JSON), merging split runs, the carried
manifest/archives, the carry-group packing, and kiln_runner's new flags'
errors."""

import json
import lzma
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import results_table  # noqa: E402
import vision_bundle  # noqa: E402

RUNNER = ROOT / os.environ.get("KILN_BUILD_DIR", "build") / "tools" / "kiln_runner" / "kiln_runner"


def ok(ms, **kw):
    return {"status": "ok", "median_ms": ms, "p10_ms": ms * 0.9, "p90_ms": ms * 1.1, **kw}


def synthetic() -> dict:
    return {"meta": {"date": "2026-12-03", "commit": "abc1234 +uncommitted", "gpu": "NVIDIA H200", "driver": "580",
                     "torch": "2.11.0", "runs": 200, "warmup": 20, "peer_memory_format": "channels_last"},
            "rows": [
                {"model": "resnet50", "batch": 8, "dtype": "float16", "export_s": 30.0, "pte_bytes": 51 * 2**20,
                 "kiln": {"plain": ok(2.0, load_ms=120, memory_bytes=300 * 2**20), "graphs": ok(1.6)},
                 "peers": {"eager": ok(4.0, memory_bytes=200 * 2**20), "compile": ok(2.4, compile_s=40.0),
                           "max_autotune": {"status": "failed", "error": "BudgetExceeded: time budget exceeded"},
                           "reduce_overhead": ok(1.9, compile_s=45.0),
                           "aoti": {"status": "failed", "error": "package loader: killed by signal 11 (SIGSEGV)"}}},
                {"model": "mlp_policy", "batch": 1, "dtype": "float16",
                 "kiln": {"plain": {"status": "failed", "error": "exit 3"}},
                 "peers": {"eager": ok(0.1)}},
            ]}


def test_ratio_is_best_peer_over_faster_kiln():
    rows = synthetic()["rows"]
    assert results_table.kiln_best(rows[0]) == ("graphs", 1.6)
    assert results_table.best_peer(rows[0]) == ("reduce_overhead", 1.9)
    assert results_table.ratio(rows[0]) == pytest.approx(1.9 / 1.6)
    assert results_table.ratio(rows[1]) is None  # Kiln failed: no ratio


def test_table_and_files(tmp_path):
    js, md = results_table.write_results(synthetic(), tmp_path)
    assert js.name == "2026-12-03_abc1234.json" and md.name == "2026-12-03_abc1234.md"
    text = md.read_text()
    assert (tmp_path / "latest.md").read_text() == text
    line = next(l for l in text.splitlines() if l.startswith("| resnet50 | 8 |"))
    assert "| 2.000 | 1.600 | 4.000 | 2.400 | fail | 1.900 | - | fail | reduce-overhead | **1.19x** |" in line
    assert "NVIDIA H200" in text and "abc1234" in text
    assert "SIGSEGV" in text  # failures are listed with their reason
    data = json.loads(js.read_text())
    assert data["rows"][0]["ratio"] == pytest.approx(1.1875)
    assert data["rows"][0]["best_peer"] == "reduce_overhead"


def test_merge_split_runs(tmp_path):
    a = synthetic()
    b = {"meta": {**a["meta"], "commit": "abc1234"},
         "rows": [{"model": "resnet50", "batch": 8, "dtype": "float16", "kiln": {},
                   "peers": {"max_autotune": ok(1.5, compile_s=200.0),
                             "compile": {"status": "failed", "error": "x"}}}]}
    merged = results_table.merge([a, b])
    row = next(r for r in merged["rows"] if r["model"] == "resnet50")
    assert row["peers"]["max_autotune"]["median_ms"] == 1.5  # filled in by the second run
    assert row["peers"]["compile"]["status"] == "ok"  # a success is not replaced by a failure
    assert results_table.ratio(row) == pytest.approx(1.5 / 1.6)
    assert [r["model"] for r in merged["rows"]] == ["mlp_policy", "resnet50"]
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    assert results_table.main(["--merge", str(pa), str(pb), "--out", str(tmp_path / "out"), "--stem", "m"]) == 0
    assert (tmp_path / "out" / "m.md").exists()


def test_vision_bundle_unpacks_archives(tmp_path):
    group = tmp_path / "carry" / "vision_a"
    group.mkdir(parents=True)
    pte = tmp_path / "m_fp16_b1.pte"
    pte.write_bytes(b"PTE" * 100)
    with lzma.open(group / "m_fp16.tar.xz", "wb") as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        tar.add(pte, arcname=pte.name)
    (group / "manifest_vision.json").write_text(json.dumps(
        [{"name": "m_fp16_b1", "model": "m", "batch": 1, "dtype": "float16", "pte": pte.name,
          "archive": "m_fp16.tar.xz", "checksum": "x"}]))
    entries = vision_bundle.load_entries([tmp_path / "carry"], unpack_dir=tmp_path / "u")
    assert len(entries) == 1 and entries[0]["group"] == "vision_a"
    assert Path(entries[0]["pte_path"]).read_bytes() == pte.read_bytes()
    assert vision_bundle.load_entries([group], unpack_dir=tmp_path / "u")[0]["pte_path"] == entries[0]["pte_path"]


def test_pack_groups_splits_by_size(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import export_models

    pte_dir = tmp_path / "pte"
    pte_dir.mkdir()
    entries = []
    for model in ("a", "b"):
        for dtype in ("float16", "float32"):
            for batch in (1, 8):
                name = export_models.entry_name(model, dtype, batch)
                (pte_dir / f"{name}.pte").write_bytes(os.urandom(300_000))  # incompressible
                entries.append({"name": name, "model": model, "dtype": dtype, "batch": batch, "pte": f"{name}.pte",
                                "pte_bytes": 300_000})
    groups = export_models.pack_groups(entries, pte_dir, tmp_path / "carry", group_mib=1.0, jobs=1)
    assert [g["dtype"] for g in groups] == ["float16", "float16", "float32", "float32"]
    loaded = vision_bundle.load_entries([tmp_path / "carry"], unpack_dir=tmp_path / "u")
    assert sorted(e["name"] for e in loaded) == sorted(e["name"] for e in entries)
    for e in loaded:
        assert Path(e["pte_path"]).read_bytes() == (pte_dir / e["pte"]).read_bytes()


@pytest.mark.parametrize("flag, message", [
    ("--cuda_events=maybe", "--cuda_events must be true or false"),
    ("--timing_json=", "--timing_json needs a file path"),
])
def test_runner_rejects_bad_timing_flags(flag, message):
    if not RUNNER.exists():
        pytest.skip(f"kiln_runner not built at {RUNNER}")
    proc = subprocess.run([str(RUNNER), "--model_path=x.pte", flag], capture_output=True, text=True)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_kiln_first_then_one_peer_at_a_time_and_a_deadline_drops_the_last_peers(tmp_path, monkeypatch):
    """The run's order (the GPU parts faked): every Kiln measurement first, then
    each peer across all models in --peers order, so a deadline drops the
    last peers, not whole models."""
    import run_benchmarks as rb

    clock = [0.0]
    monkeypatch.setattr(rb.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(rb.torch.cuda, "is_available", lambda: True)
    meta = dict(synthetic()["meta"])
    monkeypatch.setattr(rb, "gpu_meta", lambda args: meta)
    models = ("mlp_policy", "resnet50")
    entries = [{"model": m, "batch": 1, "dtype": "float16", "checksum": "sum", "name": f"{m}_fp16_b1"} for m in models]
    monkeypatch.setattr(rb.vision_bundle, "load_entries", lambda *a, **k: entries)
    calls = []

    def kiln(entry, args, graphs, work):
        calls.append(("kiln", entry["model"], graphs))
        return ok(1.0)

    def peer(p, model, x, args):
        calls.append((p, model))
        clock[0] += 100.0  # each compiled peer "takes" 100 s
        return ok(2.0, compile_s=1.0)

    monkeypatch.setattr(rb, "run_kiln", kiln)
    monkeypatch.setattr(rb, "run_compiled_peer", peer)
    monkeypatch.setattr(rb, "build_peer_model", lambda m, b, a: (m, None, "sum", False))
    monkeypatch.setattr(sys, "argv", ["run_benchmarks.py", "--carry", str(tmp_path), "--models", ",".join(models),
                                      "--batches", "1", "--peers", "kiln,eager,reduce_overhead,compile",
                                      "--deadline-s", "250", "--results-dir", str(tmp_path / "r"), "--stem", "t"])
    assert rb.main() == 0
    assert calls == [("kiln", "mlp_policy", False), ("kiln", "mlp_policy", True),
                     ("kiln", "resnet50", False), ("kiln", "resnet50", True),
                     ("eager", "mlp_policy"), ("eager", "resnet50"), ("reduce_overhead", "mlp_policy")]
    rows = {r["model"]: r for r in json.loads((tmp_path / "r" / "t.json").read_text())["rows"]}
    assert rows["resnet50"]["peers"]["reduce_overhead"] == {"status": "skipped", "error": "deadline"}
    assert rows["mlp_policy"]["peers"]["compile"]["status"] == "skipped"
    assert rows["mlp_policy"]["peers"]["eager"]["status"] == "ok"


def test_benchmark_refuses_to_run_without_a_gpu(monkeypatch, capsys):
    import run_benchmarks as rb

    monkeypatch.setattr(rb.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["run_benchmarks.py"])
    assert rb.main() == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_llm_roofline_follows_the_gpu_that_ran():
    """The decode roofline is the GPU's own peak bandwidth: 4.8 TB/s on the
    H200, 3.35 on the H100 SXM; a GPU not in the table is measured against the
    H200's figure and the report says so."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import llm_bench

    assert llm_bench.peak_bandwidth("NVIDIA H200")[0] == 4.8e12
    h100, note = llm_bench.peak_bandwidth("NVIDIA H100 80GB HBM3")
    assert h100 == 3.35e12 and "H100 80GB HBM3" in note
    other, note = llm_bench.peak_bandwidth("NVIDIA L4")
    assert other == 4.8e12 and "not in the table" in note
    manifest = {"config": {"hidden": 1024, "heads": 16, "kv_heads": 8, "layers": 24}, "parameters": 410_000_000,
                "prompt_len": 512, "new_tokens": 256}
    h200_tps, per_token = llm_bench.roofline_tokens_per_s(manifest, 2)
    h100_tps, same = llm_bench.roofline_tokens_per_s(manifest, 2, h100)
    assert same == per_token and abs(h200_tps / h100_tps - 4.8 / 3.35) < 1e-9


def test_profile_buckets_put_fused_gemv_steps_under_gemm():
    """A matrix-vector step's label names its fused norm or epilogue; the
    bucket is the product's (the 410M decode profile showed them as norm and
    elementwise)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import profile_summary

    assert profile_summary.bucket_of("rms_norm+linear kernel kiln_gemv_5 grid=160x1x1") == "gemm"
    assert profile_summary.bucket_of("linear+add kernel kiln_gemv_11 grid=96x1x1") == "gemm"
    assert profile_summary.bucket_of("rms_norm kernel kiln_rms_norm_5 grid=32x1x1") == "norm"
    assert profile_summary.bucket_of("attention kernel kiln_attention_7") == "attention"


def _ncu_csv(kernels):
    """ncu --csv --page raw as it prints it: log lines, the header, a units
    row, then one row a kernel (numbers with thousands separators)."""
    cols = ["ID", "Kernel Name", "Grid Size", "Block Size", "dram__bytes_read.sum", "gpu__time_duration.sum",
            "launch__registers_per_thread"]
    out = ["==PROF== Connected to process 1", "KilnBackend: registered",
           ",".join(f'"{c}"' for c in cols), ",".join(['""', '""', '""', '""', '"byte"', '"ns"', '"register/thread"'])]
    for i, (name, ns, by) in enumerate(kernels):
        out.append(",".join(f'"{v}"' for v in [i, name, "(8, 1, 1)", "(128, 1, 1)", f"{by:,}", f"{ns:,}", 40]))
    return "\n".join(out) + "\n"


def test_ncu_summary_groups_families_takes_the_last_run_and_the_overhead(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    import random

    import ncu_summary

    rng = random.Random()
    warm = [(f"kiln_gemv_{i}", rng.randint(3000, 9000), rng.randint(10**6, 10**7)) for i in range(3)]
    run = [(f"kiln_gemv_{i}", rng.randint(3000, 9000), rng.randint(10**6, 10**7)) for i in range(4)]
    run += [("kiln_argmax_9", rng.randint(3000, 20000), 72192)]
    path = tmp_path / "decode.csv"
    path.write_text(_ncu_csv(warm + run))
    assert ncu_summary.main([str(path), "--last", str(len(run)), "--overhead-us", "2.5", "--peak-gbs", "3350"]) == 0
    text = capsys.readouterr().out
    gemv = [k for k in run if k[0].startswith("kiln_gemv")]
    us = sum(ns / 1e3 - 2.5 for _, ns, _ in gemv)
    row = next(line for line in text.splitlines() if line.startswith("| kiln_gemv |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "4" and abs(float(cells[2]) - us) < 0.06
    assert abs(float(cells[5]) - sum(b for _, _, b in gemv) / (us * 1e3)) <= 1
    assert f"over {len(run)} kernels" in text
    # Not ncu output, or more kernels asked for than there are: exit 2 naming the file.
    bad = tmp_path / "bad.csv"
    bad.write_text("latency 1 ms\n")
    assert ncu_summary.main([str(bad)]) == 2
    assert ncu_summary.main([str(path), "--last", "99"]) == 2
    assert "bad.csv" in capsys.readouterr().err


def test_llm_bench_variant_peers_and_rounds(tmp_path):
    """A persistent_decode_LABEL/ folder of the bundle is the peer kiln_persistent_LABEL (every one
    by default, its options.txt in the report); a misspelled Kiln peer is refused by name; rounds
    give each Kiln peer the median of its rounds, and rounds that generated different tokens fail
    the peer with the round and the token where they part."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import llm_bench

    manifest = {"pte": "m.pte"}
    for label in ("kv0", "counted"):
        (tmp_path / f"persistent_decode_{label}").mkdir()
    (tmp_path / "persistent_decode_kv0" / "options.txt").write_text("kv_rows=0\n")
    (tmp_path / "persistent_decode_stray.txt").write_text("not a folder")
    assert llm_bench.default_peers(tmp_path) == ["kiln", "kiln_persistent", "kiln_persistent_counted",
                                                 "kiln_persistent_kv0", "hf_eager", "compile_ro"]
    (tmp_path / "persistent_device_io").mkdir()  # device-resident I/O programs join when present
    assert llm_bench.default_peers(tmp_path)[4:] == ["kiln_persistent_device", "hf_eager", "compile_ro"]
    assert (llm_bench.kiln_program(tmp_path, manifest, "kiln_persistent_device")
            == tmp_path / "persistent_device_io" / "m.pte")
    assert llm_bench.kiln_program(tmp_path, manifest, "kiln_device") == tmp_path / "device_io" / "m.pte"
    assert llm_bench.kiln_program(tmp_path, manifest, "kiln") == tmp_path / "m.pte"
    assert llm_bench.kiln_program(tmp_path, manifest, "kiln_persistent") == tmp_path / "persistent_decode" / "m.pte"
    assert (llm_bench.kiln_program(tmp_path, manifest, "kiln_persistent_kv0")
            == tmp_path / "persistent_decode_kv0" / "m.pte")
    with pytest.raises(ValueError, match="'kiln_fast' is not a Kiln peer"):
        llm_bench.kiln_program(tmp_path, manifest, "kiln_fast")
    assert llm_bench.variant_options(tmp_path, "kiln_persistent_kv0") == "kv_rows=0"
    assert llm_bench.variant_options(tmp_path, "kiln_persistent_counted") == ""

    rng = random.Random(1203)
    tokens = [rng.randrange(32000) for _ in range(8)]
    tps = [rng.uniform(2000, 3000) for _ in range(3)]
    rounds = [{"tokens": list(tokens), "decode_tokens_per_s": t, "prefill_ms": rng.uniform(2, 3), "traffic": "x"}
              for t in tps]
    r = llm_bench.combine_rounds(rounds)
    assert r["decode_tokens_per_s"] == sorted(tps)[1]
    assert r["rounds_tokens_per_s"] == [round(t, 1) for t in tps]
    assert r["prefill_ms"] == sorted(x["prefill_ms"] for x in rounds)[1]
    assert "rounds_tokens_per_s" not in llm_bench.combine_rounds(rounds[:1])
    rounds[2]["tokens"][5] += 1
    with pytest.raises(RuntimeError, match=r"round 3 generated other tokens than round 1 \(from new token 5\)"):
        llm_bench.combine_rounds(rounds)


def test_llm_bench_refuses_unknown_peers_and_rounds_before_any_timing(tmp_path):
    """A misspelled peer or --rounds 0 stops llm_bench with the reason before it needs a GPU."""
    (tmp_path / "manifest.json").write_text(json.dumps({"pte": "m.pte", "ptd": "m.ptd"}))
    base = [sys.executable, str(ROOT / "benchmarks" / "llm_bench.py"), "--bundle", str(tmp_path), "--binary", "x",
            "--out", str(tmp_path / "out")]
    for extra, says in ((["--peers", "kiln,hf"], "unknown peer 'hf'"),
                        (["--peers", "kiln_persistent_"], "'kiln_persistent_' is not a Kiln peer"),
                        (["--rounds", "0"], "--rounds 0: at least 1")):
        proc = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
