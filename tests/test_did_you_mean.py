"""A misspelt name gets the nearest right one: backends, zoo and corpus models, backend options,
commands, flags and their choices, on the command line (one line, exit 2) and in Python; and
the command line's errors name what to type there, not a Python call."""

from __future__ import annotations

import pytest

import composer
from composer.cli import main
from composer.registry.resolved import resolve_stack

PLAN = ["plan", "zoo:mlp", "--backends", "xnnpack"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "zoo:mlp", "--backends", "xnnpak"],
         "unknown backend 'xnnpak'; did you mean xnnpack? Known backends: "),
        (["plan", "zoo:mlp", "--backends", "OpenVINO,xnnpack"],
         "unknown backend 'OpenVINO'; did you mean openvino? Known backends: "),
        (["plan", "zoo:mpl", "--backends", "xnnpack"],
         "no zoo model 'mpl'; did you mean mlp? choose one of: "),
        (["plan", "corpus:resnet81", "--backends", "xnnpack"],
         "no corpus model 'resnet81'; did you mean resnet18? choose one of: "),
        (["plan", "mlp", "--backends", "xnnpack"],
         "cannot tell what model 'mlp' is: did you mean zoo:mlp? "),
        (["plan", "zoo:mlp", "--backends", "cuda", "--option", "cuda.max_autotun=OFF"],
         "unknown option 'max_autotun' for backend 'cuda'; did you mean max_autotune? known: "),
        (["backends", "cdua"], "unknown backend 'cdua'; did you mean cuda? "),
        ([*PLAN, "--backens", "xnnpack"],
         "unrecognized arguments: --backens xnnpack; did you mean --backends? (see composer plan"),
        ([*PLAN, "--placment=strict"], "did you mean --placement? (see composer plan --help)"),
        ([*PLAN, "--placement", "measure"],
         "(choose from 'priority', 'strict', 'measured'); did you mean measured? (see composer"),
        (["lowr", "zoo:mlp"], "invalid choice: 'lowr' (choose from 'backends', "),
        (["cache", "clean"], "did you mean clear? (see composer cache --help)"),
    ],
)  # fmt: skip
def test_a_misspelt_name_gets_the_nearest_one_in_one_line(capsys, tmp_path, monkeypatch, argv,
                                                          message):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("composer: error: ") and err.count("\n") == 1, err
    assert message in err
    if argv[0] == "lowr":
        assert "; did you mean lower? (see composer --help)" in err
    assert list(tmp_path.iterdir()) == []


def test_nothing_near_is_offered_nothing(capsys):
    assert main(["plan", "zoo:mlp", "--backends", "zzzz"]) == 2
    assert "unknown backend 'zzzz'. Known backends: " in capsys.readouterr().err


def test_python_gets_the_same_hint():
    with pytest.raises(composer.BackendListError, match="did you mean tensorrt_stub?"):
        composer.default_registry().resolve("tensorrt")


def test_a_backend_that_cannot_lower_here_names_the_plan_as_the_user_would_ask_for_it(capsys):
    # ExecuTorch's wheel has no MPS backend: it lowers nowhere a pip install reaches.
    with pytest.raises(composer.BackendListError, match=r"Run composer\.plan\(\) here"):
        resolve_stack(composer.Stack(["mps", "xnnpack"]))
    assert main(["lower", "zoo:mlp", "--backends", "mps,xnnpack", "-o", "never.pte"]) == 2
    err = capsys.readouterr().err
    assert "cannot lower on this machine" in err
    assert "Run `composer plan` with these arguments here for the plan" in err
    assert "composer.plan()" not in err
