"""OpenVINO delegate blobs made reproducible: the same subgraph gives the same bytes.

ExecuTorch's ``OpenvinoBackend.preprocess`` returns OpenVINO's ``CompiledModel.export_model()``.
For the CPU plugin (OpenVINO 2025.4) that is ``ov::pass::StreamSerialize``'s layout: a header
of six little-endian uint64 (custom data offset and size, constants offset and size, model
offset and size), the sections, and the model as IR XML obscured by the CPU plugin's
``codec_xor``. The XML names every node OpenVINO made without a name ``<Type>_<instance id>``
(``Multiply_3692``, ``Constant_19``) and the model ``Model<id>``, from process-wide counters
that every conversion and compilation advances: the second compose of one model in a process
had other names, other lengths, other bytes. Renumbering those names in order of first
appearance changes no node, edge or constant, so the program computes the same.
"""

from __future__ import annotations

import dataclasses
import re
import struct

_HEADER = struct.Struct("<6Q")
# The CPU plugin's codec_xor key (src/plugins/intel_cpu/src/utils/codec_xor.cpp).
_CODEC_KEY = bytes([0x30, 0x60, 0x70, 0x02, 0x04, 0x08, 0x3F, 0x6F, 0x72, 0x74, 0x78, 0x7F])
_XML_START = b"<?xml"
# An automatic node name: an op type (CamelCase) and an instance id, not inside another word.
_AUTO_NAME = re.compile(rb"(?<![A-Za-z0-9])([A-Z][A-Za-z0-9]*)_(\d+)(?![0-9])")
_MODEL_NAME = re.compile(rb'(<net name=")Model\d+(")')


def _codec_xor(data: bytes) -> bytes:
    """The CPU plugin's codec: XOR with a 12-byte key, its own inverse."""
    key = (_CODEC_KEY * (len(data) // len(_CODEC_KEY) + 1))[: len(data)]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(
        len(data), "little"
    )


def renumbered(xml: bytes) -> bytes:
    """``xml`` with automatic node names numbered 0, 1, ... in order of first appearance, and
    the model named ``Model0``: one distinct number per distinct name, so no two meet."""
    numbers: dict[bytes, int] = {}

    def number(match: re.Match[bytes]) -> bytes:
        index = numbers.setdefault(match.group(0), len(numbers))
        return match.group(1) + b"_" + str(index).encode()

    return _MODEL_NAME.sub(rb"\g<1>Model0\g<2>", _AUTO_NAME.sub(number, xml))


def normalized(blob: bytes) -> bytes:
    """``blob`` (an exported CPU CompiledModel) with reproducible names; any other layout is
    returned as it is (another device's or OpenVINO version's: the determinism test tells)."""
    if len(blob) < _HEADER.size:
        return blob
    custom_at, custom_size, consts_at, consts_size, model_at, model_size = _HEADER.unpack_from(blob)
    contiguous = (
        custom_at == _HEADER.size
        and consts_at == custom_at + custom_size
        and model_at == consts_at + consts_size
        and model_at + model_size == len(blob)
    )
    xml = _codec_xor(blob[model_at:]) if contiguous else b""
    if not xml.startswith(_XML_START):
        return blob
    model = _codec_xor(renumbered(xml))
    header = _HEADER.pack(custom_at, custom_size, consts_at, consts_size, model_at, len(model))
    return header + blob[_HEADER.size : model_at] + model


def make_preprocess_reproducible() -> None:
    """Have ExecuTorch's ``OpenvinoBackend.preprocess`` return :func:`normalized` bytes, once
    per process. ExecuTorch finds a backend's class by its name, and the runtime by the same
    name, so the class itself is wrapped rather than replaced."""
    from executorch.backends.openvino.preprocess import OpenvinoBackend

    if getattr(OpenvinoBackend.preprocess, _WRAPPED, False):
        return
    compile_and_export = OpenvinoBackend.preprocess.__func__

    def preprocess(cls, edge_program, module_compile_spec):
        result = compile_and_export(cls, edge_program, module_compile_spec)
        return dataclasses.replace(result, processed_bytes=normalized(result.processed_bytes))

    setattr(preprocess, _WRAPPED, True)
    OpenvinoBackend.preprocess = classmethod(preprocess)


_WRAPPED = "_composer_reproducible"
