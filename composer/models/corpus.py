"""Real architectures nobody here wrote, with random weights, for ``corpus:NAME`` and the corpus
tests and bench: torchvision, timm and transformers models, built small, never downloaded.

Each builder imports its library when called (they are optional: ``pip install
'executorch-composer[corpus]'``, and torchvision with ``--no-deps``, see scripts/setup) and
returns ``(eval module, example_inputs)``; inputs are small (64x64 to 160x160 images,
16-token sequences) so that exporting and lowering one takes seconds on a laptop.

torchvision's wheel on the package index is built for CUDA torch: under a ``+cpu`` torch its
``_C`` extension does not load, and ``import torchvision`` then fails ("operator
torchvision::nms does not exist") while registering fake kernels for its detection ops. The
schemas of those ops are defined here first (:func:`define_torchvision_ops`); no model of the
corpus calls them (they are NMS and RoI pooling, which run after or beside what is exported).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import torch
from torch import nn

from composer.contract.errors import ModelError, did_you_mean

INSTALL_HINT = (
    "pip install 'executorch-composer[corpus]' (and torchvision==0.28.0 with --no-deps, so "
    "that pip keeps this torch; scripts/setup does both)"
)

Built = tuple[nn.Module, tuple[torch.Tensor, ...]]


@attrs.frozen
class Entry:
    """One corpus model: where its definition comes from, how to build it, and, if a
    composed program of it needs a looser comparison with eager than the dtype's default,
    that tolerance and why (None: the default, what composer's plan says)."""

    library: str  # "torchvision", "timm", "transformers"
    build: Callable[[], Built]
    description: str
    kind: str = "vision"  # "vision", "text", "speech", "recurrent", "detection"
    tolerance: tuple[float, float] | None = None  # (atol, rtol) beyond the plan's, with why
    tolerance_reason: str = ""


# ---------------------------------------------------------------- the libraries, imported late

# torchvision's operator schemas (torchvision/csrc/ops/*.cpp, TORCH_LIBRARY_FRAGMENT), as
# torchvision 0.28 defines them. Defined only when torchvision's own _C has not.
_TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    (
        "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
    ),
    (
        "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, "
        "int sampling_ratio, bool aligned) -> Tensor"
    ),
    (
        "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, "
        "float rois_scale, int rois_zero_point, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
    ),
    (
        "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width, int sampling_ratio) -> (Tensor, Tensor)"
    ),
    (
        "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
        "float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
        "SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor"
    ),
    (
        "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)"
    ),
    (
        "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, "
        "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, "
        "SymInt height, SymInt width) -> Tensor"
    ),
    (
        "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
        "SymInt pooled_width) -> (Tensor, Tensor)"
    ),
    (
        "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, "
        "float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, "
        "SymInt channels, SymInt height, SymInt width) -> Tensor"
    ),
    (
        "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
        "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, "
        "SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor"
    ),
    (
        "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, "
        "Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, "
        "SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, "
        "bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
    ),
)
_torchvision_library: list[torch.library.Library] = []  # kept alive: dropping it undefines


@functools.cache  # once: every corpus model's import asks
def _load_torchvisions_own_ops() -> None:
    """torchvision's native library, where it loads beside this torch: defining its schemas
    first and loading it after aborts the process (the GPU machine's torchvision 0.26 with
    torch 2.11). Where it does not load (a torchvision built for another torch or CUDA),
    composer defines the schemas below."""
    spec = importlib.util.find_spec("torchvision")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        for library in sorted(Path(folder).glob("_C*.so")):
            try:
                torch.ops.load_library(str(library))
            except (OSError, RuntimeError):
                pass


def define_torchvision_ops() -> None:
    """Define each ``torchvision::`` op schema that nothing has defined yet, so that
    ``import torchvision`` works where its native library does not load."""
    _load_torchvisions_own_ops()
    missing = []
    for schema in _TORCHVISION_SCHEMAS:
        name = schema.split("(", 1)[0]
        if not torch._C._jit_get_schemas_for_operator(f"torchvision::{name}"):
            missing.append(schema)
    if not missing:
        return
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in missing:
        library.define(schema)
    _torchvision_library.append(library)


