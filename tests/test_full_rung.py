"""Each link's full model is one rung of the ladder (xstage.stage_fit.FULL_RUNG; the host link's is free_store since
): the file names, the check that a file holds the rung its name says, what load_params reads, the
switch rule on a record neither rung saw, and MegaMoE's host rows re-predicted with other parameters."""
import shutil

import numpy as np
import pytest

from xstage import data, megamoe_analysis, stage_analysis, stage_fit
from xstage.megamoe_model_analysis import host_rescore
from xstage.model import load_params, params_from_dict
from xstage.stage_params import StageParams

H = data.machine_dir("h200x1")


def test_each_link_names_its_full_rung_and_load_params_reads_it():
    assert stage_fit.FULL_RUNG == {"nvlink": "stage", "host": "free_store"}
    assert stage_fit.stage_fit_name("host") == stage_fit.stage_fit_name("host", "free_store") == "stage_fit_host.json"
    assert stage_fit.stage_fit_name("host", "stage") == "stage_fit_host_stage.json"
    assert stage_fit.stage_fit_name("nvlink") == stage_fit.stage_fit_name("nvlink", "stage") == "stage_fit_nvlink.json"
    assert stage_fit.stage_fit_name("nvlink", "free_store") == "stage_fit_nvlink_free_store.json"
    f = stage_fit.read_stage_fit(H, "host")
    assert f["rung"] == "free_store" and f["params"]["arbitration"] == "gpc_drain"
    assert load_params(H, "host") == StageParams(**f["params"])
    assert load_params(H, "host").free_kib > 0 and load_params(H, "host").free_cap_kib == 32.0
    old = stage_fit.read_stage_fit(H, "host", "stage")
    assert old["rung"] == "stage" and old["params"]["arbitration"] == "slots" and "free_kib" not in old["params"]
    fits = stage_analysis.stage_fits(("host",))
    assert ("host", "free_store") in fits and ("host", "stage") in fits
    p = stage_analysis.stage_params(fits)
    assert {"free_kib", "free_cap_kib"} <= set(p.parameter)
    assert p.set_index("parameter").loc["free_cap_kib", ["ci95_low", "ci95_high"]].tolist() == [32.0, 32.0]


def test_a_file_holding_another_rung_than_its_name_is_refused(tmp_path):
    shutil.copy(H / "stage_fit_host_stage.json.gz", tmp_path / "stage_fit_host.json.gz")
    with pytest.raises(ValueError, match="holds rung 'stage', not 'free_store'"):
        stage_fit.read_stage_fit(tmp_path, "host")
    with pytest.raises(ValueError, match="no fit"):
        stage_fit.read_stage_fit(tmp_path, "host", "stage")


def test_the_full_host_rung_beats_stage_on_a_seed_neither_saw():
    """The switch rule (docs/findings.md) on the record of a seed never recorded before the fits
    (train_seed22_clean): free_store's median |error| below rung stage's."""
    rec = H / "train_seed22_clean"
    full = stage_analysis.score_trains(rec, "host")[1].median_abs_error.iloc[0]
    stage = stage_analysis.score_trains(rec, "host", prm=params_from_dict(stage_fit.read_stage_fit(H, "host", "stage")["params"]))
    assert full < stage[1].median_abs_error.iloc[0] and full < 0.2


def test_host_rescore_takes_other_parameters():
    df, meta = megamoe_analysis.world_data("one-gpu", "host")
    one = df[(df["shape"] == df["shape"].iloc[0]) & (df.tokens == df.tokens.iloc[0])]
    own, _ = host_rescore(one, meta)
    same, _ = host_rescore(one, meta, prm=params_from_dict(meta["params"]["prm"]))
    assert len(own) > 0 and own.equals(same)
    other, _ = host_rescore(one, meta, prm=load_params(H, "host"))
    assert np.array_equal(other.speedup, own.speedup)                     # the measurement is the record's
    assert not np.allclose(other.predicted_speedup, own.predicted_speedup)


