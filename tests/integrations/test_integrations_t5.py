"""posattn.integrations.patch_t5 against the real transformers T5: tiny randomly
initialised models from transformers' own config class (no download); the
patched model's outputs, gradients and generated tokens equal the original's."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (requirements-dev.txt pins it)"
)
from transformers import T5Config, T5EncoderModel, T5ForConditionalGeneration  # noqa: E402

from posattn.integrations import patch_t5  # noqa: E402

BUCKETS = [(32, 128), (18, 20), (34, 27)]  # T5's default, and settings where a float64 log differs


def tiny_t5(num_buckets=32, max_distance=128, dropout=0.0, seed=0, cls=T5ForConditionalGeneration, init=1.0):
    torch.manual_seed(seed)
    cfg = T5Config(
        vocab_size=97, d_model=64, d_kv=16, num_heads=4, num_layers=2, num_decoder_layers=2, d_ff=96,
        relative_attention_num_buckets=num_buckets, relative_attention_max_distance=max_distance,
        dropout_rate=dropout, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, initializer_factor=init,
    )  # fmt: skip
    return cls(cfg)


def calls(model) -> dict:
    """{module name: {"posattn": n, "fallback": n}} of the patched self-attentions."""
    return {n: dict(m._posattn_calls) for n, m in model.named_modules() if hasattr(m, "_posattn_calls")}


def inputs(seed=1, batch=2, n_enc=37, n_dec=23):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, 97, (batch, n_enc), generator=g), torch.randint(2, 97, (batch, n_dec), generator=g)


@pytest.mark.parametrize("num_buckets,max_distance", BUCKETS)
@pytest.mark.parametrize("mode", ["eval", "train"])
def test_outputs_and_gradients_equal_the_original(num_buckets, max_distance, mode):
    original = tiny_t5(num_buckets, max_distance)
    patched = patch_t5(original, inplace=False)
    assert calls(original) == {}  # the original stays T5's
    assert list(patched.state_dict()) == list(original.state_dict())
    for m in (original, patched):
        m.train(mode == "train")
    ids, dec = inputs()
    out_o = original(input_ids=ids, decoder_input_ids=dec).logits
    out_p = patched(input_ids=ids, decoder_input_ids=dec).logits
    torch.testing.assert_close(out_p, out_o, rtol=1e-5, atol=1e-5)
    assert all(c == {"posattn": 1, "fallback": 0} for c in calls(patched).values()) and len(calls(patched)) == 4
    g = torch.randn(out_o.shape, generator=torch.Generator().manual_seed(2))
    grads_o = torch.autograd.grad((out_o * g).sum(), list(original.parameters()))
    grads_p = torch.autograd.grad((out_p * g).sum(), list(patched.parameters()))
    names = [n for n, _ in original.named_parameters()]
    for name, a, b in zip(names, grads_p, grads_o):  # float32 sums in another order: tolerance by the scale
        atol = 1e-4 * float(b.abs().max()) + 1e-7
        torch.testing.assert_close(a, b, rtol=1e-3, atol=atol, msg=lambda m: f"d {name}: {m}")
    bias = dict(patched.named_parameters())["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    assert bias.requires_grad


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_gives_the_same_tokens(num_beams):
    original = tiny_t5(18, 20, init=10.0).eval()  # large weights: a random model that does not repeat one token
    patched = patch_t5(original, inplace=False)
    ids, _ = inputs(batch=3, n_enc=29)
    kw = dict(max_new_tokens=16, num_beams=num_beams, do_sample=False, suppress_tokens=[0, 1])
    want = original.generate(ids, **kw)
    got = patched.generate(ids, **kw)
    assert torch.equal(got, want)
    assert len(set(want[:, 1:].flatten().tolist())) > 3  # real tokens, not one repeated
    c = calls(patched)
    # the encoder and the decoder's prefill run on posattn; the cached one-token steps on T5's code
    assert c["encoder.block.0.layer.0.SelfAttention"] == {"posattn": 1, "fallback": 0}
    assert c["decoder.block.1.layer.0.SelfAttention"]["posattn"] == 1
    assert c["decoder.block.1.layer.0.SelfAttention"]["fallback"] == 15


def test_the_cache_under_its_older_name_past_key_values():
    """transformers 5.17 passes the cache as past_key_values= (5.24: cache=); a patched
    layer that missed it generated other tokens without an error (seen on CUDA, 2026-11-26)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    model = patch_t5(tiny_t5(18, 20).eval(), inplace=False)
    attn = model.decoder.block[0].layer[0].SelfAttention
    x = torch.randn(2, 5, 64)
    for name in ("past_key_values", "cache"):
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        out_prefill = attn(x, **{name: cache})[0]
        assert cache.get_seq_length(0) == 5  # the prefill's keys and values reached the cache
        step = torch.randn(2, 1, 64)
        out_step = attn(step, **{name: cache})[0]  # a cached one-token step: T5's own code
        assert cache.get_seq_length(0) == 6
        full = attn(torch.cat([x, step], 1))[0]  # the same six tokens at once, causal
        torch.testing.assert_close(out_prefill, full[:, :5], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out_step, full[:, 5:], rtol=1e-5, atol=1e-5)


