/*
 * DWConv2D TensorRT plugin: 2-D convolution whose weights (and bias) are runtime tensors.
 *
 * Written against the TensorRT 10.x public headers (NvInferRuntime.h, NvInferPluginBase.h); the
 * IPluginV3 / IPluginV3One{Core,Build,Runtime} / IPluginCreatorV3One declarations it overrides are
 * identical from 10.0 to 10.16 (and in 11.1). TensorRT cannot be installed in the workplace where
 * this was written, so it has NOT been built or run inside TensorRT: it was compiled only against
 * the public headers, and its calls were exercised by tests/gpu/plugin_harness.cpp, which plays
 * TensorRT's part (see README.md, "What has been verified").
 *
 * ONNX contract (what onnx_op.py emits; the ONNX parser's fallback importer maps the node):
 *   op_type "DWConv2D", attribute plugin_namespace "quantbench", plugin_version "1".
 *   inputs:  X [N, C, H, W]; W [K, C/group, kH, kW] or [N, K, C/group, kH, kW];
 *            optional B [K] or [N, K] (omit the input rather than passing an empty name).
 *   fields:  strides (2 ints, default 1 1), pads (4 ints: top, left, bottom, right; default 0),
 *            dilations (2 ints, default 1 1), group (int, default 1),
 *            input_scale, weight_scale, output_scale (floats, default -1).
 *   output:  Y [N, K, Ho, Wo], Ho = floor((H + pad_top + pad_bottom - dil_h*(kH-1) - 1)/stride_h) + 1.
 *
 * Precision (decided by the scale fields, so strongly typed networks know every type up front):
 *   input_scale <= 0 and weight_scale <= 0: X, W, B and Y are all FP32 or all FP16.
 *   input_scale > 0 and weight_scale > 0 (INT8, explicit quantization): X and W INT8 (symmetric,
 *     per tensor), B FP32 in real units, Y INT8 when output_scale > 0 (requantized with it), else
 *     FP32. The scales come from these fields, not from PluginTensorDesc::scale.
 *
 * Registration: the library exports getCreators() and setLoggerFinder(), the entry points that
 * IPluginRegistry::loadLibrary, trtexec --dynamicPlugins / --staticPlugins and the Python
 * registry.load_library look up. It does not use REGISTER_TENSORRT_PLUGIN (loadLibrary refuses a
 * library whose creators are already registered) and does not link libnvinfer.
 */
#ifndef QUANTBENCH_DWCONV2D_PLUGIN_H
#define QUANTBENCH_DWCONV2D_PLUGIN_H

#include <NvInferRuntime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dwconv2d.h"

namespace quantbench
{
namespace plugin
{

constexpr char const* kDWConv2DPluginName = "DWConv2D";
constexpr char const* kDWConv2DPluginVersion = "1";
constexpr char const* kDWConv2DPluginNamespace = "quantbench";

//! The plugin's fields: ONNX attributes of the DWConv2D node, and what is serialized in engines.
struct DWConv2DAttributes
{
    int32_t strides[2]{1, 1};
    int32_t pads[4]{0, 0, 0, 0}; // top, left, bottom, right (ONNX order)
    int32_t dilations[2]{1, 1};
    int32_t group{1};
    float inputScale{-1.0F};
    float weightScale{-1.0F};
    float outputScale{-1.0F};

    bool isInt8() const noexcept
    {
        return inputScale > 0.0F && weightScale > 0.0F;
    }
    bool hasInt8Output() const noexcept
    {
        return isInt8() && outputScale > 0.0F;
    }
    //! Empty when the attributes are usable, else what is wrong with them.
    std::string check() const;
};

class DWConv2DPlugin : public nvinfer1::IPluginV3,
                       public nvinfer1::IPluginV3OneCore,
                       public nvinfer1::IPluginV3OneBuild,
                       public nvinfer1::IPluginV3OneRuntime
{
public:
    explicit DWConv2DPlugin(DWConv2DAttributes const& attributes);
    DWConv2DPlugin(DWConv2DPlugin const& other);
    DWConv2DPlugin& operator=(DWConv2DPlugin const&) = delete;
    ~DWConv2DPlugin() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

    DWConv2DAttributes const& attributes() const noexcept
    {
        return mAttributes;
    }

private:
    DWConv2DAttributes mAttributes;
    DWConv2DParams mParams{}; // set by onShapeChange for the shapes enqueue will see
    int32_t mNbInputs{0};     // 0 until onShapeChange succeeded
    std::vector<nvinfer1::PluginField> mSerializedFields;
    nvinfer1::PluginFieldCollection mSerializedCollection{};
};

class DWConv2DPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    DWConv2DPluginCreator();
    ~DWConv2DPluginCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFieldNames;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

//! Parse a field collection (from the ONNX parser, an application, or an engine) into attributes.
//! Returns an empty string on success, else the reason it failed.
std::string parseAttributes(nvinfer1::PluginFieldCollection const* fc, DWConv2DAttributes* attributes);

} // namespace plugin
} // namespace quantbench

#if defined(_WIN32)
#define DWCONV2D_PLUGIN_API __declspec(dllexport)
#else
#define DWCONV2D_PLUGIN_API __attribute__((visibility("default")))
#endif

//! Entry points TensorRT looks up in a plugin library (see the header comment).
extern "C" DWCONV2D_PLUGIN_API nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);
extern "C" DWCONV2D_PLUGIN_API void setLoggerFinder(nvinfer1::ILoggerFinder* finder);

#endif // QUANTBENCH_DWCONV2D_PLUGIN_H
