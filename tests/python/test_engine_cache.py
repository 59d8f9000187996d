"""The trial compile's engine cache (kiln._trial.EngineCache): engines kept
from the partitioner's trial until preprocess takes them, each weight held
once however many engines name it (a language model's methods share all
of theirs), the bound counting engines plus distinct weights."""

import os

from kiln._trial import CompiledEngine, EngineCache


def _weight(key: str, size: int) -> tuple:
    return (key, f"t_{key}", os.urandom(size))


def test_shared_weights_are_held_once():
    cache = EngineCache()
    w1, w2, w3 = _weight("k1", 1000), _weight("k2", 2000), _weight("k3", 500)
    cache.put("prefill", CompiledEngine(b"p" * 10, [w1, w2]))
    # decode names the same contents (keys) with bytes objects of its own
    cache.put("decode", CompiledEngine(b"d" * 20, [(w1[0], w1[1], bytes(w1[2])), (w2[0], w2[1], bytes(w2[2])), w3]))
    assert cache.nbytes == 10 + 20 + 1000 + 2000 + 500
    decode = cache.take("decode")
    assert [k for k, _n, _d in decode.weights] == ["k1", "k2", "k3"]
    assert decode.weights[0][2] is cache.get("prefill").weights[0][2], "one bytes object per key"
    assert decode.weights[0][2] == w1[2] and decode.weights[2][2] == w3[2]
    assert cache.nbytes == 10 + 1000 + 2000, "k3 no longer used by a kept engine"
    prefill = cache.take("prefill")
    assert prefill.blob == b"p" * 10 and cache.nbytes == 0 and len(cache) == 0
    assert cache.take("prefill") is None and cache.hits == 2 and cache.misses == 1


def test_the_bound_drops_the_oldest_engine_and_its_weights():
    cache = EngineCache(max_bytes=5000)
    cache.put("a", CompiledEngine(b"a", [_weight("ka", 3000)]))
    cache.put("b", CompiledEngine(b"b", [_weight("kb", 3000)]))
    assert cache.get("a") is None and cache.get("b") is not None
    assert cache.nbytes == 1 + 3000
    cache.put("b", CompiledEngine(b"other", []))  # a key already held is kept as it was
    assert cache.get("b").blob == b"b"
    cache.clear()
    assert cache.nbytes == 0 and len(cache) == 0


def test_no_bound_while_kiln_compile_lowers(monkeypatch):
    """A cache bound smaller than the model's engines does not make
    kiln.compile compile a method twice: its lowering lifts the bound (every
    engine is taken by preprocess or cleared) and puts it back."""
    import torch

    import kiln
    from kiln import _trial

    calls = []
    real = _trial.compile_graph

    def counting(built, options, progress=None, name_weights="", return_weights=False):
        calls.append(1)
        return real(built, options, progress, name_weights, return_weights)

    monkeypatch.setattr(_trial, "compile_graph", counting)
    monkeypatch.setattr(_trial.ENGINE_CACHE, "max_bytes", 1)
    torch.manual_seed(0)
    programs = {name: torch.export.export(torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU()).eval(),
                                          (torch.randn(4, 32),)) for name in ("first", "second")}
    compiled = kiln.compile(programs, target_sms=(90,), model_id="cache-bound")
    assert compiled.summary.ops_on_cpu == {}
    assert len(calls) == 2, "one trial compile per method, none again in preprocess"
    assert _trial.ENGINE_CACHE.max_bytes == 1 and len(_trial.ENGINE_CACHE) == 0