def test_a_padding_mask_falls_back_and_still_matches():
    original = tiny_t5().eval()
    patched = patch_t5(original, inplace=False)
    ids, dec = inputs()
    mask = torch.ones_like(ids)
    mask[0, -9:] = 0  # padding in one sequence
    out_o = original(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    out_p = patched(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(out_p, out_o, rtol=1e-5, atol=1e-5)
    c = calls(patched)
    assert c["encoder.block.1.layer.0.SelfAttention"] == {"posattn": 0, "fallback": 1}
    assert c["decoder.block.1.layer.0.SelfAttention"] == {"posattn": 1, "fallback": 0}  # its mask is causal only
    # an all-ones mask masks nothing: posattn again
    patched(input_ids=ids, attention_mask=torch.ones_like(ids), decoder_input_ids=dec)
    assert calls(patched)["encoder.block.1.layer.0.SelfAttention"] == {"posattn": 1, "fallback": 1}


def test_attention_dropout_in_training_falls_back():
    original = tiny_t5(dropout=0.1).train()
    patched = patch_t5(original, inplace=False)
    ids, dec = inputs()
    torch.manual_seed(5)
    out_o = original(input_ids=ids, decoder_input_ids=dec).logits
    torch.manual_seed(5)
    out_p = patched(input_ids=ids, decoder_input_ids=dec).logits
    torch.testing.assert_close(out_p, out_o)  # T5's own code, the same random draws
    assert all(c == {"posattn": 0, "fallback": 1} for c in calls(patched).values())
    patched.eval()
    patched(input_ids=ids, decoder_input_ids=dec)
    assert all(c == {"posattn": 1, "fallback": 1} for c in calls(patched).values())


@pytest.mark.parametrize("how", ["bfloat16 model", "bfloat16 autocast"])
def test_a_dtype_without_a_cpu_kernel_falls_back(how):
    # relpos_attention has no bfloat16 CPU kernel: the patched model runs T5's own code, as the
    # unpatched one does (it raised "dtype must be float32 or float64" before the fallback)
    original = tiny_t5(18, 20).eval()
    if how == "bfloat16 model":
        original = original.to(torch.bfloat16)
    patched = patch_t5(original, inplace=False)
    ids, dec = inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=how == "bfloat16 autocast"):
        out_o = original(input_ids=ids, decoder_input_ids=dec).logits
        out_p = patched(input_ids=ids, decoder_input_ids=dec).logits
    assert out_p.dtype == out_o.dtype
    torch.testing.assert_close(out_p, out_o, rtol=0, atol=0)
    assert all(c == {"posattn": 0, "fallback": 1} for c in calls(patched).values()) and len(calls(patched)) == 4
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=how == "bfloat16 autocast"):
        got = patched.generate(ids, max_new_tokens=4, do_sample=False)  # the prefill and the cached steps
        want = original.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)


