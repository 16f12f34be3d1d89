"""Ulysses with 8-rank traffic on 2 GPUs (xstage.traffic_ulysses, issue 13) under Triton's CPU interpreter: the
traffic layer on 2 emulated GPUs against the emulated 8-rank Ulysses layer (EmulatedWorld(8)), bit for bit (fresh
random inputs, every output slot and sink poisoned with NaN first): the real out[L_g] holds the head groups of
ranks 0 and 4 exactly as the 8-rank layer puts them and every other head group stays poisoned, each sink holds the
peer's head group, the slot of the peer's rank is never written; 7/8 of each GPU's bytes cross (from the tables and
from the buffers); planted wrong pointers are caught; the serial_bytes baseline moves what it says; the sweep's
flow into its own schema and resume; bad input is one clear error before any launch. Tiny shapes: well under a
minute. The 2-GPU tests (``multigpu``) are written for nvidia-h200-x2 and skip here."""
import random
import types

import pytest
import torch

import xstage.ranks
from xstage import data, env, records
from xstage import traffic_ulysses as TU
from xstage import ulysses as U
from xstage.cli import main
from xstage.numeric import check_bit_identical
from xstage.ranks import EmulatedWorld
from xstage.traffic import TrafficWorld
from conftest import record_launches

pytestmark = [pytest.mark.interpreter, pytest.mark.timeout(120)]


def _layers(S, H, D, dtype, seed):
    """(the 8-rank layer's outputs {rank: [Sl, H, D]}, the traffic world and its buffers after its fused layer);
    both from the same seeded q, k, v [S, H, D], every output (every slot and sink) poisoned with NaN first."""
    shape = U.UlyssesShape("t", S, H, D)
    q_all, k_all, v_all = U._random_inputs(shape, dtype, torch.device("cpu"), seed)
    w8 = EmulatedWorld(8)
    b8 = U.ulysses_buffers(w8, S, H, D, dtype)
    q, k, v = ({r: t for r, t in enumerate(U.shard_heads(x, 8))} for x in (q_all, k_all, v_all))
    for r in range(8):
        b8.out_view(r, S, H, D).fill_(float("nan"))
    outs8 = U.ulysses_fused(w8, q, k, v, b8)
    tw = TrafficWorld(EmulatedWorld(2))
    bt = U.ulysses_buffers(tw, S, H, D, dtype)
    qkv = TU.layer_inputs(tw, S, H, D, dtype, seed, tw.local_ranks)
    for r in tw.local_ranks:                        # the pre-attention all-to-all built on the host
        check_bit_identical(qkv[r][0], q[r], f"rank {r}: q of the traffic world vs the 8-rank layer's")
    tw.poison_destinations(bt.out)
    U.ulysses_fused(tw, *({r: qkv[r][j] for r in tw.local_ranks} for j in range(3)), bt)
    return outs8, tw, bt


def _compare(outs8, tw, bt, S, H, D):
    """The issue's validation: every slot of every GPU against the 8-rank layer's outputs, head group by group."""
    L, Sl, Hl = 8, S // 8, H // 8
    n_real = n_sink = 0
    for g in range(2):
        me, peer = tw.played[g], tw.played[1 - g]
        for j in range(L):
            got = TU.slot_view(tw, bt, g, j, S, H, D)                       # [Sl, 8, Hl, D]
            want = outs8[j].view(Sl, L, Hl, D)
            written = [0, 4] if j == me else [] if j == peer else [peer]
            assert TU.landing(tw, g, j) == written
            for h in range(L):
                if h in written:
                    check_bit_identical(got[:, h], want[:, h], f"GPU {g} slot {j} head group {h}")
                    assert not torch.isnan(got[:, h]).any()
                    n_real += j == me
                    n_sink += j != me
                else:
                    assert torch.isnan(got[:, h]).all(), f"GPU {g} slot {j}: head group {h} is not poisoned"
    assert n_real == 4 and n_sink == 12          # 2 GPUs x 2 head groups; 2 GPUs x 6 sinks x 1 head group


CASES = [(128, 16, 64, torch.float16),   # Sl = 16: every 64-row tile straddles 4 owners
         (80, 8, 64, torch.float32)]     # Sl = 10, S not a multiple of the key block (masked tail), Hl = 1


