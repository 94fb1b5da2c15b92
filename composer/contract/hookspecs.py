"""The composer plugin contract: :class:`BackendPlugin` declares every hook, with its default.

A backend plugin is registered through the ``composer`` entry-point group::

    # pyproject.toml of your package
    [project.entry-points.composer]
    mybackend = "composer_mybackend.plugin"            # a module of @hookimpl functions
    mybackend = "composer_mybackend.plugin:plugin"     # or an instance of a BackendPlugin

It is written in either of two ways, which composer treats alike:

- a class deriving from :class:`BackendPlugin` (composer's own plugins are): override the hooks
  you answer, with the same names and arguments; no marker is needed on them, and every hook
  you leave alone gives the default its docstring states;
- a module (or any object) with functions marked ``@hookimpl`` (``from composer.hookspecs
  import hookimpl``) whose names are the hooks' names; a hook left out is the default.

composer asks a backend's hooks only of the plugin that declared that backend in
``composer_backends``, so a plugin that declares one backend need not check which backend
it is asked about. A plugin that declares several reads ``backend.name``. A hook
implementation may leave out arguments it does not use (pluggy passes only those it names).

Every hook but ``composer_backends`` is optional; a hook that is not implemented (or returns
``None``) falls back to the default documented on it. composer checks every answer (its type,
and what the hook's docstring says it must hold) and stops with a ``composer.PluginError``
naming the plugin when one breaks the contract.
"""

from __future__ import annotations

import abc
import difflib
import inspect
from typing import TYPE_CHECKING, Any, Self

import pluggy

from composer.contract.errors import PluginError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import torch
    from executorch.exir.backend.compile_spec_schema import CompileSpec
    from executorch.exir.backend.partitioner import Partitioner
    from torch.export import ExportedProgram
    from torch.fx.passes.operator_support import OperatorSupportBase
    from torchao.quantization.pt2e.quantizer import Quantizer

    from composer.contract.backend_spec import BackendSpec
    from composer.contract.options import Option
    from composer.contract.runtime import DelegateRuntime

PROJECT_NAME = "composer"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class _PluginClass(abc.ABCMeta):
    """ABCMeta, less ``spec`` for a class that declares its backends itself."""

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], **kwargs):
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        # The base is the last class of its kind in the MRO; a subclass that overrides its
        # composer_backends answers for its backends without one ``spec``.
        base = [k for k in cls.__mro__ if isinstance(k, _PluginClass)][-1]
        if cls is not base and cls.composer_backends is not base.composer_backends:
            cls.__abstractmethods__ = cls.__abstractmethods__ - {"spec"}
        return cls


