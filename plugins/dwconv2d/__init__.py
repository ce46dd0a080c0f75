"""DWConv2D: grouped 2-D convolution with a runtime (optionally per-sample) kernel.

The ONNX side lives here (:mod:`.onnx_op`: node builder, validation, Conv <-> DWConv2D rewrites,
INT8 plugin pattern); the op inside onnxruntime (:mod:`.ort_op`: numpy reference on the CPU,
the plugin's CUDA kernels on the GPU); the TensorRT plugin (IPluginV3) and its CUDA kernels are
built from the C++ sources in this folder.

Importing this package registers the op with the core (:mod:`quantbench.model.customops`), which
then checks and runs models holding it (the core names this package only in
``customops.BUNDLED``, to import it when a model holds a DWConv2D node), and, where
onnxruntime-extensions is installed, declares the op to it, so that a session registering
``onnxruntime_extensions.get_library_path()`` runs the model's run form
(:func:`onnxruntime_form`; or simply :func:`make_session`).
"""

from quantbench.model import customops
from quantbench.model.customops import CustomOp, OpRuntime
from quantbench.plugins.dwconv2d import ort_op
from quantbench.plugins.dwconv2d.onnx_op import (
    ATTRIBUTES,
    DEFAULT_DOMAIN,
    NOT_INT8,
    OP_TYPE,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    DWConv2DSpec,
    checkable_copy,
    conv_to_dwconv2d,
    dwconv2d_int8_pattern,
    dwconv2d_to_conv,
    is_dwconv2d,
    make_dwconv2d_node,
    validate_dwconv2d,
)
from quantbench.plugins.dwconv2d.ort_op import (
    PluginSession,
    make_session,
    onnxruntime_form,
    session_options,
)

ort_op.declare()
customops.register(
    CustomOp(
        OP_TYPE,
        checkable=checkable_copy,
        lowered=dwconv2d_to_conv,
        runtime=OpRuntime(
            missing=ort_op.extension_missing,
            rewrite=ort_op.onnxruntime_form,
            register=ort_op.register_library,
            take_errors=ort_op.take_errors,
        ),
    )
)

__all__ = [
    "ATTRIBUTES",
    "DEFAULT_DOMAIN",
    "NOT_INT8",
    "OP_TYPE",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "DWConv2DSpec",
    "PluginSession",
    "checkable_copy",
    "conv_to_dwconv2d",
    "dwconv2d_int8_pattern",
    "dwconv2d_to_conv",
    "is_dwconv2d",
    "make_dwconv2d_node",
    "make_session",
    "onnxruntime_form",
    "session_options",
    "validate_dwconv2d",
]
