"""The nanobind module kiln._kiln_compiler used directly."""

import threading

import pytest

import kiln

pytestmark = pytest.mark.needs_compiler


@pytest.fixture
def kc():
    return kiln._kiln_compiler


def _relu_graph(kc, dtype="float32"):
    g = kc.Graph()
    x = g.add_input("x", dtype, [4, 8])
    ids = g.add_node("aten.relu.default", "relu", [x], {}, [(dtype, [4, 8])])
    g.set_outputs(ids)
    return g


def test_supported_ops(kc):
    ops = kc.supported_ops()
    for name in ["aten.linear.default", "aten.addmm.default", "aten.mm.default",
                 "aten.add.Tensor", "aten.mul.Scalar", "aten.gelu.default", "aten.relu.default",
                 "aten.view_copy.default", "aten.permute_copy.default"]:
        assert name in ops
    assert "aten.flip.default" not in ops


def test_constant_view_ops(kc):
    # What fold_constants turns into a constant when its input is one: the
    # partitioner follows a weight through these (Mamba's squeezed conv weight).
    ops = set(kc.constant_view_ops())
    assert {"aten.view_copy.default", "aten.squeeze_copy.dims", "aten.unsqueeze_copy.default",
            "aten.permute_copy.default"} <= ops
    assert "aten.add.Tensor" not in ops and "aten.cat.default" not in ops


def test_check_support(kc):
    assert kc.check_support("aten.relu.default", [("float32", [4, 8], False)], {}, [("float32", [4, 8])]) is None
    reason = kc.check_support("aten.flip.default", [("float32", [4, 8], False)], {"dims": [1]}, [("float32", [4, 8])])
    assert "aten.flip.default" in reason
    reason = kc.check_support("aten.relu.default", [("int64", [4], False)], {}, [("int64", [4])])
    assert "int64" in reason
    # Transposes: a gather kernel for activations, folded at export for weights.
    args = ([("float32", [8, 4], False)], {"dims": [1, 0]}, [("float32", [4, 8])])
    assert kc.check_support("aten.permute_copy.default", *args) is None
    args[0][0] = ("float32", [8, 4], True)
    assert kc.check_support("aten.permute_copy.default", *args) is None
    # Casting an integer constant to float is folded; an integer activation is cast in a kernel
    # (integer tensors: src/ops/README.md), but not to an integer result Kiln cannot compute.
    assert kc.check_support("aten._to_copy.default", [("int64", [], True)], {"dtype": "float32"}, [("float32", [])]) is None
    assert kc.check_support("aten._to_copy.default", [("int64", [], False)], {"dtype": "float32"},
                            [("float32", [])]) is None
    assert "int64" in kc.check_support("aten.sqrt.default", [("float32", [4], False)], {}, [("int64", [4])])


@pytest.mark.parametrize(
    "inputs, error, message",
    [
        ([("float64", [4], False)], ValueError, "unknown dtype 'float64'"),
        ([("float32", [4])], ValueError, "expected 3 fields"),
        ([("float32", [-1], False)], ValueError, "negative dimension"),
        ([("float32", [1.5], False)], TypeError, "shape must be a list of ints"),
        (["float32"], TypeError, "tuple"),
    ],
)
def test_check_support_argument_errors(kc, inputs, error, message):
    with pytest.raises(error, match=message):
        kc.check_support("aten.relu.default", inputs, {}, [("float32", [4])])


def test_graph_building(kc):
    g = kc.Graph()
    x = g.add_input("x", "float16", [2, 3])
    w = g.add_constant("w", "float16", [3], b"\0" * 6)
    (y,) = g.add_node(
        "aten.mul.Tensor", "scale", [x, w],
        {"flag": True, "count": 3, "ratio": 0.5, "mode": "tanh", "dims": [1, 0], "scales": [1, 2.5], "empty": []},
        [("float16", [2, 3])],
    )
    g.set_outputs([y])
    assert (x, w) == (0, 1) and y == 2
    assert g.inputs == [x] and g.outputs == [y] and g.num_nodes == 1
    g.verify()
    text = g.describe()
    assert "scale" in text and "aten.mul.Tensor" in text


def test_graph_errors(kc):
    g = kc.Graph()
    with pytest.raises(TypeError, match="attribute 'bad'"):
        g.add_node("aten.relu.default", "r", [], {"bad": None}, [("float32", [1])])
    with pytest.raises(TypeError, match="attribute 'bad'"):
        g.add_node("aten.relu.default", "r", [], {"bad": [True]}, [("float32", [1])])
    with pytest.raises(ValueError, match="unknown dtype 'half'"):
        g.add_input("x", "half", [1])
    # Constant bytes that do not match the shape are refused at once.
    with pytest.raises(kiln.CompileError, match="constant 'w'"):
        g.add_constant("w", "float32", [4], b"\0" * 3)


