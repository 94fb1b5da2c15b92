"""composer on models outside its corpus: does each compose, run and match eager?

    .venv/bin/python bench/compose/beyond_corpus.py [--stack openvino,xnnpack] [--models a,b] \
        [--out bench/results/beyond_corpus.jsonl]

The corpus (composer/models/corpus.py) is what the suite and corpus_bench.py judge composer by; these
are more architectures nobody here wrote, built the same way (random weights, small configs,
no downloads), to find what the corpus misses. Each model is composed in a child process with
``composer.compose(model, stack, inputs, cache=False)`` (its proof included) and one JSON line
goes to ``--out``: the proof, the repairs, delegate calls, and the ops left on portable
kernels, or the error. No timing: run it beside other work if need be.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
import warnings

import torch

from composer.models import corpus
from composer.models.corpus import (
    SMALL,
    VOCAB,
    _Encoder,
    _image,
    _library,
    _timm,
    _torchvision,
    _transformers,
)


def tv(name, size=64, **kw):
    return _torchvision(name, size, **kw)


def tm(name, size=64, img_size=True, **kw):
    return _timm(name, size, img_size, **kw)


def hf(cfg, mdl, key="input_ids", cache=False, **c):
    return _transformers(cfg, mdl, key, cache, **{**SMALL, "vocab_size": VOCAB, **c})


def vit_hf():
    t = _library("transformers")
    m = t.ViTModel(t.ViTConfig(**SMALL, image_size=32, patch_size=8))
    return _Encoder(m, "pixel_values"), (torch.randn(1, 3, 32, 32),)


def wav2vec2():
    t = _library("transformers")
    cfg = t.Wav2Vec2Config(
        **SMALL,
        conv_dim=(32, 32),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        num_feat_extract_layers=2,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        vocab_size=VOCAB,
    )
    return _Encoder(t.Wav2Vec2Model(cfg), "input_values"), (torch.randn(1, 1600),)


class _SegmentationMap(torch.nn.Module):
    """A torchvision segmentation model returning its map as a tensor, not a dict."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)["out"]


def seg(name):
    def build():
        segmentation = _library("torchvision").models.segmentation
        model = getattr(segmentation, name)(weights=None, weights_backbone=None, num_classes=4)
        return _SegmentationMap(model), _image(96)

    return build


EXTRA = {
    "googlenet": tv("googlenet", aux_logits=False, init_weights=True),
    "densenet121": tv("densenet121"),
    "mobilenet_v3_large": tv("mobilenet_v3_large"),
    "efficientnet_v2_s": tv("efficientnet_v2_s"),
    "swin_t": tv("swin_t"),
    "resnext50": tv("resnext50_32x4d"),
    "regnet_y_400mf": tv("regnet_y_400mf"),
    "vit_b_16_small": tv("vit_b_16", image_size=64),
    "lraspp": seg("lraspp_mobilenet_v3_large"),
    "deeplabv3_mbv3": seg("deeplabv3_mobilenet_v3_large"),
    "efficientvit_b0": tm("efficientvit_b0", img_size=False),
    "repvit_m0_9": tm("repvit_m0_9", img_size=False),
    "fastvit_t8": tm("fastvit_t8", img_size=False),
    "poolformer_s12": tm("poolformer_s12", img_size=False),
    "mixer_s16": tm("mixer_s16_224"),
    "edgenext_xx_small": tm("edgenext_xx_small", img_size=False),
    "mobileone_s0": tm("mobileone_s0", img_size=False),
    "hgnetv2_b0": tm("hgnetv2_b0", img_size=False),
    "rexnet_100": tm("rexnet_100", img_size=False),
    "tiny_vit_5m": tm("tiny_vit_5m_224", 224, img_size=False),
    "xcit_nano": tm("xcit_nano_12_p16_224"),
    "inception_next_atto": tm("inception_next_atto", img_size=False),
    "distilbert": _transformers(
        "DistilBertConfig",
        "DistilBertModel",
        dim=64,
        n_layers=2,
        n_heads=4,
        hidden_dim=128,
        vocab_size=VOCAB,
    ),
    "roberta": hf("RobertaConfig", "RobertaModel", pad_token_id=1, max_position_embeddings=64),
    "albert": hf("AlbertConfig", "AlbertModel", embedding_size=32),
    "mobilebert": hf(
        "MobileBertConfig",
        "MobileBertModel",
        embedding_size=32,
        intra_bottleneck_size=32,
        true_hidden_size=32,
    ),
    "qwen2": hf("Qwen2Config", "Qwen2Model", cache=True, num_key_value_heads=2),
    "phi3": hf("Phi3Config", "Phi3Model", cache=True, pad_token_id=0),
    "gemma": hf("GemmaConfig", "GemmaModel", cache=True, num_key_value_heads=1, head_dim=16),
    "opt": _transformers(
        "OPTConfig",
        "OPTModel",
        "input_ids",
        True,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        ffn_dim=128,
        word_embed_proj_dim=64,
        vocab_size=VOCAB,
    ),
    "gpt_neox": hf("GPTNeoXConfig", "GPTNeoXModel", cache=True),
    "bloom": _transformers(
        "BloomConfig",
        "BloomModel",
        "input_ids",
        True,
        hidden_size=64,
        n_layer=2,
        n_head=4,
        vocab_size=VOCAB,
    ),
    "vit_hf": vit_hf,
    "wav2vec2": wav2vec2,
}


