"""The ``mlx`` backend: ExecuTorch's MLX delegate (Apple silicon, through Apple's MLX).

Its partitioner and serialization are Python, but ExecuTorch 1.5.1's wheel leaves out the
serialization code MLX generates from its schema at install time
(``executorch/backends/mlx/serialization/mlx_graph_schema.py``), so ``executorch.backends.mlx``
does not import: the backend neither plans nor lowers here, and says so. An ExecuTorch
installed from source (``python install_executorch.py``) has the file; then support is
``MLXPartitioner``'s own and MLX lowers on any machine, its programs running on Apple silicon.
"""

from __future__ import annotations

from composer.contract.backend_spec import BackendSpec
from composer.plugins.native import NativePartitionerPlugin


class MlxPlugin(NativePartitionerPlugin):
    spec = BackendSpec(
        name="mlx",
        backend_id="MLXBackend",
        device="mps",
        min_partition_size=1,
        description="MLX: Apple silicon, through Apple's MLX",
    )
    module = "executorch.backends.mlx.partitioner"
    missing = (
        "ExecuTorch 1.5.1's wheel lacks MLX's generated serialization code "
        "(backends/mlx/serialization/mlx_graph_schema.py); an ExecuTorch installed from "
        "source (python install_executorch.py) has it"
    )

    def partitioner(self):
        from executorch.backends.mlx.partitioner import MLXPartitioner

        return MLXPartitioner()


plugin = MlxPlugin()
