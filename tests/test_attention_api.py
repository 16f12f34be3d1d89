"""xstage.attention and xstage.UlyssesAttention on the CPU (Triton's interpreter): numerics against a float32
reference, the launch cache (hits, the compiled-launcher plumbing with a stand-in kernel, the Gluon entry's TMA
descriptors per batch), bad input (one line each, before any launch), the custom op under torch.compile
(fullgraph, no graph break) and the fused layer bit for bit against the call."""
from __future__ import annotations

import inspect

import pytest
import torch

import xstage
from xstage import attention_api as api
from xstage import ulysses
from xstage.attention_api import AttentionInputError, attention
from xstage.kernels import attention_gluon
from xstage.numeric import check_bit_identical, rel_l2
from xstage.ranks import EmulatedWorld
from xstage.ulysses_ladder import attention_reference
from xstage.ulysses_layer import UlyssesAttention

from conftest import record_launches

pytestmark = pytest.mark.interpreter


def _qkv(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g).to(dtype) for _ in range(3))


def _reference(q, k, v, scale=None):
    """float32 attention of [B, S, H, D] or [S, H, D] (upcast inputs)."""
    if q.dim() == 3:
        return attention_reference(q, k, v, scale)
    return torch.stack([attention_reference(q[b], k[b], v[b], scale) for b in range(q.shape[0])])


@pytest.fixture(autouse=True)
def fresh_cache():
    api.clear_cache()
    yield
    api.clear_cache()


@pytest.mark.parametrize("shape,dtype", [((2, 200, 2, 64), torch.bfloat16), ((130, 2, 128), torch.float16),
                                         ((1, 64, 3, 64), torch.float32)])
def test_matches_float32_reference(shape, dtype):
    """S not a multiple of the tiles (200, 130) included: the kernel masks; error <= 2x torch's own at that dtype."""
    q, k, v = _qkv(shape, dtype, seed=sum(shape))
    out = attention(q, k, v)
    assert out.shape == q.shape and out.dtype == dtype and out.is_contiguous()
    ref = _reference(q, k, v)
    torch_err = rel_l2(_reference(q, k, v).to(dtype).float(), ref) if dtype == torch.float32 else \
        rel_l2(torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(-3, -2) for t in (q, k, v))).transpose(-3, -2).float(), ref)
    assert rel_l2(out.float(), ref) <= 2 * torch_err + ulysses.REL_L2_FLOOR[dtype]


def test_sm_scale_and_cache_hits():
    q, k, v = _qkv((1, 96, 2, 64), torch.float16, seed=3)
    out = attention(q, k, v, sm_scale=0.05)
    assert rel_l2(out.float(), _reference(q, k, v, 0.05)) < 2e-3
    assert rel_l2(out.float(), _reference(q, k, v)) > 1e-2          # the scale is not ignored
    again = attention(q, k, v, sm_scale=0.05)
    check_bit_identical(again, out, "second call")
    info = api.cache_info()
    assert (info["hits"], info["misses"], info["entries"], info["kernels"]) == (1, 1, 1, ["interpreter"])
    attention(*_qkv((1, 97, 2, 64), torch.float16))                  # a new shape: a new entry
    assert api.cache_info()["misses"] == 2
    assert xstage.attention is api.attention and xstage.UlyssesAttention is UlyssesAttention