def test_compile_progress_and_options(kc):
    messages = []
    engine = kc.compile(_relu_graph(kc), target_sms=[87], emit_ptx=False,
                        enabled_precisions=["float32"], use_cuda_graphs=1, progress=messages.append)
    assert messages and all(isinstance(m, str) for m in messages)
    info = kc.inspect_engine(engine)
    assert info["metadata"]["use_cuda_graphs"] == "true"
    assert [m["sms"] for m in info["modules"]] == [[87]]
    assert all(m["ptx_bytes"] == 0 for m in info["modules"])


def test_progress_callback_errors_propagate(kc):
    def progress(message):
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        kc.compile(_relu_graph(kc), target_sms=[90], progress=progress)


def test_compile_argument_errors(kc):
    with pytest.raises(ValueError, match="use_cuda_graphs"):
        kc.compile(_relu_graph(kc), target_sms=[90], use_cuda_graphs=2)
    with pytest.raises(ValueError, match="unknown dtype"):
        kc.compile(_relu_graph(kc), target_sms=[90], enabled_precisions=["fp8"])
    with pytest.raises(TypeError, match="progress"):
        kc.compile(_relu_graph(kc), target_sms=[90], progress=42)
    with pytest.raises(kiln.CompileError, match="SM 60"):
        kc.compile(_relu_graph(kc), target_sms=[60])


def test_compile_releases_the_gil(kc):
    """Two threads compile at once; each progress callback runs with the GIL
    re-acquired (it appends to a Python list)."""
    results, errors = [], []

    def work():
        try:
            msgs = []
            results.append((kc.compile(_relu_graph(kc), target_sms=[90], progress=msgs.append), msgs))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 2 and all(msgs for _, msgs in results)


def test_compile_can_name_its_weights(kc):
    """compile(name_weights=prefix) gives the engine externalize_weights
    gives the plain compile, without writing the weights into it first (a
    further shape variant's engine)."""
    import random

    g = kc.Graph()
    x = g.add_input("x", "float32", [2, 3])
    w = g.add_constant("w", "float32", [3], bytes(random.getrandbits(8) for _ in range(12)))
    (y,) = g.add_node("aten.mul.Tensor", "scale", [x, w], {}, [("float32", [2, 3])])
    g.set_outputs([y])
    plain = kc.compile(g, target_sms=[90], emit_ptx=False)
    moved, entries = kc.externalize_weights(plain, "kiln/t/")
    named = kc.compile(g, target_sms=[90], emit_ptx=False, name_weights="kiln/t/")
    assert named == moved and len(named) < len(plain)
    assert [key for key, *_ in entries] and all(key.startswith("kiln/t/") for key, *_ in entries)
    assert [n["key"] for n in kc.inspect_engine(named)["named_weights"]] == [key for key, *_ in entries]


def test_compile_can_return_the_weights_it_names(kc):
    """compile(name_weights=prefix, return_weights=True) gives the engine and
    the weights that externalize_weights splits from the plain compile: the
    front end's path (no second parse of an engine holding every weight)."""
    import random

    g = kc.Graph()
    x = g.add_input("x", "float32", [2, 3])
    w_bytes, b_bytes = (bytes(random.getrandbits(8) for _ in range(12)) for _ in range(2))
    w = g.add_constant("w", "float32", [3], w_bytes)
    b = g.add_constant("b", "float32", [3], b_bytes)
    (y,) = g.add_node("aten.mul.Tensor", "scale", [x, w], {}, [("float32", [2, 3])])
    (z,) = g.add_node("aten.add.Tensor", "shift", [y, b], {}, [("float32", [2, 3])])
    g.set_outputs([z])
    moved, entries = kc.externalize_weights(kc.compile(g, target_sms=[90], emit_ptx=False), "kiln/t/")
    engine, returned = kc.compile(g, target_sms=[90], emit_ptx=False, name_weights="kiln/t/", return_weights=True)
    assert engine == moved
    assert returned == entries and len(returned) == 2
    assert sorted(data for *_, data in returned) == sorted([w_bytes, b_bytes])
    assert sorted(name for _key, name, _data in returned) == ["b", "w"]
    with pytest.raises(ValueError, match="return_weights needs name_weights"):
        kc.compile(g, target_sms=[90], return_weights=True)