def _library(name: str):
    """The optional library ``name``, imported, or a ModelError saying how to install it."""
    # timm imports torchvision, and transformers may: define its ops whichever comes first.
    define_torchvision_ops()
    try:
        with _quiet_imports():
            return importlib.import_module(name)
    except ImportError as error:
        raise ModelError(
            f"the corpus models from {name} need {name}, which does not import here "
            f"({type(error).__name__}: {error}): {INSTALL_HINT}."
        ) from error


@contextlib.contextmanager
def _quiet_imports() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _image(size: int = 64) -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, size, size),)


def _tokens(vocab: int, length: int = 16) -> tuple[torch.Tensor]:
    return (torch.randint(0, vocab, (1, length)),)


# ---------------------------------------------------------------- torchvision


def _torchvision(name: str, size: int = 64, **kwargs) -> Callable[[], Built]:
    def build() -> Built:
        models = _library("torchvision").models
        model = getattr(models, name)(weights=None, num_classes=10, **kwargs)
        return model, _image(size)

    return build


class _DetectionHead(nn.Module):
    """A detector without its box decoding and NMS: backbone, then the head on every map."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.backbone = detector.backbone
        self.head = detector.head

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = list(self.backbone(images).values())
        out = self.head(features)
        return out["bbox_regression"], out["cls_logits"]


def _ssdlite() -> Built:
    detection = _library("torchvision").models.detection
    detector = detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=5
    )
    return _DetectionHead(detector), _image(160)


# ---------------------------------------------------------------- timm


def _timm(name: str, size: int = 64, img_size: bool = True, **kwargs) -> Callable[[], Built]:
    def build() -> Built:
        timm = _library("timm")
        if img_size:
            kwargs["img_size"] = size
        model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        return model, _image(size)

    return build


# ---------------------------------------------------------------- transformers


class _Encoder(nn.Module):
    """A transformers model called the way a deployed encoder or decoder is: without a KV
    cache, returning its last hidden state as a plain tensor."""

    def __init__(self, model: nn.Module, key: str = "input_ids", cache: bool = False) -> None:
        super().__init__()
        self.model = model
        self.key = key
        self.cache = cache

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        kwargs = {self.key: inputs, "return_dict": True}
        if self.cache:
            kwargs["use_cache"] = False
        return self.model(**kwargs).last_hidden_state


SMALL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
}
VOCAB = 256


def _transformers(
    config_name: str, model_name: str, key: str = "input_ids", cache: bool = False, **config
) -> Callable[[], Built]:
    def build() -> Built:
        transformers = _library("transformers")
        settings = dict(config)
        made = getattr(transformers, config_name)(**settings)
        model = getattr(transformers, model_name)(made)
        return _Encoder(model, key, cache), _tokens(VOCAB)

    return build


def _called_once(build: Callable[[], Built]) -> Callable[[], Built]:
    """``build``, its model called once in eval mode: a model that writes to its weights on
    its first call (RWKV) then exports without the write, which no ExecuTorch program can make
    (composer.lower.export.parameters_written_error says so)."""

    def called() -> Built:
        model, inputs = build()
        with torch.no_grad():
            model.eval()(*inputs)
        return model, inputs

    return called


def _whisper_encoder() -> Built:
    transformers = _library("transformers")
    config = transformers.WhisperConfig(
        d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
        decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128,
        num_mel_bins=16, max_source_positions=32, vocab_size=VOCAB, pad_token_id=0,
        bos_token_id=0, eos_token_id=0, decoder_start_token_id=0,
    )  # fmt: skip
    encoder = transformers.models.whisper.modeling_whisper.WhisperEncoder(config)
    # 64 frames of 16 mel bins; the encoder's two convolutions halve them to its 32 positions.
    return _Encoder(encoder, "input_features"), (torch.randn(1, 16, 64),)


CORPUS: dict[str, Entry] = {
    # torchvision
    "resnet18": Entry("torchvision", _torchvision("resnet18"), "ResNet-18"),
    "mobilenet_v2": Entry("torchvision", _torchvision("mobilenet_v2"), "MobileNetV2"),
    "mobilenet_v3_small": Entry(
        "torchvision", _torchvision("mobilenet_v3_small"), "MobileNetV3 small (hardswish, SE)"
    ),
    "efficientnet_b0": Entry("torchvision", _torchvision("efficientnet_b0"), "EfficientNet-B0"),
    "shufflenet_v2": Entry(
        "torchvision", _torchvision("shufflenet_v2_x0_5"), "ShuffleNetV2 x0.5 (channel shuffle)"
    ),
    "squeezenet": Entry("torchvision", _torchvision("squeezenet1_0"), "SqueezeNet 1.0"),
    "regnet_x_400mf": Entry("torchvision", _torchvision("regnet_x_400mf"), "RegNetX-400MF"),
    "convnext_tiny": Entry("torchvision", _torchvision("convnext_tiny"), "ConvNeXt-T"),
    "mnasnet": Entry("torchvision", _torchvision("mnasnet0_5"), "MnasNet 0.5"),
    "ssdlite_head": Entry(
        "torchvision",
        _ssdlite,
        "SSDLite320 MobileNetV3 backbone and box/class heads",
        kind="detection",
    ),
    # timm
    "deit_tiny": Entry("timm", _timm("deit_tiny_patch16_224"), "DeiT-Tiny (ViT)"),
    "mobilevit_xxs": Entry("timm", _timm("mobilevit_xxs"), "MobileViT-XXS"),
    "convnext_atto": Entry("timm", _timm("convnext_atto", img_size=False), "ConvNeXt-atto"),
    # EfficientFormer (v1) L1 ignores img_size: its attention biases are for a 7x7 last stage,
    # so it needs 224x224 inputs (11M parameters, slow to lower): EfficientFormerV2 instead.
    "efficientformer_v2": Entry(
        "timm", _timm("efficientformerv2_s0"), "EfficientFormerV2-S0 (conv and attention)"
    ),
    "levit_128s": Entry("timm", _timm("levit_128s"), "LeViT-128S"),
    "ghostnet": Entry("timm", _timm("ghostnet_050", img_size=False), "GhostNet 0.5"),
    "lcnet": Entry("timm", _timm("lcnet_050", img_size=False), "PP-LCNet 0.5 (hardswish, SE)"),
    "mobilenetv4": Entry(
        "timm", _timm("mobilenetv4_conv_small", img_size=False), "MobileNetV4 conv small"
    ),
    # Ops XNNPACK declines in the bulk of the model: GroupNorm after every block; convolutions
    # whose weights are standardized at each call (not constants, which XNNPACK's conv needs).
    "poolformer_s12": Entry(
        "timm", _timm("poolformer_s12", img_size=False), "PoolFormer-S12 (GroupNorm, pooling mixer)"
    ),
    "nf_resnet26": Entry(
        "timm", _timm("nf_resnet26", img_size=False), "NF-ResNet-26 (weight-standardized convs)"
    ),
    # transformers, from small configs
    "bert": Entry(
        "transformers",
        _transformers("BertConfig", "BertModel", vocab_size=VOCAB, **SMALL),
        "BERT",
        kind="text",
    ),
    "gpt2": Entry(
        "transformers",
        _transformers(
            "GPT2Config",
            "GPT2Model",
            cache=True,
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=64,
            bos_token_id=0,
            eos_token_id=0,
        ),
        "GPT-2",
        kind="text",
    ),
    "llama": Entry(
        "transformers",
        _transformers(
            "LlamaConfig",
            "LlamaModel",
            cache=True,
            vocab_size=VOCAB,
            num_key_value_heads=2,
            max_position_embeddings=64,
            **SMALL,
        ),
        "Llama (GQA, RoPE, RMSNorm, SwiGLU)",
        kind="text",
    ),
    "t5_encoder": Entry(
        "transformers",
        _transformers(
            "T5Config",
            "T5EncoderModel",
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
        ),
        "T5 encoder (relative position bias)",
        kind="text",
    ),
    "whisper_encoder": Entry(
        "transformers",
        _whisper_encoder,
        "Whisper encoder (conv stem, log-mel input)",
        kind="speech",
    ),
    "rwkv": Entry(
        "transformers",
        _called_once(
            _transformers(
                "RwkvConfig",
                "RwkvModel",
                cache=True,
                vocab_size=VOCAB,
                hidden_size=64,
                num_hidden_layers=2,
                attention_hidden_size=64,
                intermediate_size=128,
                context_length=64,
            )
        ),
        "RWKV (recurrent: its CPU path loops over the tokens; called once before export, as "
        "composer's error asks, since its first eval call rescales its weights in place)",
        kind="recurrent",
    ),
    "mamba": Entry(
        "transformers",
        _transformers(
            "MambaConfig",
            "MambaModel",
            cache=True,
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            state_size=8,
            expand=2,
            conv_kernel=4,
        ),
        "Mamba (selective state space, reference scan)",
        kind="recurrent",
    ),
}


def names(library: str | None = None) -> list[str]:
    """The corpus's model names, in order; only those of ``library`` if given."""
    return [name for name, entry in CORPUS.items() if library in (None, entry.library)]


