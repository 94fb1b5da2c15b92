"""The ``tensorrt_stub`` backend: the ops a TensorRT engine converts, lowered to a stand-in.

Its delegate blob describes the subgraph (ops, input and output shapes and dtypes); it does
not run in the ExecuTorch runtime, so compositions using it verify through the Python
reference run.
"""

from __future__ import annotations

from composer.contract.backend_spec import BackendSpec
from composer.contract.hookspecs import BackendPlugin


class TensorRTStubPlugin(BackendPlugin):
    spec = BackendSpec(
        name="tensorrt_stub",
        # By name: importing the class imports ExecuTorch, which a cache hit does without.
        backend_id="TensorRTStubBackend",
        device="cuda",
        min_partition_size=2,
        description="a stand-in for TensorRT's ops, whose delegates run nowhere",
    )

    def composer_operator_support(self, backend, program):
        # ExecuTorch finds the backend class by name when it lowers: it must be imported then.
        from composer.plugins.tensorrt_stub.backend import TensorRTStubBackend  # noqa: F401
        from composer.plugins.tensorrt_stub.support import TensorRTOperatorSupport

        return TensorRTOperatorSupport()


plugin = TensorRTStubPlugin()
