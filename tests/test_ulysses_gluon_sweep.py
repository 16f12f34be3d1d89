"""The Gluon kernel's methods in the Ulysses sweep (issue 14 item 6: the sweep runs every method it has).

On the CPU (Gluon does not run under Triton's interpreter): the methods are named, dropped with one line and
recorded as absent where Gluon cannot run, refused when nothing else is left, and bad inputs of the fused layer are
one clear error before any launch. On a Hopper GPU (``gpu``): a one-GPU sweep records gluon, gluon_serial and
gluon_fused beside ours, after its own checks (Gluon alone against our attention, the fused layer bit for bit
against Gluon alone + the all-to-all, outputs poisoned first), the sender-visible time inside the end-to-end one.
"""
import pytest
import torch

from xstage import data, env
from xstage import ulysses as U
from xstage import ulysses_gluon as G
from xstage import ulysses_sweep as US

on_gpu = torch.cuda.is_available() and not env.interpreted()


def test_sweep_methods_and_tiles_are_named():
    assert G.SWEEP_METHODS == ("gluon", "gluon_serial", "gluon_fused")
    assert set(G.SWEEP_METHODS) <= set(US.ALL_METHODS) and set(U.METHODS) <= set(US.ALL_METHODS)
    for D, cfg in G.SWEEP_CONFIGS.items():
        cfg.validate(D)                       # a tile the kernel runs at that head dim
        assert cfg.ws                         # the fused epilogue is the ws kernel's
        assert G.sweep_config(D) is cfg
    with pytest.raises(ValueError, match="head dim must be one of"):
        G.sweep_config(96)


def test_sweep_drops_gluon_methods_as_absent(capsys):
    if G.available()[0]:
        pytest.skip("Gluon runs here")
    kept, entry = US.gluon_methods(["fused", "gluon", "attention_only", "gluon_fused"])
    assert kept == ["fused", "attention_only"]
    assert entry["available"] is False and entry["absent"] == ["gluon", "gluon_fused"] and entry["why"]
    assert entry["configs"] == {str(D): c.label for D, c in G.SWEEP_CONFIGS.items()}
    assert "skipping gluon, gluon_fused" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="nothing to run"):
        US.gluon_methods(["gluon_serial"])


def test_sweep_takes_gluon_methods_and_refuses_unknown_ones(tmp_path):
    with pytest.raises(ValueError, match="methods must be a non-empty subset"):
        US.run_ulysses(tmp_path / "x", world_size=2, methods=["gluon", "gluon_fast"], world="one-gpu", link="host")
    if not torch.cuda.is_available():    # known methods pass validation; then the missing GPU is the one error
        with pytest.raises(RuntimeError, match="GPU"):
            US.run_ulysses(tmp_path / "y", world_size=2, methods=["gluon_fused"], world="one-gpu", link="host")
    assert not (tmp_path / "x").exists()


def test_fused_layer_refuses_bad_inputs_before_any_launch():
    from xstage.ranks import EmulatedWorld

    world = EmulatedWorld(2)
    bufs = U.ulysses_buffers(world, 256, 4, 64, torch.float16)     # (the interpreter allocates no bf16 layer)
    q = {r: torch.zeros(256, 2, 64, dtype=torch.bfloat16) for r in range(2)}
    with pytest.raises(ValueError, match="warp-specialised"):
        G.ulysses_fused(world, q, q, q, bufs, G.GluonConfig(128, 128, 8, 2))
    bad = {r: torch.zeros(255, 2, 64, dtype=torch.bfloat16) for r in range(2)}
    with pytest.raises(ValueError, match="not divisible by P"):
        G.ulysses_fused(world, bad, bad, bad, bufs)
    with pytest.raises(ValueError, match="head dim must be one of"):
        G.ulysses_fused(world, *({r: torch.zeros(256, 2, 96, dtype=torch.bfloat16) for r in range(2)},) * 3, bufs)
    if not G.available()[0]:     # valid inputs: Gluon's absence is the one error, before anything launches
        with pytest.raises(RuntimeError, match="Gluon attention needs"):
            G.ulysses_fused(world, q, q, q, bufs)


@pytest.mark.gpu
@pytest.mark.parametrize("link", ["local", "host"])
def test_one_gpu_sweep_records_gluon(tmp_path, link):
    ok, why = G.available()
    if not ok:
        pytest.skip(why)
    shapes = [U.UlyssesShape("tiny_d128_straddle", 4_200, 4, 128), U.UlyssesShape("tiny_d64", 3_000, 8, 64)]
    methods = ["fused", "attention_only", "gluon", "gluon_serial", "gluon_fused"]
    US.run_ulysses(tmp_path, world_size=2, shapes=shapes, repeats=2, warmup=1, tune=False, world="one-gpu",
                   link=link, methods=methods)
    df, meta = data.load(tmp_path, data.ULYSSES)
    assert set(df.method) == set(methods) and meta["params"]["gluon"]["available"]
    assert "gluon_failed" not in meta                   # both checks passed on both shapes
    fused = df[df.method == "gluon_fused"]
    assert len(fused) == 2 * len(shapes)
    assert (fused.sender_visible_ms > 0).all() and (fused.sender_visible_ms <= fused.end_to_end_ms).all()


def test_recorded_16_byte_epilogue_removes_the_host_link_slowdown():
    """data/h200x1/archive/ulysses_gluon_fused_host (the same script and shapes after the fused epilogue's
    stores became 16 bytes, kernels/attention_gluon.py): every method, no Gluon check failed, and the rows hold the
    finding: over PCIe the Gluon fused layer now costs 1.03-1.26x Gluon alone (was 3.2-7.9x with 2-byte stores, in
    ulysses_gluon_fused_2byte_host) and beats Gluon then the all-to-all on every shape."""
    from xstage import ulysses_analysis

    w = {}
    for sub in ("ulysses_gluon_fused_2byte_host", "ulysses_gluon_fused_host"):
        df, meta = data.load(data.machine_dir("h200x1") / "archive" / sub, data.ULYSSES)
        assert meta["params"]["link"] == "host" and "gluon_failed" not in meta
        w[sub] = ulysses_analysis.ulysses_medians(df).pivot_table(index="shape", columns="method", values="e2e_median")
    new, old = w["ulysses_gluon_fused_host"], w["ulysses_gluon_fused_2byte_host"]
    assert set(new.columns) == set(old.columns) and list(new.index) == list(old.index)
    assert (new.gluon_fused / new.gluon).between(1.0, 1.3).all()
    assert (new.gluon_fused < new.gluon_serial).all()
    assert ((old.gluon_fused / old.gluon) / (new.gluon_fused / new.gluon) > 2.5).all()


def test_recorded_16_byte_epilogue_on_the_local_link():
    """data/h200x1/archive/ulysses_gluon_fused_local (the 16-byte epilogue on the local link): every
    method, no Gluon check failed, and the rows hold the finding: on the local link the fused layer and Gluon then
    the device copy are within 2 % on every shape (the store width matters little where stores are not PCIe
    transactions), while the host link's record kept its 2.5x gain from the same change."""
    from xstage import ulysses_analysis

    df, meta = data.load(data.machine_dir("h200x1") / "archive" / "ulysses_gluon_fused_local", data.ULYSSES)
    assert meta["params"]["link"] == "local" and "gluon_failed" not in meta
    w = ulysses_analysis.ulysses_medians(df).pivot_table(index="shape", columns="method", values="e2e_median")
    assert len(w) == 5 and (w.gluon_fused / w.gluon_serial).between(0.97, 1.03).all()
