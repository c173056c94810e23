"""posattn.integrations.patch_swin against the real timm Swin and SwinV2: tiny
randomly initialised models from ``timm.create_model(..., pretrained=False)`` (no
download); the patched model's outputs and gradients equal the original's.
Where timm runs: tests/helpers/timm.py."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from helpers.timm import import_timm

timm = import_timm(module_level=True)

from posattn.integrations import patch_swin  # noqa: E402
from posattn.integrations.swin import swin_block_runs, swin_offset_bias  # noqa: E402

V1 = "swin_tiny_patch4_window7_224"
V2 = "swinv2_tiny_window8_256"
# (model, img_size, window): windows dividing the map; maps padded to the window
# (14 -> 16, 7 -> 8); a rectangle whose second stage shifts on one axis only;
# Swin's own window 7 (shift 3: the last window splits 4 + 3); a non-square window
CASES = [
    (V1, 64, 4),
    (V1, 56, 4),
    (V1, (32, 96), 8),
    (V1, 56, 7),
    (V1, 64, (4, 6)),
    (V2, 64, 4),
    (V2, 56, 4),
    (V2, (64, 96), 8),
    (V2, 56, 7),
]
IDS = ["v1-64-w4", "v1-56-w4-pad", "v1-32x96-w8", "v1-56-w7", "v1-64-w4x6", "v2-64-w4", "v2-56-w4-pad",
       "v2-64x96-w8", "v2-56-w7"]  # fmt: skip


def tiny(name, img_size=64, window=4, seed=0, **kw):
    torch.manual_seed(seed)
    kw = {"embed_dim": 32, "depths": (2, 2), "num_heads": (2, 4), "num_classes": 10, "drop_path_rate": 0.0} | kw
    model = timm.create_model(name, pretrained=False, img_size=img_size, window_size=window, **kw)
    with torch.no_grad():  # timm's init leaves a zero bias table (Swin) and q/v biases (SwinV2): make them count
        for n, p in model.named_parameters():
            if n.endswith(("relative_position_bias_table", "q_bias", "v_bias")):
                p.normal_(0, 0.5)
    return model


def images(img_size, batch=2, seed=1):
    h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
    return torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(seed))


def calls(model) -> dict:
    return {n: dict(m._posattn_calls) for n, m in model.named_modules() if hasattr(m, "_posattn_calls")}


def run(model, x, seed=3):
    torch.manual_seed(seed)  # the same dropout / drop-path draws for both models
    return model(x)


def assert_same(original, patched, x, rtol=1e-5, atol=1e-5):
    out_o, out_p = run(original, x), run(patched, x)
    torch.testing.assert_close(out_p, out_o, rtol=rtol, atol=atol)
    # drawn on the CPU (a CPU generator cannot draw on CUDA), the same on every device
    g = torch.randn(out_o.shape, generator=torch.Generator().manual_seed(2)).to(out_o.device)
    params_o, params_p = list(original.parameters()), list(patched.parameters())
    grads_o = torch.autograd.grad((out_o * g).sum(), params_o)
    grads_p = torch.autograd.grad((out_p * g).sum(), params_p)
    names = [n for n, _ in original.named_parameters()]
    for name, a, b in zip(names, grads_p, grads_o):  # float32 sums in another order: tolerance by the scale
        atol = 1e-4 * float(b.abs().max()) + 1e-7
        torch.testing.assert_close(a, b, rtol=1e-3, atol=atol, msg=lambda m: f"d {name}: {m}")


@pytest.mark.parametrize("name,img_size,window", CASES, ids=IDS)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_outputs_and_gradients_equal_the_original(name, img_size, window, mode):
    original = tiny(name, img_size, window, drop_path_rate=0.2 if mode == "train" else 0.0)
    patched = patch_swin(original, inplace=False)
    assert calls(original) == {}
    assert list(patched.state_dict()) == list(original.state_dict())
    shifted = [n for n, m in patched.named_modules() if hasattr(m, "_posattn_calls") and any(m.shift_size)]
    assert shifted  # every case has shifted blocks
    for m in (original, patched):
        m.train(mode == "train")
    assert_same(original, patched, images(img_size))
    c = calls(patched)
    assert len(c) == 4 and all(v == {"posattn": 1, "fallback": 0} for v in c.values()), c


@pytest.mark.parametrize(
    "name,kw",
    [
        (V1, dict(head_dim=24, qkv_bias=False)),  # attention width 48 / 96 against dims 32 / 64
        (V2, dict(qkv_bias=False)),
        (V1, dict(img_size=32, window=8, always_partition=True)),  # maps 8 and 4, windows 8: padded
        (V2, dict(img_size=32, window=8, always_partition=True)),
    ],
    ids=["v1-head_dim-no-qkv-bias", "v2-no-qkv-bias", "v1-always-partition", "v2-always-partition"],
)
def test_other_settings(name, kw):
    original = tiny(name, **({"img_size": 64, "window": 4} | kw)).train()
    patched = patch_swin(original, inplace=False)
    assert_same(original, patched, images(kw.get("img_size", 64)))
    assert all(v == {"posattn": 1, "fallback": 0} for v in calls(patched).values())


@pytest.mark.parametrize("name", [V1, V2])
def test_float64(name):
    original = tiny(name).double().train()
    patched = patch_swin(original, inplace=False)
    assert_same(original, patched, images(64).double(), rtol=1e-10, atol=1e-10)
    assert all(v == {"posattn": 1, "fallback": 0} for v in calls(patched).values())


@pytest.mark.parametrize("name", [V1, V2])
def test_half_precision_on_the_cpu_falls_back(name):
    """The op takes float32 / float64 on the CPU: bfloat16 weights, or bfloat16
    autocast, run timm's own code (the same result, bit for bit)."""
    original = tiny(name).eval()
    patched = patch_swin(original, inplace=False)
    x = images(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(patched(x), original(x))
    assert all(v == {"posattn": 0, "fallback": 1} for v in calls(patched).values())
    original, patched = original.bfloat16(), patched.bfloat16()
    assert torch.equal(patched(x.bfloat16()), original(x.bfloat16()))
    assert all(v == {"posattn": 0, "fallback": 2} for v in calls(patched).values())


@pytest.mark.parametrize("name", [V1, V2])
def test_projection_dropout_runs_on_posattn_with_the_same_draws(name):
    original = tiny(name, drop_rate=0.0, proj_drop_rate=0.3, drop_path_rate=0.1).train()
    patched = patch_swin(original, inplace=False)
    assert_same(original, patched, images(64))
    assert all(v == {"posattn": 1, "fallback": 0} for v in calls(patched).values())


@pytest.mark.parametrize("name", [V1, V2])
def test_attention_dropout_falls_back_in_training(name):
    original = tiny(name, attn_drop_rate=0.3).train()
    patched = patch_swin(original, inplace=False)
    assert_same(original, patched, images(64))
    assert all(v == {"posattn": 0, "fallback": 1} for v in calls(patched).values())
    for m in (original, patched):
        m.eval()
    assert_same(original, patched, images(64))  # in eval mode the same model runs on posattn
    assert all(v == {"posattn": 1, "fallback": 1} for v in calls(patched).values())


def test_fused_attention_path_of_timm_gives_the_same():
    original = tiny(V1)
    for m in original.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = True  # timm's scaled_dot_product_attention path, bias + mask as attn_mask
    patched = patch_swin(original, inplace=False)
    assert_same(original, patched, images(64))


@pytest.mark.parametrize("name", [V1, V2])
def test_other_input_sizes(name):
    """dynamic_img_size builds the shift masks per call; set_input_size after
    patching changes the windows: the patched blocks follow both."""
    original = tiny(name, dynamic_img_size=True)
    patched = patch_swin(original, inplace=False)
    assert_same(original, patched, images((52, 76)))  # maps 13 x 19 and 7 x 10: padded
    assert all(v == {"posattn": 1, "fallback": 0} for v in calls(patched).values())
    original, patched = tiny(name), None
    patched = patch_swin(original, inplace=False)
    for m in (original, patched):
        m.set_input_size(img_size=(96, 80), window_size=8)
    assert_same(original, patched, images((96, 80)))
    assert all(v["fallback"] == 0 for v in calls(patched).values())


@pytest.mark.parametrize("name", [V1, V2])
def test_a_static_mask_for_a_transposed_map_falls_back(name):
    """A model built for 32 x 64 images fed 64 x 32 ones: as many windows, so timm's
    static masks fit, but they mask the pairs of the other map. The patched blocks
    run timm's own code there (the same result), not the right masks."""
    original = tiny(name, img_size=(32, 64))
    patched = patch_swin(original, inplace=False)
    for m in (original, patched):
        m.patch_embed.strict_img_size = False
    assert_same(original, patched, images((64, 32)))
    c = calls(patched)
    assert c["layers.0.blocks.1"] == {"posattn": 0, "fallback": 1}  # shifted, 16 x 8 against 8 x 16
    assert c["layers.0.blocks.0"] == {"posattn": 1, "fallback": 0}  # no shift, no mask


def test_a_static_mask_for_another_size_falls_back():
    original = tiny(V1)
    patched = patch_swin(original, inplace=False)
    for m in (original, patched):  # accept a larger input without rebuilding the masks
        m.patch_embed.strict_img_size = False
    x = images(80)
    with pytest.raises(Exception) as want:
        run(original, x)
    with pytest.raises(type(want.value)):
        run(patched, x)  # timm's own code runs, and fails as it does
    assert any(v["fallback"] for v in calls(patched).values())


@pytest.mark.parametrize("padded,window", [(4, 4), (8, 4), (16, 4), (21, 7), (16, 8), (12, 3)])
def test_block_runs_are_timms_mask_regions(padded, window):
    """Two cells of one axis attend to each other in timm's shifted blocks (mask 0)
    exactly when swin_block_runs puts them in the same block."""
    for shift in range(window):
        label = torch.zeros(padded, dtype=torch.long)  # timm's img_mask along one axis
        for i, (a, b) in enumerate(((0, -window), (-window, -shift), (-shift, None))):
            label[slice(a, b)] = i
        if shift == 0:
            label[:] = 0
        win = torch.arange(padded) // window
        timm_same = (label[:, None] == label[None, :]) & (win[:, None] == win[None, :])
        block = torch.full((padded,), -1)
        for i, (start, size, count) in enumerate(swin_block_runs(padded, window, shift)):
            for j in range(count):
                assert (block[start + j * size : start + (j + 1) * size] == -1).all()
                block[start + j * size : start + (j + 1) * size] = 1000 * i + j
        assert (block >= 0).all()
        assert torch.equal(block[:, None] == block[None, :], timm_same), (padded, window, shift)


@pytest.mark.parametrize("name", [V1, V2])
def test_block_runs_and_bias_rebuild_timms_attention_matrix(name):
    """The bias per block and offset, placed per pair, is timm's
    relative_position_bias on the pairs timm's mask keeps (0), and no block holds
    a pair it masks (-100), in every window of a shifted block."""
    model = tiny(name, 64, 4)
    block = [m for m in model.modules() if hasattr(m, "shift_size") and any(m.shift_size)][0]
    attn, (wh, ww), (sh, sw) = block.attn, block.window_size, block.shift_size
    hp, wp = block.input_resolution
    with torch.no_grad():
        if name == V1:
            table = attn.relative_position_bias_table
            dense = table[attn.relative_position_index.view(-1)].view(wh * ww, wh * ww, -1).permute(2, 0, 1)
        else:
            table = 16 * torch.sigmoid(attn.cpb_mlp(attn.relative_coords_table).view(-1, attn.num_heads))
            dense = table[attn.relative_position_index.view(-1)].view(wh * ww, wh * ww, -1).permute(2, 0, 1)
        kept = (block.attn_mask == 0)[:, None].expand(-1, attn.num_heads, -1, -1)  # (nW, H, N, N)
        want = torch.where(kept, dense[None], float("nan"))
        got = torch.full_like(want, float("nan"))  # pairs no block holds stay NaN
        row = torch.arange(hp * wp).view(hp, wp)
        for r0, bh, nr in swin_block_runs(hp, wh, sh):
            for c0, bw, nc in swin_block_runs(wp, ww, sw):
                bias = swin_offset_bias(table, (wh, ww), (bh, bw)).view(-1, 2 * bh - 1, 2 * bw - 1)
                for i in range(nr):
                    for j in range(nc):
                        cells = row[r0 + i * bh : r0 + (i + 1) * bh, c0 + j * bw : c0 + (j + 1) * bw].flatten()
                        win = (cells // wp // wh) * (wp // ww) + (cells % wp) // ww
                        assert (win == win[0]).all()
                        local = ((cells // wp) % wh) * ww + (cells % wp) % ww
                        for a, qa in enumerate(cells):
                            for b, kb in enumerate(cells):
                                dh, dw = int(kb // wp - qa // wp), int(kb % wp - qa % wp)
                                got[win[0], :, local[a], local[b]] = bias[:, dh + bh - 1, dw + bw - 1]
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)
        assert kept.any() and not kept.all()


def test_patch_in_place_copy_and_twice():
    model = tiny(V2)
    x = images(64)
    want = model.eval()(x)
    same = patch_swin(model)
    assert same is model and len(calls(model)) == 4
    patch_swin(model)  # patched already: unchanged
    twin = copy.deepcopy(model)
    for m in (model, twin):
        torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-5)
    assert all(v == {"posattn": 1, "fallback": 0} for v in calls(twin).values())  # the copy counts its own calls


def test_a_patched_model_pickles(tmp_path):
    model = patch_swin(tiny(V1)).eval()
    x = images(64)
    want = model(x)
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    torch.testing.assert_close(loaded(x), want, rtol=0, atol=0)
    assert all(v == {"posattn": 2, "fallback": 0} for v in calls(loaded).values())  # its calls before saving too


def test_refusals():
    with pytest.raises(ValueError, match="expected a timm Swin"):
        patch_swin("swin")
    with pytest.raises(ValueError, match="Linear holds no timm SwinTransformerBlock"):
        patch_swin(torch.nn.Linear(2, 2))
    model = tiny(V1)
    model.layers[0].blocks[1].shift_size = (4, 2)
    with pytest.raises(ValueError, match=r"block 'layers.0.blocks.1': shift_size \(4, 2\) must be in \[0, window\)"):
        patch_swin(model)
    model = tiny(V1)
    model.layers[1].blocks[0].attn = torch.nn.Identity()
    with pytest.raises(
        ValueError, match="block 'layers.1.blocks.0': attn is a Identity, expected timm's WindowAttention"
    ):
        patch_swin(model)
    assert calls(model) == {}  # nothing patched by a refused call


def test_large_swinv2_logit_scale_warns():
    model = tiny(V2)
    with torch.no_grad():
        model.layers[0].blocks[1].attn.logit_scale.fill_(math.log(50.0))
    with pytest.warns(UserWarning, match="block 'layers.0.blocks.1': logit scale up to 50.0"):
        patch_swin(model, inplace=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patch_swin(tiny(V2), inplace=False)  # timm's initial scale (10): no warning


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name,img_size,window", [CASES[1], CASES[5]], ids=[IDS[1], IDS[5]])
def test_cuda_outputs_and_gradients_equal_the_original(name, img_size, window):
    original = tiny(name, img_size, window).cuda().train()
    patched = patch_swin(original, inplace=False)
    torch.backends.cuda.matmul.allow_tf32 = False
    assert_same(original, patched, images(img_size).cuda(), rtol=1e-4, atol=1e-4)
    assert all(v == {"posattn": 1, "fallback": 0} for v in calls(patched).values())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", [V1, V2])
def test_cuda_autocast_runs_on_posattn(name):
    """Mixed precision (timm's --amp): q, k, v in bfloat16 on the op (SwinV2's
    normalised q and k cast back from autocast's float32), close to timm's."""
    original = tiny(name).cuda().train()
    patched = patch_swin(original, inplace=False)
    x = images(64).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_o, out_p = run(original, x), run(patched, x)
    torch.testing.assert_close(out_p.float(), out_o.float(), rtol=5e-2, atol=5e-2)
    out_p.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in patched.parameters() if p.requires_grad)
    assert all(v == {"posattn": 1, "fallback": 0} for v in calls(patched).values())