@pytest.mark.parametrize("S,H,D,dtype", CASES, ids=["fp16", "fp32"])
def test_traffic_ulysses_lands_as_the_8_rank_layer(S, H, D, dtype):
    seed = random.randrange(2**30)
    outs8, tw, bt = _layers(S, H, D, dtype, seed)
    _compare(outs8, tw, bt, S, H, D)
    # check_layer (what the sweep and the GPU check use: our attention of both played ranks) agrees
    o = {r: U.attention_forward(*TU.layer_inputs(tw, S, H, D, dtype, seed, [r])[r]) for r in tw.played}
    assert TU.check_layer(tw, bt, S, H, D, o, "layer") == 2 * (2 + 6) * (S // 8) * (H // 8) * D
    # the bytes that crossed, from the buffers: rows of GPU g's head group written into the peer's memory
    for g, me in enumerate(tw.played):
        crossed = sum(int((~torch.isnan(TU.slot_view(tw, bt, 1 - g, j, S, H, D)[:, me])).sum()) for j in range(8))
        own = int((~torch.isnan(TU.slot_view(tw, bt, g, me, S, H, D)[:, me])).sum())
        assert crossed == 7 * own and own == S // 8 * (H // 8) * D
        eg = TU.egress(tw, bt, S, H, D)[g]                               # from the tables and the layout
        assert eg["remote"] == crossed * dtype.itemsize and eg["local"] == own * dtype.itemsize
        assert eg["remote_share"] == 7 / 8


def test_check_job_against_float32_and_the_tables():
    res = TU.check_job(TrafficWorld(EmulatedWorld(2)), [(64, 8, 64), (128, 16, 128)], random.randrange(2**30),
                       torch.float16)
    assert [(r["case"], r["gpu"], r["rank"]) for r in res] == [
        ("S64_H8_D64", 0, 0), ("S64_H8_D64", 1, 4), ("S128_H16_D128", 0, 0), ("S128_H16_D128", 1, 4)]
    assert all(r["remote_share"] == 7 / 8 and r["rel_l2"] <= 2 * r["rel_l2_torch"] + 1e-4 for r in res), res


def test_planted_wrong_pointers_are_caught():
    """GPU 0's pointer for the sink of rank 2 aimed at its own slot 2, then (fresh buffers) its pointers for
    owners 2 and 3 swapped: check_layer names GPU, slot and head group."""
    S, H, D, dtype = 64, 8, 64, torch.float16
    seed = random.randrange(2**30)
    tw = TrafficWorld(EmulatedWorld(2))
    qkv = TU.layer_inputs(tw, S, H, D, dtype, seed, tw.played)
    o = {r: U.attention_forward(*qkv[r]) for r in tw.played}
    for plant, match in ((lambda t, b: t.__setitem__(2, TU.slot_view(tw, b, 0, 2, S, H, D).data_ptr()),
                          r"GPU 0 \(rank 0\) slot 2: head group\(s\) \[0\] written|GPU 1 \(rank 4\) slot 2"),
                         (lambda t, b: t.__setitem__([2, 3], t[[3, 2]].clone()), r"slot 2, head group 0")):
        bt = U.ulysses_buffers(tw, S, H, D, dtype)
        plant(bt.out_table[0], bt)
        tw.poison_destinations(bt.out)
        U.ulysses_fused(tw, *({r: qkv[r][j] for r in tw.local_ranks} for j in range(3)), bt)
        with pytest.raises(AssertionError, match=match):
            TU.check_layer(tw, bt, S, H, D, o, "planted")


def test_serial_bytes_moves_the_bytes_of_rank_l_g():
    """1/8 of each GPU's output to itself and 7/8 to the peer (the bytes rank L_g sends and receives at 8 ranks);
    the copies that stand in for NCCL here put every sender's chunk where expected_received says."""
    S, H, D = 128, 16, 64
    tw = TrafficWorld(EmulatedWorld(2))
    n = S * (H // 8) * D
    for g in range(2):
        sp = TU.a2a_splits(tw, g, S, H, D)
        assert sum(sp) == n and sp[1 - g] == 7 * n // 8 and sp[g] == n // 8
    o = {r: torch.randn(S, H // 8, D) for r in tw.played}
    recv = {r: torch.full((S, H // 8, D), float("nan")) for r in tw.played}
    TU.serial_bytes_copies(tw, o, recv)
    for g, r in enumerate(tw.played):
        check_bit_identical(recv[r].reshape(-1), TU.expected_received(tw, g, o), f"GPU {g}: received chunks")
    # GPU 0 keeps its first S/8 rows (rank 0's own: the layer's), GPU 1 its last (not rank 4's: the bytes only)
    check_bit_identical(recv[0][: S // 8], o[0][: S // 8], "GPU 0 own chunk")
    check_bit_identical(recv[4][-(S // 8):], o[4][-(S // 8):], "GPU 1 own chunk")
    assert "not the layer's output" in TU.METHOD_HELP["serial_bytes"]


# ------------------------------------------------------------------------------------------ the sweep's flow
def test_sweep_job_flow_records_traffic_rows(tmp_path, monkeypatch, cpu_timing):
    """sweep_job on the traffic world (emulated GPUs, one process: the flow, not GPU times): the fused layer checked
    against the played ranks' attention, serial_bytes' movement checked, every method timed, rows into
    ulysses_traffic.csv with traffic_ranks 8, gpus 2 and P 8, the egress in the sidecar, resume."""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *a: types.SimpleNamespace(multi_processor_count=2))
    tw = TrafficWorld(EmulatedWorld(2))
    shapes = [U.UlyssesShape("tiny", 64, 8, 64)]
    meta = env.provenance("test", {"traffic_ranks": 8, "gpus": 2})
    TU.sweep_job(tw, 8, shapes, str(tmp_path), meta, 2, 1, list(TU.METHODS), False, random.randrange(2**20))
    df, side = data.load(tmp_path, data.ULYSSES_TRAFFIC)
    assert sorted(set(df.method)) == sorted(TU.METHODS) and len(df) == 3 * 2
    assert (df.traffic_ranks == 8).all() and (df.gpus == 2).all() and (df.P == 8).all() and (df.end_to_end_ms > 0).all()
    eg = side["egress"]["tiny/P8"]
    assert side["params"]["traffic_ranks"] == 8 and set(eg) == {"0", "1"}
    assert all(e["remote_share"] == 7 / 8 for e in eg.values()) and [eg["0"]["rank"], eg["1"]["rank"]] == [0, 4]
    assert not (tmp_path / "ulysses.csv").exists()
    TU.sweep_job(tw, 8, shapes, str(tmp_path), meta, 2, 1, list(TU.METHODS), False, 0)
    assert len(data.load(tmp_path, data.ULYSSES_TRAFFIC)[0]) == 6            # resumed: nothing new


def test_labels_say_8_rank_traffic_on_2_gpus():
    tw = TrafficWorld(EmulatedWorld(2))
    assert tw.label == "8-rank traffic on 2 GPUs" and 'never "8 GPUs"' in TU.__doc__
    for text in [tw.label, *TU.METHOD_HELP.values(), TU.run.__doc__, TU.check_job.__doc__]:
        assert "8 GPUs" not in text, text


# -------------------------------------------------------------------------------------------- bad inputs
@pytest.fixture
def no_launch(monkeypatch):
    launched = record_launches(monkeypatch, [(U, "ulysses_attention_kernel"), (xstage.ranks, "epoch_barrier_kernel")])
    yield launched
    assert not launched, "a kernel was launched although the inputs were bad"


TW = lambda: TrafficWorld(EmulatedWorld(2))  # noqa: E731


@pytest.mark.parametrize("call,match", [
    (lambda: TU.check_job(TW(), [(64, 12, 64)], 0, torch.float16),
     r"8-rank traffic on 2 GPUs: heads \(12\) must be a positive multiple"),
    (lambda: TU.check_job(TW(), [(100, 8, 64)], 0, torch.float16),
     r"sequence length \(100\) must be a positive multiple of the number of ranks \(8\)"),
    (lambda: TU.check_job(EmulatedWorld(2), [(64, 8, 64)], 0), r"needs a TrafficWorld"),
    (lambda: TU.validate(EmulatedWorld(8), 64, 8, 64), r"needs a xstage.traffic.TrafficWorld"),
    (lambda: U.check_job(TW(), [(64, 8, 64)], 0, torch.float16),
     r"cannot check this world \(8-rank traffic on 2 GPUs\): use xstage.traffic_ulysses.check_job"),
    (lambda: TU.run("/nonexistent/traffic8", world="one-gpu"), r"traffic ranks are for the gpus world"),
    (lambda: TU.run("/nonexistent/traffic8", world_size=4), r"needs a 2-rank world .* got 4 ranks"),
    (lambda: TU.run("/nonexistent/traffic7", 7), r"multiple of the world size \(2\)"),
    (lambda: TU.run("/nonexistent/h200x2"), r"in a folder of its own named traffic8"),
    (lambda: TU.run("/nonexistent/traffic8", methods=["fused", "sdpa_only"]), r"methods must be a subset"),
    (lambda: TU.run("/nonexistent/traffic8", shapes=U.shapes_by_name(["wan21_1.3b_32760"])),
     r"heads \(12\) must be a positive multiple"),
    (lambda: TU.run("/nonexistent/traffic8", shapes=[U.UlyssesShape("odd", 4100, 24, 128)]),
     r"sequence length \(4100\) must be a positive multiple"),
])
def test_bad_inputs_fail_before_any_launch(no_launch, call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_sweep_refuses_mixed_folders_and_needs_two_gpus(tmp_path, capsys):
    folder = tmp_path / "traffic8"
    data.start_file(folder, data.ULYSSES, env.provenance("test", {}))
    with pytest.raises(ValueError, match="holds a ulysses sweep; record the ulysses_traffic one in another folder"):
        TU.run(folder)
    if torch.cuda.device_count() < 2:       # a one-GPU (or CPU) machine: the one-line error of the CLI
        assert main(["sweep", "ulysses", "--traffic-ranks", "8", "--out", str(tmp_path / "x" / "traffic8"),
                     "--shapes", "seq_4k"]) == 2
        err = capsys.readouterr().err
        assert "the Ulysses sweep with 8-rank traffic on 2 GPUs needs 2 CUDA GPU" in err and len(err.strip().split("\n")) == 1
        assert not (tmp_path / "x").exists()
        shared = tmp_path / "y" / "traffic8"            # the MegaMoE traffic record's folder: its own file beside
        data.start_file(shared, data.MEGAMOE_TRAFFIC, env.provenance("test", {}))
        with pytest.raises(RuntimeError, match="needs 2 CUDA GPU"):
            TU.run(shared, shapes=U.shapes_by_name(["seq_4k"]))


def test_prediction_from_the_recorded_two_gpu_rows():
    """predicted_fused_over_serial on data/h200x2's Ulysses record (P = 2): every shape whose heads divide by 8, the
    bytes each GPU sends 7/16 of P = 2's, the attention shorter, the model never above its bound (a fused layer that
    hides everything), the bound above 1; P != 2 rows refused."""
    df, meta = data.load(records.folder("ulysses", "h200x2", "nvlink"), data.ULYSSES)
    p = TU.predicted_fused_over_serial(df, meta)
    want = {s for s in set(df["shape"]) if df[df["shape"] == s].H.iloc[0] % 8 == 0}
    assert set(p["shape"]) == want and len(p) >= 10
    assert (p.bytes_traffic * 16 == p.bytes_p2 * 7).all()
    assert (p.attention_ms_traffic < p.attention_ms_p2).all() and (p.bound_traffic > 1).all()
    assert (p.model_traffic <= p.bound_traffic + 1e-12).all() and (p.model_traffic > 0.5).all()
    assert p.attrs["alltoall_fit"]["gb_per_s"] > 0
    with pytest.raises(ValueError, match="needs recorded P = 2 rows"):
        TU.predicted_fused_over_serial(df.assign(P=8), meta)


# ------------------------------------------------------------------------------------------- 2 GPUs (multigpu)
# tiny shapes first (straddling tiles), then two DiT shapes and the shortest sequence of the sweep
GPU_CASES = [(1024, 16, 128), (2040, 8, 64)] + U.shapes_for(8, U.shapes_by_name(["flux1_4608", "cogvideox5b_17776",
                                                                                   "seq_4k"]))


@pytest.mark.multigpu
@pytest.mark.timeout(900)
def test_traffic_ulysses_on_two_gpus():
    """On 2 GPUs (TorchSymmWorld): every slot of both GPUs bit for bit against our attention of ranks 0 and 4, the
    rest still NaN, the real outputs against the float32 reference, 7/8 of each GPU's bytes over NVLink."""
    from xstage.ranks import spawn

    spawn(TU.gpu_check_job, 2, 8, GPU_CASES, random.randrange(2**30))


@pytest.mark.multigpu
@pytest.mark.timeout(900)
def test_traffic_ulysses_sweep_writes_and_resumes_on_two_gpus(tmp_path):
    folder = tmp_path / "traffic8"
    shapes = U.shapes_by_name(["seq_4k"])
    TU.run(folder, shapes=shapes, repeats=3, tune=False)
    df, meta = data.load(folder, data.ULYSSES_TRAFFIC)
    assert sorted(set(df.method)) == sorted(TU.METHODS) and len(df) == 9
    assert (df.traffic_ranks == 8).all() and (df.gpus == 2).all() and (df.P == 8).all()
    assert (df[df.method == "fused"].sender_visible_ms > 0).all() and meta["params"]["traffic_ranks"] == 8
    assert meta["egress"]["seq_4k/P8"]["1"]["remote_share"] == 7 / 8 and "bursts" in meta
    TU.run(folder, shapes=shapes, repeats=3, tune=False)
    assert len(data.load(folder, data.ULYSSES_TRAFFIC)[0]) == 9