def compose_one(name: str, stack: str) -> dict:
    import composer

    warnings.filterwarnings("ignore")
    corpus.CORPUS[name] = corpus.Entry("beyond", EXTRA[name], name)
    record: dict = {"model": name, "stack": stack}
    try:
        model, inputs = corpus.load(name)
    except Exception as error:  # noqa: BLE001 - a model that does not build is a result
        record["build_error"] = f"{type(error).__name__}: {str(error)[:300]}"
        return record
    started = time.perf_counter()
    try:
        plan = composer.compose(model, stack, inputs, cache=False).plan
    except Exception as error:  # noqa: BLE001 - what failed, and how, is the result
        record["error"] = f"{type(error).__name__}: {str(error)[:600]}"
        record["trace"] = traceback.format_exc()[-1500:]
    else:
        record["proof"] = plan.proof
        record["repairs"] = [f"{r.partition}: {r.why[:150]} -> {r.moved_to}"
                             for r in plan.repairs]  # fmt: skip
        record["delegates"] = plan.delegate_calls
        record["portable"] = len(plan.fallbacks)
        record["portable_ops"] = sorted({f.op for f in plan.fallbacks})
    record["seconds"] = round(time.perf_counter() - started, 1)
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="openvino,xnnpack")
    parser.add_argument("--models", default=",".join(EXTRA))
    parser.add_argument("--out", default="bench/results/beyond_corpus.jsonl")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one model, to stdout
    args = parser.parse_args()
    if args.one:
        print(json.dumps(compose_one(args.one, args.stack)))
        return
    for name in args.models.split(","):
        try:
            child = subprocess.run(
                [sys.executable, __file__, "--one", name, "--stack", args.stack],
                capture_output=True, text=True, timeout=900, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            lines, child = [], None
        else:
            lines = child.stdout.strip().splitlines()
        record = json.loads(lines[-1]) if lines else {
            "model": name, "stack": args.stack,
            "error": "no result in 900 s" if child is None
            else f"the child exited {child.returncode}: {child.stderr[-300:]}",
        }  # fmt: skip
        with open(args.out, "a") as out:
            out.write(json.dumps(record) + "\n")
        verdict = record.get("proof") or record.get("error") or record.get("build_error")
        print(f"{name:22} {record.get('delegates', '-'):>3} delegate(s), "
              f"{record.get('portable', '-'):>3} on portable, {len(record.get('repairs', []))} "
              f"repair(s): {verdict[:120]}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
