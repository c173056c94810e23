"""Existing models on posattn (posattn.integrations) against the models as they
are, on the CPU: forward and forward+backward time and the peak memory a step
adds, original vs patched, in one run.

Models are randomly initialised from the libraries' own config classes (no
download):

- transformers T5: a tiny one (2+2 layers, d_model 64, vocabulary 512) and
  T5-small's shapes (6+6 layers, d_model 512, 8 heads, d_kv 64, d_ff 2048,
  vocabulary 32128), encoder and decoder fed --tokens tokens each (no padding:
  every self-attention call runs on posattn; cross-attention stays T5's in both).
  transformers picks T5's attention implementation for the original (eager or
  SDPA with the bias as a dense mask).
- timm Swin / SwinV2: a tiny Swin (64 x 64 images, window 4, dim 32, depths 2+2),
  Swin-T (224 x 224, window 7) and SwinV2-T (256 x 256, window 8), --images
  images per step. timm needs torchvision, which imports only on a CUDA build of
  torch here: run this in the environment of scripts/cuda_build.sh
  (build/cuda-venv/bin/python, the CPU does the work).

Median of --repeats after warm-up; peak memory in a fresh process per
(model, variant, step). Prints ms, MiB and the ratios original / patched
(> 1: patched is faster / lighter).

    python benchmarks/bench_integrations.py [--models t5-tiny,...] [--tokens 512] [--batch 2]
        [--images 4] [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

from posattn.utils.timing import median_seconds, peak_extra_mib

T5 = {
    "t5-tiny": dict(vocab_size=512, d_model=64, d_kv=16, num_heads=4, num_layers=2, num_decoder_layers=2, d_ff=128),
    "t5-small shapes": dict(
        vocab_size=32128, d_model=512, d_kv=64, num_heads=8, num_layers=6, num_decoder_layers=6, d_ff=2048
    ),
}
SWIN = {  # timm name and its arguments; drop_path_rate 0 so that both variants do the same work
    "swin-tiny": ("swin_tiny_patch4_window7_224", dict(img_size=64, window_size=4, embed_dim=32, depths=(2, 2),
                                                       num_heads=(2, 4))),
    "Swin-T": ("swin_tiny_patch4_window7_224", dict(img_size=224)),
    "SwinV2-T": ("swinv2_tiny_window8_256", dict(img_size=256)),
}  # fmt: skip
MODELS = list(T5) + list(SWIN)


def build(name: str, patched: bool):
    import posattn.integrations

    torch.manual_seed(0)
    if name in T5:
        from transformers import T5Config, T5ForConditionalGeneration

        model = T5ForConditionalGeneration(T5Config(dropout_rate=0.0, decoder_start_token_id=0, **T5[name]))
        return posattn.integrations.patch_t5(model) if patched else model
    import timm

    timm_name, kw = SWIN[name]
    model = timm.create_model(timm_name, pretrained=False, drop_path_rate=0.0, num_classes=1000, **kw)
    return posattn.integrations.patch_swin(model) if patched else model


def step_fn(model, name: str, args, backward: bool):
    g = torch.Generator().manual_seed(1)
    if name in T5:
        vocab = model.config.vocab_size
        ids = torch.randint(2, vocab, (args.batch, args.tokens), generator=g)
        dec = torch.randint(2, vocab, (args.batch, args.tokens), generator=g)
        inputs = dict(input_ids=ids, decoder_input_ids=dec)

        def forward():
            return model(**inputs).logits
    else:
        size = SWIN[name][1]["img_size"]
        images = torch.randn(args.images, 3, size, size, generator=g)

        def forward():
            return model(images)

    def step():
        if backward:
            model.train()
            model.zero_grad(set_to_none=True)
            forward().float().mean().backward()
        else:
            model.eval()
            with torch.no_grad():
                forward()

    return step


def child(args) -> None:
    torch.set_num_threads(args.threads)
    name, variant, what = args.child.split("|")
    model = build(name, variant == "patched")
    step = step_fn(model, name, args, what == "fwd+bwd")
    step()  # warm-up: lazy buffers and the allocator's first growth are not the step's
    print(json.dumps({"peak_extra_mib": peak_extra_mib(step)}))


def peak_memory(name: str, variant: str, what: str, args) -> float:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{name}|{variant}|{what}",
           "--tokens", str(args.tokens), "--batch", str(args.batch), "--images", str(args.images),
           "--threads", str(args.threads)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        return float("nan")
    return json.loads(res.stdout.strip().splitlines()[-1])["peak_extra_mib"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--batch", type=int, default=2, help="T5: sequences per step")
    p.add_argument("--images", type=int, default=4, help="Swin: images per step")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--models", default=",".join(T5), help="comma-separated: " + ", ".join(MODELS))
    p.add_argument("--json", help="also write the rows as JSON here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0
    torch.set_num_threads(args.threads)
    names = [n.strip() for n in args.models.split(",")]
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"--models: unknown model {n!r} (known: {', '.join(MODELS)})")
    versions = {"torch": torch.__version__}
    if any(n in T5 for n in names):
        try:
            import transformers
        except ImportError:
            raise SystemExit("bench_integrations: the T5 models need transformers (requirements-dev.txt)")
        versions["transformers"] = transformers.__version__
    if any(n in SWIN for n in names):
        try:
            import timm
        except Exception as e:  # torchvision raises a RuntimeError on a torch it was not built for
            raise SystemExit(
                f"bench_integrations: the Swin models need timm, which does not import here ({e}); "
                "run in scripts/cuda_build.sh's environment: build/cuda-venv/bin/python " + " ".join(sys.argv)
            )
        versions["timm"] = timm.__version__
    print(", ".join(f"{k} {v}" for k, v in versions.items()) + f"; {args.threads} threads; "
          f"T5: batch {args.batch}, {args.tokens} encoder and {args.tokens} decoder tokens; "
          f"Swin: {args.images} images; median of {args.repeats}")  # fmt: skip
    print("| model | step | original ms | patched ms | original / patched | original MiB | patched MiB | "
          "patched / original memory |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name in names:
        models = {v: build(name, v == "patched") for v in ("original", "patched")}
        for what in ("forward", "fwd+bwd"):
            ms = {
                v: 1e3 * median_seconds(step_fn(m, name, args, what == "fwd+bwd"), warmup=1, repeats=args.repeats)
                for v, m in models.items()
            }
            mib = {v: peak_memory(name, v, what, args) for v in models}
            row = dict(model=name, step=what, ms=ms, mib=mib)
            rows.append(row)
            print(f"| {name} | {what} | {ms['original']:.1f} | {ms['patched']:.1f} | "
                  f"{ms['original'] / ms['patched']:.2f} | {mib['original']:.0f} | {mib['patched']:.0f} | "
                  f"{mib['patched'] / mib['original']:.2f} |", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(**versions, args=vars(args), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
