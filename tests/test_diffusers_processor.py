"""The diffusers drop-in (xstage.diffusers_processor) on tiny diffusers transformers (random weights, two layers) on
the CPU: Wan 2.1's and CogVideoX's, bf16, with our processor against diffusers' own within bf16 tolerance of a
float32 run; self-attention routed, cross-attention left to SDPA; the Ulysses layer over two emulated ranks bit for
bit against the one-call path. Needs the extra ``diffusers`` (skipped without it)."""
from __future__ import annotations

import pytest
import torch

from xstage import attention_api
from xstage.diffusers_processor import (XStageAttnProcessor, restore_processors, routable, sdpa_arguments,
                                        use_xstage_attention)
from xstage.numeric import check_bit_identical, rel_l2
from xstage.ranks import EmulatedWorld
from xstage.ulysses import REL_L2_FLOOR
from xstage.ulysses_layer import UlyssesAttention

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.interpreter

HEADS, HEAD_DIM = 2, 64


def _wan(frames: int = 3):
    torch.manual_seed(0)
    model = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=64, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32).eval()
    g = torch.Generator().manual_seed(1)
    # 3 frames of 6 x 10 latents, patches 1 x 2 x 2: 45 tokens (not a multiple of any tile); 4 frames: 60
    inputs = (torch.randn(1, 4, frames, 6, 10, generator=g), torch.tensor([500]), torch.randn(1, 8, 16, generator=g))
    return model, lambda m, dt: m(inputs[0].to(dt), inputs[1], inputs[2].to(dt), return_dict=False)[0]


def _cogvideox():
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    torch.manual_seed(0)
    model = diffusers.CogVideoXTransformer3DModel(
        num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, in_channels=4, out_channels=4, time_embed_dim=16,
        text_embed_dim=16, num_layers=2, sample_width=8, sample_height=8, sample_frames=9, patch_size=2,
        temporal_compression_ratio=4, max_text_seq_length=8, use_rotary_positional_embeddings=True).eval()
    g = torch.Generator().manual_seed(1)
    x, text = torch.randn(1, 3, 4, 8, 8, generator=g), torch.randn(1, 8, 16, generator=g)
    rot = get_3d_rotary_pos_embed(HEAD_DIM, ((0, 0), (4, 4)), (4, 4), 3, use_real=True)   # 8 + 48 = 56 tokens
    return model, lambda m, dt: m(x.to(dt), text.to(dt), torch.tensor([500]), image_rotary_emb=rot,
                                  return_dict=False)[0]


MODELS = {"wan2.1": (_wan, {"attn1": 1, "attn2": 0}), "cogvideox": (_cogvideox, {"attn1": 1})}


@pytest.mark.parametrize("name", list(MODELS))
def test_tiny_transformer_matches_diffusers_processor(name):
    build, routed = MODELS[name]
    model, run = build()
    with torch.no_grad():
        ref = run(model, torch.float32).float()                         # diffusers' processor, float32
        model = model.to(torch.bfloat16)
        theirs = run(model, torch.bfloat16).float()                     # diffusers' processor, bf16
        procs = use_xstage_attention(model)
        ours = run(model, torch.bfloat16).float()
    assert all(isinstance(p, XStageAttnProcessor) for p in procs.values()) and len(procs) == 2 * len(routed)
    for n, p in procs.items():   # each self-attention call routed once per forward; cross-attention left to SDPA
        want = routed[n.rsplit(".", 1)[1]]
        assert p.calls == {"xstage": want, "sdpa": 1 - want}, (n, p.calls)
    err, err_theirs = rel_l2(ours, ref), rel_l2(theirs, ref)
    assert err <= 2 * err_theirs + REL_L2_FLOOR[torch.bfloat16], (err, err_theirs)
    assert rel_l2(ours, theirs) > 0          # ours ran (a different kernel: not the same bits as SDPA's)
    restore_processors(model)
    assert not any(isinstance(m.processor, XStageAttnProcessor) for m in model.modules() if hasattr(m, "processor"))


def test_ulysses_processor_over_two_emulated_ranks():
    """The self-attention through the fused Ulysses layer (two emulated ranks: the whole sequence split by the
    layer) gives the one-call path's bits."""
    model, run = _wan(frames=4)                # 60 tokens: 30 per rank
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        use_xstage_attention(model)
        one = run(model, torch.bfloat16)
        layer = UlyssesAttention(EmulatedWorld(2), heads=HEADS, head_dim=HEAD_DIM, seq_len=64)
        procs = use_xstage_attention(model, ulysses=layer)          # re-wrapping replaces the wrapper
        ulysses = run(model, torch.bfloat16)
    assert all(p.ulysses is layer for p in procs.values())
    check_bit_identical(ulysses, one, "Wan 2.1 tiny, Ulysses P=2 vs one call")
    layer.check()


def test_what_is_routed():
    q = torch.randn(1, 2, 40, 64)
    assert routable(sdpa_arguments((q, q, q), {}))
    assert not routable(sdpa_arguments((q, q, q), {"attn_mask": torch.ones(40, 40, dtype=torch.bool)}))
    assert not routable(sdpa_arguments((q, q[:, :, :8], q[:, :, :8]), {}))          # cross-attention
    assert not routable(sdpa_arguments((q, q, q), {"is_causal": True}))
    assert not routable(sdpa_arguments((q[..., :32],) * 3, {}))                       # head dim 32
    assert not routable(sdpa_arguments((q.double(),) * 3, {}))
    with pytest.raises(ValueError, match="no diffusers attention module"):
        use_xstage_attention(torch.nn.Linear(2, 2))
    assert attention_api.cache_info()["entries"] >= 0