def _bad_cases():
    q, k, v = _qkv((1, 64, 2, 64), torch.float16)
    misaligned = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    return {
        "wrong dtype": ((q.double(), k.double(), v.double()), "runs"),
        "mixed dtypes": ((q, k.float(), v), "dtypes differ"),
        "mismatched heads": ((q, k[:, :, :1], v), "heads must match"),
        "head dim 96": ((q[..., :48].repeat(1, 1, 1, 2)[..., :96].contiguous(),) * 3, "head dim 96"),
        "S differs": ((q, k[:, :32], v[:, :32]), "self-attention only"),
        "batch differs": ((q, torch.cat([k, k]), torch.cat([v, v])), "batch"),
        "[B, H, S, D] transposed": ((q.transpose(1, 2).contiguous().transpose(1, 2), k, v), "strides"),
        "fused QKV slice": ((torch.cat([q, k], dim=-2)[:, :, :2], k, v), "strides"),
        "misaligned": ((misaligned, k, v), "16-byte aligned"),
        "empty S": ((q[:, :0], k[:, :0], v[:, :0]), "empty"),
        "2-D": ((q[0, :, 0], k, v), "[B, S, H, D]"),
        "not a tensor": (([1.0], k, v), "must be a tensor"),
        "sm_scale nan": ((q, k, v, float("nan")), "sm_scale"),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_input_one_line_before_any_launch(monkeypatch, case):
    args, words = _bad_cases()[case]
    launched = record_launches(monkeypatch, [(ulysses, "ulysses_attention_kernel"),
                                             (api, "ulysses_attention_kernel")])
    with pytest.raises(AttentionInputError) as e:
        attention(*args[:3], sm_scale=args[3] if len(args) > 3 else None)
    msg = str(e.value)
    assert words in msg and "\n" not in msg and msg.startswith("xstage.attention:"), msg
    assert launched == [] and api.cache_info()["entries"] == 0


def test_cpu_tensor_without_the_interpreter(monkeypatch):
    """On a machine whose interpreter is off (a GPU machine), a CPU tensor is one line; a CUDA device under the
    interpreter likewise (checked by name: this machine has no CUDA device)."""
    q, k, v = _qkv((1, 64, 2, 64), torch.bfloat16)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(AttentionInputError, match=r"q is on the CPU; the kernels run on a CUDA GPU"):
        attention(q, k, v)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(AttentionInputError, match="interpreter is on"):
        api.kernel_for(torch.device("cuda", 0))


class _StubCompiled:
    """What ``kernel[grid](...)`` returns on a GPU, reduced to what ``_FastLaunch`` uses; records launches."""

    def __init__(self, calls, fail=False):
        self.calls, self.fail = calls, fail
        self.function, self.packed_metadata = "fn", ("meta",)

    def launch_metadata(self, grid, stream, *args):
        return None

    @property
    def run(self):
        def launcher(*a):
            if self.fail:
                raise TypeError("function takes 17 positional arguments")
            self.calls.append(("compiled", a))
        return launcher


class _StubKernel:
    """A Triton kernel stand-in with the real kernel's Python signature (``fn``)."""

    def __init__(self, real, fail=False):
        self.fn, self.calls, self.fail = real.fn, [], fail

    def __getitem__(self, grid):
        def jit(**kw):
            self.calls.append(("jit", grid, kw))
            return _StubCompiled(self.calls, self.fail)
        return jit


def test_fast_launch_passes_the_bound_arguments(monkeypatch):
    """After the first launch through the JIT, the compiled launcher gets (grid, stream, function, metadata, hooks,
    every argument in the kernel's order with only the dynamic ones replaced); a launcher that refuses the list
    falls back to the JIT for good."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 1234, raising=False)
    real = ulysses.ulysses_attention_kernel
    kern = _StubKernel(real)
    kw = dict(Q="q_init", K="k_init", V="v_init", Kd=None, Vd=None, out_ptr="o_init", out_table="t", ts_ptr="t", S=64,
              rows_per_rank=64, in_row_stride=128, out_row_stride=128, h_start=0, out_head0=0, qk_scale=0.5,
              n_heads=2, HEAD_DIM=64, BLOCK_M=64, BLOCK_N=64, EVEN_N=True, FUSED=False, TIMED=False, DEVICE=True,
              num_warps=4, num_stages=2)
    launch = api._FastLaunch(kern, (1, 2), kw, ("Q", "K", "V", "out_ptr"))
    assert all(launch.args[i] is None for i in launch.slots)      # no reference to the first call's tensors
    launch.first("q_a", "k_a", "v_a", "o_a")
    assert kern.calls[0][0] == "jit" and kern.calls[0][2]["Q"] == "q_a" and kern.calls[0][2]["num_warps"] == 4
    assert launch.path == "compiled"
    launch("q_b", "k_b", "v_b", "o_b")
    kind, a = kern.calls[1]
    names = list(inspect.signature(real.fn).parameters)
    assert kind == "compiled" and a[:7] == (1, 2, 1, 1234, "fn", ("meta",), None)
    assert a[7:9] == api._launch_hooks()           # Triton's launch hooks, as its own launch path passes them
    got = dict(zip(names, a[9:]))
    assert len(a) - 9 == len(names) and (got["Q"], got["out_ptr"], got["S"], got["PIPE"]) == ("q_b", "o_b", 64, False)
    failing = api._FastLaunch(_StubKernel(real, fail=True), (1, 2), kw, ("Q", "K", "V", "out_ptr"))
    failing.first("q_a", "k_a", "v_a", "o_a")
    failing("q_c", "k_c", "v_c", "o_c")
    assert failing.path == "jit" and failing.kernel.calls[-1][2]["Q"] == "q_c" and "17" in failing.fallback


@pytest.mark.skipif(not attention_gluon.AVAILABLE, reason="this Triton has no Gluon for Hopper")
def test_gluon_entry_descriptors_per_batch(monkeypatch):
    """The Gluon entry (stand-in kernel, CPU tensors): every launch's four descriptors are the ones
    ``ulysses_gluon.attention_forward`` builds for that batch's [S, H * D] (base, shape, strides, block), with the
    sweep's tile as constexprs."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 0, raising=False)
    kern = _StubKernel(attention_gluon.gluon_attention_ws_kernel)
    monkeypatch.setattr(attention_gluon, "gluon_attention_ws_kernel", kern)
    q, k, v = _qkv((2, 300, 2, 128), torch.bfloat16)
    entry = api._gluon_entry(q, k, v, None, 2, 300, 2, 128)
    out = entry.first_out
    names = list(inspect.signature(kern.fn).parameters)
    launches = [dict(zip(names, c[1][9:])) if c[0] == "compiled" else c[2] for c in kern.calls]
    out2 = entry.run(q, k, v)
    launches += [dict(zip(names, c[1][9:])) for c in kern.calls[len(launches):]]
    config = xstage.ulysses_gluon.sweep_config(128)
    assert len(launches) == 4 and kern.calls[0][1] == (-(-300 // config.block_m) * 2, 1, 1)
    for i, a in enumerate(launches):
        b, o = i % 2, (out if i < 2 else out2)
        want = xstage.ulysses_gluon._descriptors(q[b], k[b], v[b], o[b], config)
        for name, d, w in zip(("q_desc", "k_desc", "v_desc", "o_desc"), [a[n] for n in ("q_desc", "k_desc", "v_desc",
                                                                                          "o_desc")], want):
            assert d.base.data_ptr() == w.base.data_ptr(), (i, name)
            assert (list(d.shape), list(d.strides), list(d.block_shape), d.layout) == \
                (list(w.shape), list(w.strides), list(w.block_shape), w.layout), (i, name)
        assert (a["S"], a["Hl"], a["BLOCK_M"], a["EVEN_N"], a["FUSED"], a["MASK_LAST"]) == \
            (300, 2, config.block_m, False, False, xstage.ulysses_gluon.mask_last_arg(config))
        assert a["qk_scale"] == pytest.approx(128 ** -0.5 * 1.4426950408889634)


def test_hit_path_skips_validation(monkeypatch):
    """Checks run on a key's first call only: later calls of the key are a lookup and the launch."""
    q, k, v = _qkv((1, 64, 2, 64), torch.float16, seed=2)
    first = attention(q, k, v)

    def refuse(*a, **kw):
        raise AssertionError("validated on a cache hit")

    monkeypatch.setattr(api, "validate", refuse)
    check_bit_identical(attention(q, k, v), first, "cache hit")
    with pytest.raises(AssertionError, match="validated on a cache hit"):
        attention(q[:, :32].contiguous(), k[:, :32].contiguous(), v[:, :32].contiguous())   # a new key validates


def test_custom_op_opcheck():
    """torch.library's own checks of the op: schema, the fake implementation against the real one, AOT dispatch."""
    q, k, v = _qkv((1, 64, 2, 64), torch.float16, seed=4)
    got = torch.library.opcheck(api.attention_op, (q, k, v, None),
                                test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))
    assert set(got.values()) == {"SUCCESS"}, got


def test_custom_op_compiles_fullgraph_without_breaks():
    q, k, v = _qkv((1, 64, 2, 64), torch.float16, seed=5)

    def f(q, k, v):
        return attention(q * 2.0, k, v).float().sum(-1)

    explained = torch._dynamo.explain(f)(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    check_bit_identical(got, f(q, k, v), "compiled vs eager")
    fake = api._attention_fake(*(torch.empty(2, 40, 3, 128, device="meta"),) * 3)
    assert fake.shape == (2, 40, 3, 128) and fake.device.type == "meta"
    with pytest.raises(AttentionInputError, match="heads must match"):
        api._attention_fake(torch.empty(2, 40, 3, 128, device="meta"), *(torch.empty(2, 40, 1, 128, device="meta"),) * 2)


def test_ulysses_layer_bit_identical_to_the_call():
    """Two emulated ranks: pre-attention all-to-all, the fused kernel, the barrier -> every rank's rows equal the
    call's bit for bit (the same kernel and tile); bad input is one line."""
    world = EmulatedWorld(2)
    layer = UlyssesAttention(world, heads=4, head_dim=64, seq_len=256)
    q, k, v = _qkv((1, 200, 4, 64), torch.bfloat16, seed=11)
    check_bit_identical(layer(q, k, v), attention(q, k, v), "UlyssesAttention vs xstage.attention")
    check_bit_identical(layer(q[0], k[0], v[0]), attention(q[0], k[0], v[0]), "[S, H, D]")
    layer.check()
    with pytest.raises(AttentionInputError, match="seq_len = 256"):
        layer(*_qkv((1, 300, 4, 64), torch.bfloat16))
    with pytest.raises(AttentionInputError, match="built for 4 of dim 64"):
        layer(*_qkv((1, 200, 2, 64), torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of the number of ranks"):
        UlyssesAttention(world, heads=3, head_dim=64, seq_len=256)

    def f(q, k, v):
        return layer(q + 0.0, k, v).float().sum(-1)

    explained = torch._dynamo.explain(f)(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    check_bit_identical(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v), f(q, k, v),
                        "compiled UlyssesAttention")


def test_compile_cache_dir(monkeypatch, tmp_path):
    assert isinstance(api.compile_cache_dir(), type(tmp_path))


def _gloo_pre_all_to_all(rank, P, port, x_all, want):
    import types

    import torch.distributed as dist

    from xstage.ulysses_layer import pre_all_to_all_nccl

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=P)
    try:
        world = types.SimpleNamespace(dist=dist, world_size=P, local_ranks=[rank], emulated=False)
        Sl = x_all.shape[0] // P
        check_bit_identical(pre_all_to_all_nccl(x_all[rank * Sl:(rank + 1) * Sl].contiguous(), world), want[rank],
                            f"rank {rank}'s pre-attention all-to-all")
    finally:
        dist.destroy_process_group()


def test_pre_all_to_all_on_gloo_ranks():
    """The layer's collective path (one process per rank: all_to_all_single) gives each rank the whole sequence of
    its heads, as the one-process path's indexing does (2 CPU processes, gloo)."""
    import torch.multiprocessing as mp

    from xstage.ranks import free_port
    from xstage.ulysses import pre_all_to_all

    P, (S, H, D) = 2, (12, 4, 8)
    x_all = torch.randn(S, H, D)
    want = pre_all_to_all([x_all[r * S // P:(r + 1) * S // P] for r in range(P)])
    mp.spawn(_gloo_pre_all_to_all, args=(P, free_port(), x_all, want), nprocs=P, join=True)


def test_host_us_queues_the_calls_behind_a_wait(monkeypatch):
    """bench.host_us's bookkeeping with the CUDA calls stood in: a GPU-side wait per round sized to the calls, the
    median of the rounds' per-call host time, ``covered`` False as soon as one round's wait had ended."""
    from xstage import bench

    sleeps, done = [], iter([False, False, True])

    class Event:
        def record(self):
            pass

        def query(self):
            return next(done)

    monkeypatch.setattr(torch.cuda, "_sleep", sleeps.append, raising=False)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls = []
    got = bench.host_us(lambda: calls.append(1), calls=4, rounds=3, cycles_per_call=10)
    assert sleeps == [40, 40, 40] and len(calls) == 1 + 12 and len(got["rounds"]) == 3
    assert got["us"] == sorted(got["rounds"])[1] and got["covered"] is False