def load(name: str, seed: int = 0) -> Built:
    """A corpus model in eval mode with seeded random weights, and its example inputs."""
    if name not in CORPUS:
        near = did_you_mean(name, CORPUS)
        raise ModelError(f"no corpus model {name!r}; {near}choose one of: {', '.join(CORPUS)}.")
    torch.manual_seed(seed)
    model, inputs = CORPUS[name].build()
    _calibrate_batch_norm(model, inputs)
    return model.eval(), inputs


CALIBRATION_BATCH = 8
CALIBRATION_STEPS = 2


def _calibrate_batch_norm(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Give every batch norm the statistics of random inputs, as training would.

    A fresh batch norm assumes mean 0 and variance 1; with random weights the activations are
    far from that, and deep networks of them fade: untouched, MobileNetV2's outputs were about
    1e-9 and EfficientNet-B0's 1e-13, so any program "matched eager" within fp32's tolerance,
    a wrong one included. With the statistics of their own activations (a cumulative average
    over a few random batches), every model's outputs are of order 0.01 to 1.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms or not all(t.is_floating_point() for t in inputs):
        return
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average of every batch seen
    model.train()
    with torch.no_grad():
        for _ in range(CALIBRATION_STEPS):
            batch = [torch.randn((CALIBRATION_BATCH, *t.shape[1:]), dtype=t.dtype) for t in inputs]
            model(*batch)
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum


def quantized(
    name: str, calibration: int = 3, seed: int = 0, dynamic: bool = False
) -> torch.export.ExportedProgram:
    """A corpus model quantized the way ExecuTorch's XNNPACK guide does (PT2E,
    ``XNNPACKQuantizer`` per-channel symmetric, ``calibration`` random batches shaped like its
    inputs), exported again: the int8 program a phone would run. ``dynamic``: activations
    quantized at run time (the linears only: how transformer encoders are quantized for
    XNNPACK)."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    from composer.run.inputs import calibration_batches  # sympy: not at the corpus's import

    model, inputs = load(name, seed)
    quantizer = XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    )
    prepared = prepare_pt2e(torch.export.export(model, inputs).module(), quantizer)
    for batch in calibration_batches(inputs, calibration, seed):
        prepared(*batch)
    return torch.export.export(convert_pt2e(prepared), inputs)
