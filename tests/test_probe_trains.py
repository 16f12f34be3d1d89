"""The probe trains (issue 11): remote_store.probe_family's designed trains and stage_programs_analysis.probe_summary.
CPU: the summary on a per-program record built by hand (its every statistic derivable); the recorded folder
(data/h200x1/probe_trains, GPU run a run), where it exists, through the same function."""
import numpy as np
import pandas as pd
import pytest

from xstage import data, stage_programs_analysis
from xstage.remote_store import probe_family


def _record(P=8, repeats=2, release_at=None, seed=0):
    """Per-program rows of the probe family: program p's lead takes (p + 1) us, its first probe waits as long
    as its lead (or, with ``release_at``, until that many ns after its lead's start: released together), every
    later probe 50 ns. Starts are staggered 100 ns per program."""
    rng = np.random.default_rng(seed)
    rows = []
    for name, sizes, gaps in probe_family()[:3]:
        for rep in range(repeats):
            for p in range(P):
                t = 100.0 * p
                for k, (b, g) in enumerate(zip(sizes, gaps)):
                    if k == 0:
                        iss = 1000.0 * (p + 1)
                    elif k == 1:
                        iss = (release_at - t) if release_at is not None else 1000.0 * (p + 1) + rng.random()
                    else:
                        iss = 50.0
                    rows.append(dict(train=name, target="host", programs=P, store_bytes=16, n_bursts=len(sizes),
                                     rank=0, repeat=rep, program=p, smid=p, burst=k, burst_bytes=b, gap_ns=g,
                                     start_ns=t, issue_ns=iss))
                    t += iss + g
    return pd.DataFrame(rows)


def test_probe_summary_reads_what_was_built_into_the_record():
    r = stage_programs_analysis.probe_summary(_record())
    assert len(r) == 3 and set(r.programs) == {8}
    assert np.allclose(r.lead_ns, 4500.0) and np.allclose(r.lead_spread, 4.5)     # median of 1..8 us; / 1 us
    assert np.allclose(r.probe1_ns, 4500.0, rtol=1e-3) and (r.probe1_slow == 1.0).all()
    assert (r.spearman > 0.99).all()                                                # probe waits as its own lead
    assert np.allclose(r.probes_ns, r.probe1_ns + 10 * 50.0)
    assert sorted(zip(r.lead_kib, r.gap_us)) == sorted((s[0] / 1024, g[0] / 1e3) for _, s, g in probe_family()[:3])


def test_probe_summary_sees_probes_released_together():
    r = stage_programs_analysis.probe_summary(_record(release_at=60_000.0))
    assert (r.end_over_start_spread < 1e-6).all()
    r2 = stage_programs_analysis.probe_summary(_record())
    assert (r2.end_over_start_spread > 0.5).all()


def test_probe_summary_refuses_another_record():
    pp = _record()
    with pytest.raises(ValueError, match="no per-program rows"):
        stage_programs_analysis.probe_summary(pp.assign(target="local"))
    with pytest.raises(ValueError, match="probe family"):
        stage_programs_analysis.probe_summary(pp.assign(train="s0-00"))


def test_recorded_probe_trains_summarise_with_the_model_beside_them():
    folder = data.machine_dir("h200x1") / stage_programs_analysis.TRAIN_PROBE
    if not data.paths(folder, data.BURST_PROGRAM)[0].is_file():
        pytest.skip(f"no probe record in {folder} (GPU run a run)")
    from xstage.model import load_params

    pp, _ = data.load(folder, data.BURST_PROGRAM)
    r = stage_programs_analysis.probe_summary(pp, prm=load_params(data.machine_dir("h200x1"), "host"))
    assert len(r) == len(probe_family()) * pp.programs.nunique()
    assert (r.lead_ns > 0).all() and (r.probe1_ns > 0).all() and (r.model_probe1_ns > 0).all()
