"""What composer holds in memory while it proves a program and after its user is done with it:
a long process (a worker of ExecuTorch's test suite, a sweep) composes many models."""

from __future__ import annotations

import gc
import weakref

import torch

import composer
from composer.run.verification import expected_outputs


def _exported() -> torch.export.ExportedProgram:
    return torch.export.export(
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval(),
        (torch.randn(4, 8),),
        dynamic_shapes=({0: torch.export.Dim("rows", min=2, max=16)},),
    )


def _live_parameters() -> int:
    return sum(isinstance(o, torch.nn.Parameter) for o in gc.get_objects())


def test_a_proofs_copies_of_the_model_are_freed_size_by_size():
    """Each size's float32 and float64 copies of an exported model are reference cycles: left to
    the collector, a proof at four sizes held all their weights (vgg11 at dynamic sizes: 9.0 GB
    at its peak beside plain ExecuTorch's 3.2 GB; 4.8 GB freed size by size). The collector is
    off here, so the weights of the copies the proof drops stay counted unless it frees them."""
    composition = composer.compose(_exported(), "xnnpack", cache=False, check=False)
    gc.collect()
    gc.disable()
    try:
        before = _live_parameters()
        for rows in (2, 9, 16):
            expected = expected_outputs(composition, (torch.randn(rows, 8),))
            assert expected.truth is not None  # the float64 copy ran
        after = _live_parameters()
    finally:
        gc.enable()
    assert after == before


def test_a_program_its_user_dropped_is_not_kept_alive_by_composer():
    """composer keeps torch.export's bytes of the last programs it composed (a repair lowers a
    copy read back from them); it kept up to 8 of the programs too, weights and all (a worker of
    the suite, composing vgg11 after other torchvision models, was killed by the OOM killer at
    15.3 GB)."""
    program = _exported()
    composer.compose(program, "xnnpack", cache=False, check=False)
    dropped = weakref.ref(program)
    del program
    gc.collect()
    assert dropped() is None
