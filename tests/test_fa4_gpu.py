"""FA4 (flash-attn-4's CuTe DSL Hopper kernel) on ONE GPU, every rank of the layer in this process
(``OneGPUWorld``, link local or host: the peers' outputs in pinned host memory): the Ulysses all-to-all fused into
FA's epilogue (``xstage.kernels.attention_fa4.UlyssesFusedSm90``) equals FA alone followed by the all-to-all (by
indexing) bit for bit on every rank, every output poisoned with NaN first, tiles straddling two ranks included;
FA alone is within 2x PyTorch's own error of the float32 reference; bad input is one error before any launch;
the one-GPU sweep records the FA methods. Skipped without a GPU or without the extra ``fa4``."""
import random

import pytest
import torch

from xstage import data, fa4
from xstage import ulysses as U
from xstage import ulysses_sweep as US
from xstage.ranks import OneGPUWorld

pytestmark = pytest.mark.gpu

CASES = [
    # P=2: Sl = 8,888; FA's D=64 tile is 192 rows: 8,888 = 46 x 192 + 56, a tile straddles; 48-key tail
    U.UlyssesShape("cogvideox5b_17776", 17_776, 48, 64),
    # P=2: Sl = 4,500 = 35 x 128 + 20 (straddles); P=4: 2,250 = 17 x 128 + 74 (straddles); partial last key block
    U.UlyssesShape("straddle_d128", 9_000, 8, 128),
    U.UlyssesShape("even_d128", 4_096, 4, 128),             # no straddle, S a multiple of every tile
]


@pytest.fixture(autouse=True)
def _needs_fa4():
    ok, why = fa4.available()
    if not ok:
        pytest.skip(why)


def _inputs(shape, P, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    Hl = shape.H // P
    return {r: tuple(torch.randn(shape.S, Hl, shape.D, generator=g, device="cuda").to(torch.bfloat16)
                     for _ in range(3)) for r in range(P)}


@pytest.mark.parametrize("link", ["local", "host"])
@pytest.mark.parametrize("P", [2, 4])
def test_fa_fused_bit_exact_on_one_gpu(P, link):
    world = OneGPUWorld(P, link)
    seed = random.randrange(2**30)
    big = max(CASES, key=lambda c: c.S // P * c.H * c.D)
    bufs = U.ulysses_buffers(world, big.S, big.H, big.D)
    straddled = False
    for i, c in enumerate(CASES):
        if c.H % P:
            continue
        qkv = _inputs(c, P, seed + i)
        q, k, v = ({r: t[j] for r, t in qkv.items()} for j in range(3))
        for r in range(P):
            bufs.out_view(r, c.S, c.H, c.D).fill_(float("nan"))
        world.barrier()
        outs = fa4.ulysses_fused_fa(world, q, k, v, bufs)
        torch.cuda.synchronize()
        want = U.post_all_to_all([fa4.attention(*qkv[r]) for r in range(P)])
        for r in range(P):
            got = outs[r].to("cuda")
            assert not torch.isnan(got).any(), f"{c.name} P={P} {link} rank {r}: rows left unwritten"
            U.check_bit_identical(got, want[r], f"{c.name} P={P} {link} rank {r}: FA fused vs FA + all-to-all")
        tile_m = fa4.fa_config(c.D)[0]
        straddled |= bool((c.S // P) % tile_m)
    assert straddled


def test_fa_alone_close_to_reference():
    c = U.UlyssesShape("close", 2_048, 2, 128)
    q, k, v = _inputs(c, 1, random.randrange(2**30))[0]
    out = fa4.attention(q, k, v)
    ref = U.attention_reference(q, k, v)
    pt = U.attention_reference(q, k, v, upcast=False)
    U.check_close(out, ref, pt, "FA4 alone")


def test_fa_kernel_is_fa_bit_for_bit():
    """FA's kernel launched directly (the sweep's fa_kernel) is FA's interface output, bit for bit, both head dims."""
    for i, c in enumerate(CASES[:2]):
        q, k, v = _inputs(c, 1, random.randrange(2**30) + i)[0]
        U.check_bit_identical(fa4.attention_kernel(q, k, v), fa4.attention(q, k, v), f"{c.name}: FA kernel vs FA")


def test_bad_input_one_error_before_launch():
    world = OneGPUWorld(2, "local")
    bufs = U.ulysses_buffers(world, 1_024, 4, 128)
    q = {r: torch.randn(1_024, 2, 128, device="cuda", dtype=torch.bfloat16) for r in range(2)}
    bad = {r: torch.randn(1_024, 2, 96, device="cuda", dtype=torch.bfloat16) for r in range(2)}
    with pytest.raises(ValueError, match="head dim"):
        fa4.ulysses_fused_fa(world, bad, bad, bad, bufs)
    with pytest.raises(ValueError, match="exceeds the buffers"):
        big = {r: torch.randn(4_096, 2, 128, device="cuda", dtype=torch.bfloat16) for r in range(2)}
        fa4.ulysses_fused_fa(world, big, big, big, bufs)
    fa4.ulysses_fused_fa(world, q, q, q, bufs)      # the good call still runs after the refused ones


@pytest.mark.parametrize("link", ["local", "host"])
def test_one_gpu_sweep_records_fa(tmp_path, link):
    shapes = [U.UlyssesShape("tiny_d128_straddle", 4_200, 4, 128)]
    methods = ["fused", "attention_only", "fa", "fa_kernel", "fa_serial", "fa_fused"]
    US.run_ulysses(tmp_path, world_size=2, shapes=shapes, repeats=2, warmup=1, tune=False, world="one-gpu",
                   link=link, methods=methods)
    df, meta = data.load(tmp_path, data.ULYSSES)
    assert set(df.method) == set(methods) and meta["params"]["fa4"]["available"]
    fused = df[df.method == "fa_fused"]
    assert (fused.sender_visible_ms > 0).all() and (fused.sender_visible_ms <= fused.end_to_end_ms).all()
