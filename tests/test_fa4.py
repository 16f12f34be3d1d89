"""FA4 on a machine without it (CPU, CI): ``xstage.fa4.available()`` is one clear line, the Ulysses sweep drops
the FA methods and records them as absent (never as 0), the extra ``fa4`` pins what ``xstage.fa4`` names and
``make test`` never installs it; the fused kernel's peer table routes every row of every rank's attention output
to where the all-to-all puts it (checked by replaying the epilogue's address arithmetic on random layers)."""
import random
import re
import sys
from pathlib import Path

import pytest
import torch

from xstage import fa4
from xstage import ulysses as U
from xstage import ulysses_sweep as US

ROOT = Path(__file__).resolve().parent.parent


def test_available_is_one_line_here():
    ok, why = fa4.available()
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: tests/test_fa4_gpu.py covers it")
    assert ok is False and why and "\n" not in why


def test_sweep_drops_fa_methods_as_absent(capsys):
    if fa4.available()[0]:
        pytest.skip("FA4 runs here")
    kept, entry = US.fa4_methods(["fused", "fa", "attention_only", "fa_fused"])
    assert kept == ["fused", "attention_only"]
    assert entry["available"] is False and entry["absent"] == ["fa", "fa_fused"] and entry["why"]
    assert "skipping fa, fa_fused" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="nothing to run"):
        US.fa4_methods(["fa_serial"])


def test_sweep_refuses_unknown_method_before_anything(tmp_path):
    with pytest.raises(ValueError, match="methods must be a non-empty subset"):
        US.run_ulysses(tmp_path / "x", world_size=2, methods=["fa", "flash"], world="one-gpu", link="host")
    assert not (tmp_path / "x").exists()


def _replay_epilogue(table: list[int], outs: list[torch.Tensor], o: torch.Tensor, S: int) -> None:
    """What UlyssesFusedSm90.epilogue stores, in Python: row s of local head h -> owner j = s // Sl at element
    (s - j * Sl) * table[1] + table[2] + h * D + col of out[j] (table[3 + j] names out[j]; here: its index)."""
    Sl, row_elems, col0 = table[:3]
    _, Hl, D = o.shape
    flat = [x.view(-1) for x in outs]
    for s in range(S):
        j = s // Sl
        base = (s - j * Sl) * row_elems + col0
        for h in range(Hl):
            flat[table[fa4.TABLE_HEADER + j]][base + h * D: base + (h + 1) * D] = o[s, h]