def test_encoder_model_and_inplace_patch():
    model = tiny_t5(34, 27, cls=T5EncoderModel).eval()
    ids, _ = inputs(n_enc=50)
    want = model(input_ids=ids).last_hidden_state
    assert patch_t5(model) is model
    assert patch_t5(model) is model  # patching twice changes nothing
    torch.testing.assert_close(model(input_ids=ids).last_hidden_state, want, rtol=1e-5, atol=1e-5)
    assert all(c == {"posattn": 1, "fallback": 0} for c in calls(model).values()) and len(calls(model)) == 2
    clone = copy.deepcopy(model)  # a patched model deep-copies into a patched model
    torch.testing.assert_close(clone(input_ids=ids).last_hidden_state, want, rtol=1e-5, atol=1e-5)


def test_refuses_what_it_cannot_patch():
    with pytest.raises(ValueError, match="patch_t5: Linear holds no T5Stack"):
        patch_t5(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="patch_t5: expected a transformers T5 model, got str"):
        patch_t5("t5-small")
    with pytest.raises(ValueError, match=r"patch_t5 \(relative_attention_num_buckets.*max_distance must be > 8"):
        patch_t5(tiny_t5(32, 8))


def test_a_patched_model_pickles(tmp_path):
    model = patch_t5(tiny_t5(18, 20)).eval()
    ids, dec = inputs()
    want = model(input_ids=ids, decoder_input_ids=dec).logits
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    torch.testing.assert_close(loaded(input_ids=ids, decoder_input_ids=dec).logits, want, rtol=0, atol=0)
    assert all(c == {"posattn": 2, "fallback": 0} for c in calls(loaded).values()) and len(calls(loaded)) == 4


@pytest.fixture
def no_tf32():
    """float32 matmuls in full precision on CUDA (restored afterwards): the original and
    the patched model then differ only by the order of float32 sums."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("num_buckets,max_distance", [BUCKETS[0], BUCKETS[2]])
def test_cuda_outputs_and_gradients_equal_the_original(num_buckets, max_distance, no_tf32):
    original = tiny_t5(num_buckets, max_distance).cuda().train()
    patched = patch_t5(original, inplace=False)
    ids, dec = (x.cuda() for x in inputs())
    out_o = original(input_ids=ids, decoder_input_ids=dec).logits
    out_p = patched(input_ids=ids, decoder_input_ids=dec).logits
    torch.testing.assert_close(out_p, out_o, rtol=1e-4, atol=1e-4)
    assert all(c == {"posattn": 1, "fallback": 0} for c in calls(patched).values()) and len(calls(patched)) == 4
    g = torch.randn(out_o.shape, generator=torch.Generator().manual_seed(2)).cuda()
    grads_o = torch.autograd.grad((out_o * g).sum(), list(original.parameters()))
    grads_p = torch.autograd.grad((out_p * g).sum(), list(patched.parameters()))
    for (name, _), a, b in zip(original.named_parameters(), grads_p, grads_o):
        atol = 1e-3 * float(b.abs().max()) + 1e-6
        torch.testing.assert_close(a, b, rtol=1e-3, atol=atol, msg=lambda m: f"d {name}: {m}")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_generation_gives_the_same_tokens(no_tf32):
    original = tiny_t5(18, 20, init=10.0).cuda().eval()
    patched = patch_t5(original, inplace=False)
    ids = inputs(batch=3, n_enc=29)[0].cuda()
    kw = dict(max_new_tokens=16, num_beams=3, do_sample=False, suppress_tokens=[0, 1])
    assert torch.equal(patched.generate(ids, **kw), original.generate(ids, **kw))
    assert calls(patched)["encoder.block.0.layer.0.SelfAttention"] == {"posattn": 1, "fallback": 0}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_autocast_runs_on_posattn():
    """Mixed precision: q, k, v in bfloat16 on the op (the bias table cast to them),
    close to T5's own autocast run; every parameter gets a finite gradient."""
    original = tiny_t5().cuda().train()
    patched = patch_t5(original, inplace=False)
    ids, dec = (x.cuda() for x in inputs())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_o = original(input_ids=ids, decoder_input_ids=dec).logits
        out_p = patched(input_ids=ids, decoder_input_ids=dec).logits
    torch.testing.assert_close(out_p.float(), out_o.float(), rtol=5e-2, atol=5e-2)
    assert all(c == {"posattn": 1, "fallback": 0} for c in calls(patched).values())
    out_p.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in patched.parameters() if p.requires_grad)
