"""data/h200x1/train_gpc_full (, call a run): per-program host trains at P = 100 / 132 / 198 / 264 with the
chip's SM -> GPC map read in the same process. The figures docs/findings.md gives, recomputed from the rows: at
P = 100 the head's SMs and GPC 0 drain at ~2/3 of the median program (GPC 0 with the head holds 16 programs, the
other GPCs 11-12: equal GPC shares give 0.72), the SMs of TPCs 60-61 do not (they are not in GPC 0); at the full
grids no GPC stands out."""
import numpy as np

from xstage import stage_programs_analysis
from xstage.stage_programs_analysis import gpc_map
from xstage import data, stage_programs_analysis


def test_recorded_full_grids_per_gpc():
    folder = data.machine_dir("h200x1") / "train_gpc_full"
    before, after = (gpc_map(folder / f"gpc_map_{w}.jsonl") for w in ("before", "after"))
    assert before.equals(after)                          # the map did not move over the trains
    sm, g = stage_programs_analysis.favour_by_gpc(sub="train_gpc_full")
    assert sorted(set(g.programs)) == [100, 132, 198, 264]
    g100 = g[g.programs == 100].set_index("gpc")
    assert (g100.loc[0, "programs_in_gpc"], g100.loc[-1, "programs_in_gpc"]) == (8, 10)   # 8 of the 10: the head
    assert g100.loc[[-1, 0], "rel_median"].between(0.6, 0.72).all()
    assert (g100.drop(index=[-1, 0]).rel_median > 0.9).all()
    s100 = sm[(sm.programs == 100) & sm.smid.isin([120, 121, 122, 123])]
    assert len(s100) >= 2 and (s100.rel > 0.85).all()    # TPCs 60-61 not slowed with GPC 0
    for P in (132, 264):
        assert g[g.programs == P].rel_median.between(0.88, 1.1).all()
    assert np.isfinite(g.rel_median).all()