class BackendPlugin(metaclass=_PluginClass):
    """A composer backend plugin as a class: the hooks, each with its default and what it answers.

    Derive from it, set ``spec`` (the one backend the plugin provides) and ``options`` (each
    ``composer.Option`` it takes), override ``composer_operator_support`` or
    ``composer_partitioner`` and the other hooks your backend answers, and register an instance
    under the ``composer`` entry-point group. An override needs no ``@hookimpl``: a subclass's
    method named after a hook is one, and a method named ``composer_*`` that is no hook is
    refused when the class is defined. A plugin of several backends overrides
    ``composer_backends`` (then it needs no ``spec``) and reads ``backend.name`` in the other
    hooks. A class without what it must give cannot be instantiated (``TypeError``).

    The methods below are also the hook specifications (``PluginManager.add_hookspecs``): a
    module of ``@hookimpl`` functions implements the same names with the same arguments, less
    ``self``.
    """

    options: tuple[Option, ...] = ()

    @property
    @abc.abstractmethod
    def spec(self) -> BackendSpec:
        """The :class:`composer.BackendSpec` of the one backend this plugin provides (a class
        attribute will do); ``composer_backends`` answers ``[spec]``."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for name, value in vars(cls).items():
            if name.startswith(PROJECT_NAME + "_") and name not in HOOKS:
                raise PluginError(unknown_hook_message(f"{cls.__qualname__}.{name}", name))
            if name in HOOKS and inspect.isfunction(value) and not hasattr(value, _IMPL):
                hookimpl(value)

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        missing = [_MUST_GIVE.get(name, name) for name in sorted(cls.__abstractmethods__)]
        if _only_default(cls, "composer_operator_support", "composer_partitioner"):
            missing.append(_MUST_GIVE["support"])
        if missing:
            raise TypeError(
                f"{cls.__qualname__} cannot be instantiated: it must give {'; and '.join(missing)}."
            )
        return super().__new__(cls)

    def checked_options(self, options: Mapping[str, str] | None) -> dict[str, str]:
        """``options`` checked against ``self.options``, defaults filled in: hooks reached
        without composer's own check (``composer.partitioner(name, ...)``) check them too."""
        from composer.contract.options import check_options

        return check_options(self.spec.name, self.options, options)

    @hookspec
    @hookimpl
    def composer_backends(self) -> list[BackendSpec]:
        """Return the backends this plugin provides.

        Each is a :class:`composer.BackendSpec`: the name users put in a priority list
        (``"mybackend"``), the ExecuTorch backend id (the class name of your
        ``BackendDetails`` subclass, which must be imported by the time lowering runs, so
        import it in your plugin module), the device the delegate runs on (``"cpu"``,
        ``"cuda"`` or ``"mps"``; crossings between devices are counted in the plan), the
        smallest partition worth delegating, and a one-line description.

        Two plugins declaring one name: the first in load order (composer's own plugins, then
        the others sorted by distribution and entry-point name) keeps it, and a warning names
        both.

        Default (a :class:`BackendPlugin`): ``[self.spec]``. A module of hook functions must
        implement it.
        """
        return [self.spec]

    @hookspec(firstresult=True)
    @hookimpl
    def composer_options(self, backend: BackendSpec) -> list[Option] | None:
        """Declare the options ``backend`` takes, as a list of :class:`composer.Option`.

        Users set them as ``options={"mybackend": {"precision": "fp16"}}`` in Python, as
        ``--option mybackend.precision=fp16`` on the command line, or under
        ``[tool.composer.options.mybackend]`` in the config. composer checks them once, before
        any work: a name you did not declare, or a value outside an option's ``choices``, is a
        ``composer.ComposerError`` (exit 2) that lists your options or the allowed values. A
        value matching a choice in another case is passed on as the choice is spelt here
        (``off`` -> ``OFF``). Your other hooks then get ``options``: every value the user gave,
        as a string, plus the ``default`` of each option left unset (options with no default
        are then absent)::

            @hookimpl
            def composer_options(backend):
                return [
                    composer.Option("precision", choices=("fp32", "fp16"), default="fp32",
                                    help="the precision the delegate computes in"),
                    composer.Option("device_id", help="which device, when there are several"),
                ]

        Not implemented, or ``None``: the backend takes no options, and any option given for it
        is an error. ``composer backends`` lists each backend's options with their help.

        Default (a :class:`BackendPlugin`): the class's ``options``.
        """
        return list(self.options)

    @hookspec(firstresult=True)
    @hookimpl
    def composer_operator_support(
        self, backend: BackendSpec, program: ExportedProgram, options: Mapping[str, str]
    ) -> OperatorSupportBase | None:
        """Say which nodes of ``program`` (an edge-dialect program) ``backend`` can take.

        Return a :class:`composer.ExplainedSupport` (or any
        ``torch.fx.passes.operator_support.OperatorSupportBase``) whose
        ``is_node_supported(submodules, node)`` answers for one ``call_function`` node. composer
        never offers a node an earlier backend lowered (``executorch_call_delegate`` and its
        ``getitem`` users), nor placeholders and outputs: answer only for the op itself.
        composer groups the supported nodes into maximal convex partitions of at least
        ``backend.min_partition_size`` nodes, and brings along the constants that only those
        partitions read.

        ``ExplainedSupport`` declares the two further questions composer asks, with their
        defaults: ``reason_unsupported(node)``, why a node is declined (the plan shows it;
        otherwise "unsupported op"), and ``reason_unsupported_at_boundary(node, partition)``, why
        your runtime cannot bind a tensor at a delegate's edge (OpenVINO's cannot take a 0-d
        tensor; composer then leaves nodes out of the partition until no refused tensor crosses
        its edge, and the plan says why for each). A plain ``OperatorSupportBase`` defining
        methods of those names is asked the same.

        ``options`` are the user's options for this backend (``compose(..., options={"name":
        {...}})``), strings by name, already checked against what ``composer_options`` declares
        and with its defaults filled in; an empty mapping when the backend has none.

        Return ``None`` to use ``composer_partitioner`` instead. A backend must implement one of
        the two.
        """
        return None

    @hookspec(firstresult=True)
    @hookimpl
    def composer_partitioner(
        self, backend: BackendSpec, program: ExportedProgram
    ) -> Partitioner | None:
        """Return a native ExecuTorch ``Partitioner`` that decides what ``backend`` takes.

        Use this to reuse an existing partitioner (``XnnpackPartitioner``). composer runs it
        on the very program it is partitioning (earlier backends' delegates already in it), reads
        the nodes it tagged, takes those tags off again and re-forms the nodes into convex
        partitions: tags it put on earlier delegates, graph inputs or outputs are removed with
        a warning that names your plugin, and a non-convex tag is split. Constants it tagged
        stay with it (duplicated where another backend reads them too; the plan counts the
        bytes). The compile specs of its ``DelegationSpec`` are used unless
        ``composer_compile_specs`` answers. A partitioner with a ``reason_unsupported(node)``
        method is asked why it left a node untagged, as an ``ExplainedSupport`` is (the plan
        shows its answer; ``None``: "not tagged by" the partitioner's class).

        Only consulted when ``composer_operator_support`` returns ``None``.
        """
        return None

    @hookspec(firstresult=True)
    @hookimpl
    def composer_compile_specs(
        self, backend: BackendSpec, method_name: str, options: Mapping[str, str]
    ) -> list[CompileSpec] | None:
        """Return the ExecuTorch ``CompileSpec`` list handed to ``backend``'s ``preprocess``.

        ``method_name`` is the program method being lowered (``"forward"``); ``options`` as in
        ``composer_operator_support``. ``None`` means no compile specs (or those of the native
        partitioner, when there is one).
        """
        return None

    @hookspec(firstresult=True)
    @hookimpl
    def composer_ops_to_not_decompose(
        self, backend: BackendSpec, program: ExportedProgram, options: Mapping[str, str]
    ) -> list[torch._ops.OpOverload] | None:
        """Return the ATen ops ``backend`` wants to see whole, not decomposed, in the edge program.

        ``program`` is the ATen-dialect program before decomposition; ``options`` as in
        ``composer_operator_support``. Backends are asked in
        priority order and every answer is honoured, so an op one backend keeps whole is whole
        for the backends after it too. ``None``: the native partitioner's answer, if any, else
        nothing.
        """
        return None

    @hookspec(firstresult=True)
    @hookimpl
    def composer_rewrites(
        self, backend: BackendSpec, options: Mapping[str, str]
    ) -> list[Callable[[torch.fx.GraphModule], Any]] | None:
        """Return passes that rewrite ops ``backend`` declines into equal forms it takes.

        Each is an ExecuTorch pass (an ``executorch.exir.pass_base.ExportPass``, or any callable
        on a ``GraphModule`` returning a ``PassResult``), run on the edge program before any
        backend partitions it. Rewrite only what your backend would otherwise decline, and only
        into what it takes: composer proves the rewritten program against eager like any other,
        so a wrong rewrite is caught, but a needless one costs the backends after yours their
        own form of the op. Only the first backend of a stack is asked: a backend ahead of
        yours takes the op as it is. ``options`` as in ``composer_operator_support``. ``None``:
        no rewrites.

        CUDA's (``composer.plugins.cuda``) writes a dilated convolution, which AOTInductor's
        Triton templates refuse, as a sum of undilated ones over shifted slices.
        """
        return None

    @hookspec(firstresult=True)
    @hookimpl
    def composer_quantizer(
        self, backend: BackendSpec, options: Mapping[str, str]
    ) -> Quantizer | None:
        """Return the PT2E ``Quantizer`` whose integer ops ``backend``'s kernels run.

        ``composer.quantize(model, stack, inputs)`` plans the stack on the float model first, then
        asks each backend of the stack for its quantizer and lets it annotate only the nodes that
        backend will take (an annotation it puts on another backend's node is taken off): an int8
        backend's regions are quantized for it, the regions of a backend without a quantizer stay
        float. Return a fresh object each call, configured as your backend wants it::

            @hookimpl
            def composer_quantizer(backend):
                quantizer = XNNPACKQuantizer()
                return quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))

        It annotates the graph of ``torch.export.export(model, inputs).module(check_guards=False)``
        (no guard submodule: Arm's passes refuse ``call_module``), as
        ``torchao.quantization.pt2e.prepare_pt2e`` hands it over; the weights are then stored
        quantized (``convert_pt2e``'s default). ``options`` as in ``composer_operator_support``.
        Not implemented, or ``None``: the backend runs float.
        """
        return None

    @hookspec(firstresult=True)
    @hookimpl
    def composer_unavailable_reason(self, backend: BackendSpec) -> str | None:
        """Say why ``backend`` cannot lower on this machine, or ``None`` if it can.

        Answer with a short reason a user can act on (``"no CUDA device visible"``). Planning
        still works: composer then partitions exactly as it would on the target but lowers with
        a stand-in, so the plan on a laptop is the plan on the target. ``compose`` refuses such
        a backend with this reason.
        """
        return None

    @hookspec(firstresult=True)
    @hookimpl
    def composer_runtime(self, backend: BackendSpec) -> DelegateRuntime | None:
        """Return the :class:`composer.DelegateRuntime` that runs ``backend``'s delegates here.

        This is the runtime half of a backend (ExecuTorch's ``BackendInterface``): composer
        proves every program it writes by running it, and a delegate runs only where some
        runtime has its backend. Give one, and composer runs each of your delegates alone on the
        operands eager computes for it and judges it against its subgraph in float64 (a wrong
        op is found and moved off your backend), and runs a program no single runtime here runs
        whole piece by piece: your delegates in your runtime, the others in theirs, what lies
        between them in Python. The proof line names your runtime. A minimal one::

            class MyRuntime(composer.DelegateRuntime):
                name = "my driver"

                def load(self, delegate):
                    engine = my_driver.load(delegate.processed_bytes)
                    return lambda operands: engine.run([t.numpy() for t in operands])

            @hookimpl
            def composer_runtime(backend):
                return MyRuntime()

        Return a fresh or a shared object; composer asks once per process. ``None`` (the
        default): the ExecuTorch runtime installed here runs your delegates where its build
        registers your backend id (the pip wheel has XNNPACK and OpenVINO); elsewhere they are
        not run, and the proof says the program was not proven here.
        """
        return None


# The hooks' names, and the attribute pluggy's marker puts on an implementation.
HOOKS = frozenset(name for name in vars(BackendPlugin) if name.startswith(PROJECT_NAME + "_"))
_IMPL = PROJECT_NAME + "_impl"
# What a BackendPlugin subclass must give, as its TypeError says it.
_MUST_GIVE = {
    "spec": "a spec (the BackendSpec of its backend; or override composer_backends)",
    "support": "what its backend takes (override composer_operator_support or "
    "composer_partitioner)",
}


def _only_default(cls: type, *hooks: str) -> bool:
    """Whether ``cls`` leaves every one of ``hooks`` to :class:`BackendPlugin`'s default."""
    return all(getattr(cls, hook) is getattr(BackendPlugin, hook) for hook in hooks)


def unknown_hook_message(where: str, name: str) -> str:
    """Why ``name`` (``where``: the class's method, the plugin's function) is refused: it is
    named like a hook but is none, so composer would never call it."""
    near = difflib.get_close_matches(name, sorted(HOOKS), n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    return (
        f"{where} is named like a composer hook but there is no hook {name}: {hint}"
        f"the hooks are {', '.join(sorted(HOOKS))}. Rename it, or leave the composer_ prefix "
        "to hooks."
    )
