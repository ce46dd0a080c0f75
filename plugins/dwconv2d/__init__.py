"""DWConv2D: grouped 2-D convolution with a runtime (optionally per-sample) kernel.

The ONNX side lives here (:mod:`.onnx_op`: node builder, validation, Conv <-> DWConv2D rewrites,
INT8 plugin pattern); the TensorRT plugin (IPluginV3) and its CUDA kernels are built from the
C++ sources in this folder.

Importing this package registers the op with the core (:mod:`quantbench.model.customops`), which
then checks and runs models holding it (the core names this package only in
``customops.BUNDLED``, to import it when a model holds a DWConv2D node).
"""

from quantbench.model import customops
from quantbench.model.customops import CustomOp
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

customops.register(CustomOp(OP_TYPE, checkable=checkable_copy, lowered=dwconv2d_to_conv))

__all__ = [
    "ATTRIBUTES",
    "DEFAULT_DOMAIN",
    "NOT_INT8",
    "OP_TYPE",
    "PLUGIN_NAMESPACE",
    "PLUGIN_VERSION",
    "DWConv2DSpec",
    "checkable_copy",
    "conv_to_dwconv2d",
    "dwconv2d_int8_pattern",
    "dwconv2d_to_conv",
    "is_dwconv2d",
    "make_dwconv2d_node",
    "validate_dwconv2d",
]