@pytest.mark.parametrize("trial", range(3))
def test_peer_table_routes_rows_like_the_all_to_all(trial):
    rng = random.Random()
    P = rng.choice([2, 3, 4])
    Hl, D = rng.choice([1, 2, 3]), rng.choice([64, 128])
    S = P * rng.randrange(5, 60)
    H = Hl * P
    os_ = [torch.randn(S, Hl, D) for _ in range(P)]
    outs = [torch.full((S // P, H, D), float("nan")) for _ in range(P)]
    for r in range(P):
        table = fa4.peer_table_values(S, H, D, P, r, [16 * j for j in range(P)])
        table = table[:fa4.TABLE_HEADER] + list(range(P))          # addresses -> buffer indices for the replay
        _replay_epilogue(table, outs, os_[r], S)
    want = U.post_all_to_all(os_)
    for r in range(P):
        assert torch.equal(outs[r], want[r]), f"rank {r}"


def test_peer_table_refuses_bad_tables():
    with pytest.raises(ValueError, match="2 peer addresses for 3 ranks"):
        fa4.peer_table_values(12, 6, 64, 3, 0, [0, 16])
    with pytest.raises(ValueError, match="16-byte aligned"):
        fa4.peer_table_values(12, 6, 64, 2, 0, [0, 8])
    with pytest.raises(ValueError, match="must divide"):
        fa4.peer_table_values(13, 6, 64, 2, 0, [0, 16])


def test_extra_pins_what_the_module_names_and_ci_skips_it():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["fa4"]
    assert sorted(extra) == sorted(fa4.PACKAGES)
    assert all(re.search(r"==\d", e) for e in extra), "the fa4 extra pins exact versions"
    make = (ROOT / "Makefile").read_text()
    assert "fa4" not in make, "make test / CI must not install the extra fa4 (CPU-only)"


def test_fused_outputs_are_destination_buffers():
    """The fused layer's outputs are what peers store into: ``destination=True``, so that OneGPUWorld(link="host")
    puts the peers' outputs in pinned host memory (a world that records what it was asked for)."""
    from xstage.ranks import EmulatedWorld

    asked = []

    class Recording(EmulatedWorld):
        def symmetric_empty(self, numel, dtype, destination=False):
            asked.append((numel, dtype, destination))
            return super().symmetric_empty(numel, dtype, destination)

    P, S, H, D = 2, 256, 4, 64
    U.ulysses_buffers(Recording(P), S, H, D, torch.float16)
    outs = [a for a in asked if a[0] == S // P * H * D]
    assert outs and all(dest for _, _, dest in outs)


def _synthetic_record(rng):
    """Rows of the ulysses schema for two shapes and every method (random times): what the table must reduce."""
    import pandas as pd

    rows = []
    methods = ["fused", "serial_triton", "attention_only", "sdpa_only", "fa", "fa_serial", "fa_fused"]
    for name, S, H, D in (("seq_8k", 8192, 24, 128), ("cogvideox5b_17776", 17_776, 48, 64)):
        for m in methods:
            for i in range(5):
                e2e = rng.uniform(1, 10)
                sv = e2e * rng.uniform(0.5, 1.0) if m in ("fused", "fa_fused") else e2e
                rows.append(dict(shape=name, S=S, H=H, D=D, P=2, method=m, sender_visible_ms=sv, end_to_end_ms=e2e,
                                 repeat=i, tflops=U.attention_flops(S, H, D) / 2 / (e2e * 1e-3) / 1e12))
    return pd.DataFrame(rows)


def test_fa_table_ratios_are_the_medians_ratios():
    from xstage import ulysses_analysis, ulysses_figures

    df = _synthetic_record(random.Random())
    t = ulysses_analysis.ulysses_fa_table(df)
    for _, r in t.iterrows():
        d = df[df["shape"] == r["shape"]]
        med = lambda m, c="end_to_end_ms": d[d.method == m][c].median()  # noqa: E731
        assert r.ours_over_fa == pytest.approx(d[d.method == "attention_only"].tflops.median()
                                               / d[d.method == "fa"].tflops.median())
        assert r.fa_fused_sv == pytest.approx(med("fa_fused", "sender_visible_ms") / med("fa"))
        assert r.fa_fused_e2e == pytest.approx(med("fa_fused") / med("fa"))
        assert r.fa_speedup == pytest.approx(med("fa_serial") / med("fa_fused"))
        assert r.ours_speedup == pytest.approx(med("serial_triton") / med("fused"))
    df.attrs["world"] = "one GPU, 2 ranks; host link"
    fig = ulysses_figures.ulysses_fa(df)
    assert len(fig.data) == 6 and "host link" in fig.layout.title.text
    no_fused = ulysses_analysis.ulysses_fa_table(df[df.method != "fa_fused"])       # absent: NaN, not 0
    assert no_fused.fa_fused_e2e.isna().all() and (no_fused.fa > 0).all()


def test_peer_table_follows_the_buffers_addresses_not_the_object():
    """The fused kernel's table is cached by its values: the same buffers object (same id) at new addresses gets a
    new table (run G2: a freed object's id came back for other buffers, and the kernel stored into freed memory)."""
    from types import SimpleNamespace

    bufs = SimpleNamespace(world_size=2, out=SimpleNamespace(ptrs=[1 << 20, 2 << 20]))
    t1 = fa4._table(bufs, 64, 4, 64, 0, torch.device("cpu"))
    bufs.out.ptrs = [3 << 20, 4 << 20]
    t2 = fa4._table(bufs, 64, 4, 64, 0, torch.device("cpu"))
    assert t1.tolist() == [32, 256, 0, 1 << 20, 2 << 20] and t2.tolist() == [32, 256, 0, 3 << 20, 4 << 20]
