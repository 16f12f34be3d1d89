"""stage_programs_analysis.gpc_map (the SM -> GPC map from thread-block clusters, scripts/gpc_map.cu) and stage_programs_analysis.favour_by_gpc."""
from __future__ import annotations

import json

import numpy as np
import pytest

from xstage import data, stage_programs_analysis


def _record(tmp_path, launches, sm_count=12, head=None):
    lines = [json.dumps(head if head is not None else {"device": "test", "sm_count": sm_count, "uuid": "u"})]
    for i, (cs, clusters) in enumerate(launches):
        blocks = [[b, c, r, sm] for b, (c, r, sm) in enumerate((c, r, sm) for c, sms in enumerate(clusters)
                                                               for r, sm in enumerate(sms))]
        lines.append(json.dumps({"cluster_size": cs, "launch": i, "max_active_clusters": len(clusters),
                                 "blocks": blocks}))
    p = tmp_path / "gpc_map.jsonl"
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_groups_are_the_union_of_clusters_of_four_or_more(tmp_path):
    perm = [int(x) for x in np.random.default_rng().permutation(14)]   # a fresh SM numbering each run
    a, b, rest = perm[:6], perm[6:10], perm[10:]    # a GPC of 6 SMs, one of 4; four SMs that pair only
    launches = [(1, [[s] for s in perm]),
                (2, [rest[:2], rest[2:], a[:2]]),   # pairs: a TPC's SMs, never a GPC
                (4, [a[:4], b]),
                (4, [a[2:]])]                       # a's last two SMs join it only through this cluster
    g = stage_programs_analysis.gpc_map(_record(tmp_path, launches, sm_count=14)).set_index("smid")
    assert (g.loc[a, "gpc"] == min(a)).all() and (g.loc[a, "gpc_sms"] == 6).all()
    assert (g.loc[b, "gpc"] == min(b)).all() and (g.loc[b, "gpc_sms"] == 4).all()
    assert (g.loc[rest, "gpc"] == -1).all() and (g.loc[rest, "gpc_sms"] == 1).all()


def test_malformed_records_name_the_file_and_line(tmp_path):
    with pytest.raises(ValueError, match="no GPC map record"):
        stage_programs_analysis.gpc_map(tmp_path / "absent.jsonl")
    with pytest.raises(ValueError, match=":1: not a gpc_map.cu record"):
        stage_programs_analysis.gpc_map(_record(tmp_path, [(4, [[0, 1, 2, 3]])], head={"device": "x"}))
    with pytest.raises(ValueError, match=r":2: malformed gpc_map line: smid 40 outside 0\.\.11"):
        stage_programs_analysis.gpc_map(_record(tmp_path, [(4, [[0, 1, 2, 40]])]))
    with pytest.raises(ValueError, match="no launches recorded"):
        stage_programs_analysis.gpc_map(_record(tmp_path, []))


def test_recorded_maps_agree_within_the_process_and_across_chips():
    """The map read before and after the trains (one process) and by another process on another chip."""
    root = data.machine_dir("h200x1")
    before = stage_programs_analysis.gpc_map(root / stage_programs_analysis.TRAIN_GPC / "gpc_map_before.jsonl")
    after = stage_programs_analysis.gpc_map(root / stage_programs_analysis.TRAIN_GPC / "gpc_map_after.jsonl")
    other = stage_programs_analysis.gpc_map(root / "gpc_map" / "gpc_map.jsonl")
    assert before.attrs["uuid"] == after.attrs["uuid"] != other.attrs["uuid"]
    assert before.gpc.tolist() == after.gpc.tolist() == other.gpc.tolist()


def test_favour_by_gpc_counts_every_program_of_the_grid_once():
    per_sm, summary = stage_programs_analysis.favour_by_gpc()
    for P, g in summary.groupby("programs"):
        assert g.programs_in_gpc.sum() == P            # every program is in one GPC row (gpc -1 included)
        assert (g.sms <= g.programs_in_gpc).all()
    assert per_sm.rel.gt(0).all() and per_sm.gpc.notna().all()
