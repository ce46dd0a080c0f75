// DWConv2D TensorRT plugin (IPluginV3). See DWConv2DPlugin.h for the contract and for what has and
// has not been verified: written against the TensorRT 10.x headers, not built inside TensorRT here.

#include "DWConv2DPlugin.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <sstream>

using nvinfer1::DataType;
using nvinfer1::DimensionOperation;
using nvinfer1::DimsExprs;
using nvinfer1::DynamicPluginTensorDesc;
using nvinfer1::IDimensionExpr;
using nvinfer1::IExprBuilder;
using nvinfer1::ILogger;
using nvinfer1::IPluginCapability;
using nvinfer1::IPluginV3;
using nvinfer1::PluginCapabilityType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;
using nvinfer1::PluginTensorDesc;
using nvinfer1::TensorFormat;

namespace quantbench
{
namespace plugin
{
namespace
{

// ---------------------------------------------------------------------------------------------
// Logging through the ILogger TensorRT hands over with setLoggerFinder(), else stderr.
// ---------------------------------------------------------------------------------------------

std::mutex gLoggerMutex;
nvinfer1::ILoggerFinder* gLoggerFinder{nullptr};

void logMessage(ILogger::Severity severity, std::string const& message) noexcept
{
    try
    {
        std::string const text = std::string("DWConv2D plugin: ") + message;
        ILogger* logger{nullptr};
        {
            std::lock_guard<std::mutex> lock(gLoggerMutex);
            if (gLoggerFinder != nullptr)
            {
                logger = gLoggerFinder->findLogger();
            }
        }
        if (logger != nullptr)
        {
            logger->log(severity, text.c_str());
        }
        else
        {
            std::fprintf(stderr, "%s\n", text.c_str());
        }
    }
    catch (...)
    {
        // Logging must never throw across the TensorRT ABI.
    }
}

void logError(std::string const& message) noexcept
{
    logMessage(ILogger::Severity::kERROR, message);
}

// ---------------------------------------------------------------------------------------------
// Fields
// ---------------------------------------------------------------------------------------------

constexpr char const* kStrides = "strides";
constexpr char const* kPads = "pads";
constexpr char const* kDilations = "dilations";
constexpr char const* kGroup = "group";
constexpr char const* kInputScale = "input_scale";
constexpr char const* kWeightScale = "weight_scale";
constexpr char const* kOutputScale = "output_scale";

// The ONNX parser sends INT/INTS as kINT32 and FLOAT/FLOATS as kFLOAT32; applications building
// PluginFields from Python often use int64 / float64, which are accepted too.
std::string readInts(PluginField const& field, int32_t expected, int32_t* out)
{
    if (field.length != expected || field.data == nullptr)
    {
        std::ostringstream msg;
        msg << "field '" << field.name << "' needs " << expected << " integer(s), got " << field.length;
        return msg.str();
    }
    for (int32_t i = 0; i < expected; ++i)
    {
        int64_t value{0};
        if (field.type == PluginFieldType::kINT32)
        {
            value = static_cast<int32_t const*>(field.data)[i];
        }
        else if (field.type == PluginFieldType::kINT64)
        {
            value = static_cast<int64_t const*>(field.data)[i];
        }
        else
        {
            return std::string("field '") + field.name + "' must be INT32 or INT64";
        }
        if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max())
        {
            return std::string("field '") + field.name + "' is out of the int32 range";
        }
        out[i] = static_cast<int32_t>(value);
    }
    return {};
}

std::string readFloat(PluginField const& field, float* out)
{
    if (field.length != 1 || field.data == nullptr)
    {
        return std::string("field '") + field.name + "' needs exactly one float (per-tensor scale)";
    }
    if (field.type == PluginFieldType::kFLOAT32)
    {
        *out = *static_cast<float const*>(field.data);
    }
    else if (field.type == PluginFieldType::kFLOAT64)
    {
        *out = static_cast<float>(*static_cast<double const*>(field.data));
    }
    else
    {
        return std::string("field '") + field.name + "' must be FLOAT32 or FLOAT64";
    }
    return {};
}

// ---------------------------------------------------------------------------------------------
// Shapes
// ---------------------------------------------------------------------------------------------

// floor((in + pads - (dil * (k - 1) + 1)) / stride) + 1, as a TensorRT dimension expression.
IDimensionExpr const* outputExtent(IExprBuilder& eb, IDimensionExpr const& in, int32_t pads,
    IDimensionExpr const& kernel, int32_t stride, int32_t dilation)
{
    IDimensionExpr const* one = eb.constant(1);
    IDimensionExpr const* kMinus1 = one ? eb.operation(DimensionOperation::kSUB, kernel, *one) : nullptr;
    IDimensionExpr const* dil = eb.constant(dilation);
    IDimensionExpr const* reach = (kMinus1 && dil) ? eb.operation(DimensionOperation::kPROD, *dil, *kMinus1) : nullptr;
    IDimensionExpr const* span = reach ? eb.operation(DimensionOperation::kSUM, *reach, *one) : nullptr;
    IDimensionExpr const* pad = eb.constant(pads);
    IDimensionExpr const* padded = pad ? eb.operation(DimensionOperation::kSUM, in, *pad) : nullptr;
    IDimensionExpr const* room = (padded && span) ? eb.operation(DimensionOperation::kSUB, *padded, *span) : nullptr;
    IDimensionExpr const* step = eb.constant(stride);
    IDimensionExpr const* steps
        = (room && step) ? eb.operation(DimensionOperation::kFLOOR_DIV, *room, *step) : nullptr;
    return steps ? eb.operation(DimensionOperation::kSUM, *steps, *one) : nullptr;
}

bool known(int64_t dim)
{
    return dim >= 0;
}

// Shape rules that can be checked from (possibly partly unknown, -1) dims: used at build time
// (configurePlugin) and, with every dim known, at run time (onShapeChange).
std::string checkShapes(
    nvinfer1::Dims const& x, nvinfer1::Dims const& w, nvinfer1::Dims const* b, int32_t group)
{
    if (x.nbDims != 4)
    {
        return "input 0 (X) must be 4-D [N, C, H, W]";
    }
    if (w.nbDims != 4 && w.nbDims != 5)
    {
        return "input 1 (W) must be [K, C/group, kH, kW] or [N, K, C/group, kH, kW]";
    }
    int32_t const off = w.nbDims == 5 ? 1 : 0;
    int64_t const n = x.d[0];
    int64_t const c = x.d[1];
    int64_t const k = w.d[off];
    int64_t const cg = w.d[off + 1];
    if (off == 1 && known(n) && known(w.d[0]) && w.d[0] != n)
    {
        return "per-batch W [N, K, C/group, kH, kW] must have N equal to X's batch";
    }
    if (known(c) && known(cg) && cg * group != c)
    {
        return "W's dim C/group times group must equal X's channels";
    }
    if (known(k) && k % group != 0)
    {
        return "group must divide W's output channels K";
    }
    if (b != nullptr)
    {
        if (b->nbDims != 1 && b->nbDims != 2)
        {
            return "input 2 (B) must be [K] or [N, K]";
        }
        int64_t const bk = b->d[b->nbDims - 1];
        if (known(k) && known(bk) && bk != k)
        {
            return "B's last dim must equal W's output channels K";
        }
        if (b->nbDims == 2 && known(n) && known(b->d[0]) && b->d[0] != n)
        {
            return "per-batch B [N, K] must have N equal to X's batch";
        }
    }
    return {};
}

bool fitsInt32(int64_t v)
{
    return v >= 0 && v <= std::numeric_limits<int32_t>::max();
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Attributes
// ---------------------------------------------------------------------------------------------

std::string DWConv2DAttributes::check() const
{
    if (strides[0] < 1 || strides[1] < 1)
    {
        return "strides must be >= 1";
    }
    if (dilations[0] < 1 || dilations[1] < 1)
    {
        return "dilations must be >= 1";
    }
    for (int32_t pad : pads)
    {
        if (pad < 0)
        {
            return "pads must be >= 0";
        }
    }
    if (group < 1)
    {
        return "group must be >= 1";
    }
    if (!std::isfinite(inputScale) || !std::isfinite(weightScale) || !std::isfinite(outputScale))
    {
        return "input_scale, weight_scale and output_scale must be finite";
    }
    if ((inputScale > 0.0F) != (weightScale > 0.0F))
    {
        return "INT8 needs both input_scale and weight_scale > 0 (or neither, for FP32/FP16)";
    }
    if (outputScale > 0.0F && !isInt8())
    {
        return "output_scale > 0 (INT8 output) needs input_scale and weight_scale > 0";
    }
    if (isInt8() && !(inputScale * weightScale > 0.0F))
    {
        return "input_scale * weight_scale underflows float32";
    }
    return {};
}

std::string parseAttributes(PluginFieldCollection const* fc, DWConv2DAttributes* attributes)
{
    DWConv2DAttributes parsed{};
    if (fc != nullptr)
    {
        if (fc->nbFields > 0 && fc->fields == nullptr)
        {
            return "field collection has no fields array";
        }
        for (int32_t i = 0; i < fc->nbFields; ++i)
        {
            PluginField const& field = fc->fields[i];
            if (field.name == nullptr)
            {
                return "field without a name";
            }
            std::string error;
            if (!std::strcmp(field.name, kStrides))
            {
                error = readInts(field, 2, parsed.strides);
            }
            else if (!std::strcmp(field.name, kPads))
            {
                error = readInts(field, 4, parsed.pads);
            }
            else if (!std::strcmp(field.name, kDilations))
            {
                error = readInts(field, 2, parsed.dilations);
            }
            else if (!std::strcmp(field.name, kGroup))
            {
                error = readInts(field, 1, &parsed.group);
            }
            else if (!std::strcmp(field.name, kInputScale))
            {
                error = readFloat(field, &parsed.inputScale);
            }
            else if (!std::strcmp(field.name, kWeightScale))
            {
                error = readFloat(field, &parsed.weightScale);
            }
            else if (!std::strcmp(field.name, kOutputScale))
            {
                error = readFloat(field, &parsed.outputScale);
            }
            else
            {
                logMessage(ILogger::Severity::kWARNING, std::string("ignoring unknown field '") + field.name + "'");
            }
            if (!error.empty())
            {
                return error;
            }
        }
    }
    std::string const invalid = parsed.check();
    if (!invalid.empty())
    {
        return invalid;
    }
    *attributes = parsed;
    return {};
}

// ---------------------------------------------------------------------------------------------
// Plugin
// ---------------------------------------------------------------------------------------------

DWConv2DPlugin::DWConv2DPlugin(DWConv2DAttributes const& attributes)
    : mAttributes(attributes)
{
}

// Copies the configuration, not the serialization scratch (it points into the other object).
DWConv2DPlugin::DWConv2DPlugin(DWConv2DPlugin const& other)
    : IPluginV3(other)
    , IPluginV3OneCore(other)
    , IPluginV3OneBuild(other)
    , IPluginV3OneRuntime(other)
    , mAttributes(other.mAttributes)
    , mParams(other.mParams)
    , mNbInputs(other.mNbInputs)
{
}

IPluginCapability* DWConv2DPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* DWConv2DPlugin::clone() noexcept
{
    try
    {
        return new DWConv2DPlugin(*this);
    }
    catch (std::exception const& e)
    {
        logError(std::string("clone failed: ") + e.what());
    }
    return nullptr;
}

char const* DWConv2DPlugin::getPluginName() const noexcept
{
    return kDWConv2DPluginName;
}

char const* DWConv2DPlugin::getPluginVersion() const noexcept
{
    return kDWConv2DPluginVersion;
}

char const* DWConv2DPlugin::getPluginNamespace() const noexcept
{
    return kDWConv2DPluginNamespace;
}

int32_t DWConv2DPlugin::getNbOutputs() const noexcept
{
    return 1;
}

int32_t DWConv2DPlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    if (in == nullptr || out == nullptr || nbInputs < 2 || nbInputs > 3 || nbOutputs != 1)
    {
        logError("expects inputs X, W and optional B, and one output");
        return -1;
    }
    std::string const error
        = checkShapes(in[0].desc.dims, in[1].desc.dims, nbInputs == 3 ? &in[2].desc.dims : nullptr, mAttributes.group);
    if (!error.empty())
    {
        logError(error);
        return -1;
    }
    return 0;
}

int32_t DWConv2DPlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (outputTypes == nullptr || inputTypes == nullptr || nbOutputs != 1 || nbInputs < 2 || nbInputs > 3)
    {
        logError("expects inputs X, W and optional B, and one output");
        return -1;
    }
    if (mAttributes.isInt8())
    {
        if (inputTypes[0] != DataType::kINT8 || inputTypes[1] != DataType::kINT8)
        {
            logError("input_scale/weight_scale are set (INT8), so X and W must be INT8: feed them from "
                     "QuantizeLinear, or drop the scales for FP32/FP16");
            return -1;
        }
        outputTypes[0] = mAttributes.hasInt8Output() ? DataType::kINT8 : DataType::kFLOAT;
        return 0;
    }
    if (inputTypes[0] != DataType::kFLOAT && inputTypes[0] != DataType::kHALF)
    {
        logError("without input_scale/weight_scale, X must be FP32 or FP16");
        return -1;
    }
    outputTypes[0] = inputTypes[0];
    return 0;
}

int32_t DWConv2DPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t nbShapeInputs, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    if (inputs == nullptr || outputs == nullptr || nbInputs < 2 || nbInputs > 3 || nbOutputs != 1
        || nbShapeInputs != 0)
    {
        logError("expects inputs X, W and optional B (no shape inputs), and one output");
        return -1;
    }
    DimsExprs const& x = inputs[0];
    DimsExprs const& w = inputs[1];
    if (x.nbDims != 4 || (w.nbDims != 4 && w.nbDims != 5))
    {
        logError("X must be 4-D and W 4-D [K, C/group, kH, kW] or 5-D [N, K, C/group, kH, kW]");
        return -1;
    }
    int32_t const off = w.nbDims == 5 ? 1 : 0;
    DWConv2DAttributes const& a = mAttributes;
    IDimensionExpr const* outH
        = outputExtent(exprBuilder, *x.d[2], a.pads[0] + a.pads[2], *w.d[off + 2], a.strides[0], a.dilations[0]);
    IDimensionExpr const* outW
        = outputExtent(exprBuilder, *x.d[3], a.pads[1] + a.pads[3], *w.d[off + 3], a.strides[1], a.dilations[1]);
    if (outH == nullptr || outW == nullptr)
    {
        logError("could not build the output shape expressions");
        return -1;
    }
    if ((outH->isConstant() && outH->getConstantValue() < 1) || (outW->isConstant() && outW->getConstantValue() < 1))
    {
        logError("the (dilated) kernel is larger than the padded input: empty output");
        return -1;
    }
    outputs[0].nbDims = 4;
    outputs[0].d[0] = x.d[0];
    outputs[0].d[1] = w.d[off];
    outputs[0].d[2] = outH;
    outputs[0].d[3] = outW;
    return 0;
}

bool DWConv2DPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    if (inOut == nullptr || nbInputs < 2 || nbInputs > 3 || nbOutputs != 1 || pos < 0 || pos >= nbInputs + nbOutputs)
    {
        return false;
    }
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    bool const int8 = mAttributes.isInt8();
    if (pos == 0)
    {
        return int8 ? desc.type == DataType::kINT8 : (desc.type == DataType::kFLOAT || desc.type == DataType::kHALF);
    }
    DataType const xType = inOut[0].desc.type;
    if (pos == 1) // W: the type of X
    {
        return desc.type == xType;
    }
    if (pos == 2 && nbInputs == 3) // B: FP32 in real units for INT8, else the type of X
    {
        return desc.type == (int8 ? DataType::kFLOAT : xType);
    }
    // Y
    if (int8)
    {
        return desc.type == (mAttributes.hasInt8Output() ? DataType::kINT8 : DataType::kFLOAT);
    }
    return desc.type == xType;
}

size_t DWConv2DPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return 0;
}

int32_t DWConv2DPlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    mNbInputs = 0;
    if (in == nullptr || out == nullptr || nbInputs < 2 || nbInputs > 3 || nbOutputs != 1)
    {
        logError("expects inputs X, W and optional B, and one output");
        return -1;
    }
    nvinfer1::Dims const& x = in[0].dims;
    nvinfer1::Dims const& w = in[1].dims;
    nvinfer1::Dims const* b = nbInputs == 3 ? &in[2].dims : nullptr;
    std::string const error = checkShapes(x, w, b, mAttributes.group);
    if (!error.empty())
    {
        logError(error);
        return -1;
    }
    int32_t const off = w.nbDims == 5 ? 1 : 0;
    for (int32_t i = 0; i < 4; ++i)
    {
        if (!fitsInt32(x.d[i]) || !fitsInt32(w.d[off + i]))
        {
            logError("X and W dims must be known and fit in int32");
            return -1;
        }
    }
    DWConv2DAttributes const& a = mAttributes;
    DWConv2DParams p{};
    p.batch = static_cast<int32_t>(x.d[0]);
    p.in_channels = static_cast<int32_t>(x.d[1]);
    p.in_h = static_cast<int32_t>(x.d[2]);
    p.in_w = static_cast<int32_t>(x.d[3]);
    p.out_channels = static_cast<int32_t>(w.d[off]);
    p.kernel_h = static_cast<int32_t>(w.d[off + 2]);
    p.kernel_w = static_cast<int32_t>(w.d[off + 3]);
    p.stride_h = a.strides[0];
    p.stride_w = a.strides[1];
    p.pad_top = a.pads[0];
    p.pad_left = a.pads[1];
    p.pad_bottom = a.pads[2];
    p.pad_right = a.pads[3];
    p.dilation_h = a.dilations[0];
    p.dilation_w = a.dilations[1];
    p.group = a.group;
    p.weight_mode = off == 1 ? DWCONV2D_WEIGHT_PER_BATCH : DWCONV2D_WEIGHT_SHARED;
    p.bias_mode = b == nullptr ? DWCONV2D_BIAS_NONE : (b->nbDims == 2 ? DWCONV2D_BIAS_PER_BATCH : DWCONV2D_BIAS_SHARED);
    p.input_scale = a.inputScale;
    p.weight_scale = a.weightScale;
    p.output_scale = a.outputScale;
    if (dwconv2d_infer_output_shape(&p) != 0)
    {
        logError("unsupported convolution parameters for these shapes");
        return -1;
    }
    nvinfer1::Dims const& y = out[0].dims;
    if (y.nbDims != 4 || y.d[0] != p.batch || y.d[1] != p.out_channels || y.d[2] != p.out_h || y.d[3] != p.out_w)
    {
        logError("output shape differs from [N, K, Ho, Wo]");
        return -1;
    }
    mParams = p;
    mNbInputs = nbInputs;
    return 0;
}

int32_t DWConv2DPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* /*workspace*/, cudaStream_t stream) noexcept
{
    if (mNbInputs == 0 || inputDesc == nullptr || outputDesc == nullptr || inputs == nullptr || outputs == nullptr)
    {
        logError("enqueue before a successful onShapeChange");
        return -1;
    }
    void const* bias = mNbInputs == 3 ? inputs[2] : nullptr;
    int status{0};
    switch (inputDesc[0].type)
    {
    case DataType::kFLOAT:
        status = dwconv2d_forward_f32(static_cast<float const*>(inputs[0]), static_cast<float const*>(inputs[1]),
            static_cast<float const*>(bias), static_cast<float*>(outputs[0]), &mParams, stream);
        break;
    case DataType::kHALF:
        status = dwconv2d_forward_f16(inputs[0], inputs[1], bias, outputs[0], &mParams, stream);
        break;
    case DataType::kINT8:
    {
        bool const int8Out = outputDesc[0].type == DataType::kINT8;
        if (int8Out != mAttributes.hasInt8Output())
        {
            logError("output type does not match output_scale");
            return -1;
        }
        status = dwconv2d_forward_int8(static_cast<int8_t const*>(inputs[0]), static_cast<int8_t const*>(inputs[1]),
            static_cast<float const*>(bias), outputs[0], &mParams, stream);
        break;
    }
    default: logError("unsupported input type"); return -1;
    }
    if (status != 0)
    {
        logError(std::string("kernel launch failed: ") + cudaGetErrorString(static_cast<cudaError_t>(status)));
    }
    return status;
}

IPluginV3* DWConv2DPlugin::attachToContext(nvinfer1::IPluginResourceContext* /*context*/) noexcept
{
    return clone();
}

PluginFieldCollection const* DWConv2DPlugin::getFieldsToSerialize() noexcept
{
    try
    {
        mSerializedFields.clear();
        mSerializedFields.emplace_back(kStrides, mAttributes.strides, PluginFieldType::kINT32, 2);
        mSerializedFields.emplace_back(kPads, mAttributes.pads, PluginFieldType::kINT32, 4);
        mSerializedFields.emplace_back(kDilations, mAttributes.dilations, PluginFieldType::kINT32, 2);
        mSerializedFields.emplace_back(kGroup, &mAttributes.group, PluginFieldType::kINT32, 1);
        mSerializedFields.emplace_back(kInputScale, &mAttributes.inputScale, PluginFieldType::kFLOAT32, 1);
        mSerializedFields.emplace_back(kWeightScale, &mAttributes.weightScale, PluginFieldType::kFLOAT32, 1);
        mSerializedFields.emplace_back(kOutputScale, &mAttributes.outputScale, PluginFieldType::kFLOAT32, 1);
        mSerializedCollection.nbFields = static_cast<int32_t>(mSerializedFields.size());
        mSerializedCollection.fields = mSerializedFields.data();
        return &mSerializedCollection;
    }
    catch (std::exception const& e)
    {
        logError(std::string("getFieldsToSerialize failed: ") + e.what());
    }
    return nullptr;
}

// ---------------------------------------------------------------------------------------------
// Creator
// ---------------------------------------------------------------------------------------------

DWConv2DPluginCreator::DWConv2DPluginCreator()
{
    mFieldNames.emplace_back(kStrides, nullptr, PluginFieldType::kINT32, 2);
    mFieldNames.emplace_back(kPads, nullptr, PluginFieldType::kINT32, 4);
    mFieldNames.emplace_back(kDilations, nullptr, PluginFieldType::kINT32, 2);
    mFieldNames.emplace_back(kGroup, nullptr, PluginFieldType::kINT32, 1);
    mFieldNames.emplace_back(kInputScale, nullptr, PluginFieldType::kFLOAT32, 1);
    mFieldNames.emplace_back(kWeightScale, nullptr, PluginFieldType::kFLOAT32, 1);
    mFieldNames.emplace_back(kOutputScale, nullptr, PluginFieldType::kFLOAT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFieldNames.size());
    mFieldCollection.fields = mFieldNames.data();
}

char const* DWConv2DPluginCreator::getPluginName() const noexcept
{
    return kDWConv2DPluginName;
}

char const* DWConv2DPluginCreator::getPluginVersion() const noexcept
{
    return kDWConv2DPluginVersion;
}

char const* DWConv2DPluginCreator::getPluginNamespace() const noexcept
{
    return kDWConv2DPluginNamespace;
}

PluginFieldCollection const* DWConv2DPluginCreator::getFieldNames() noexcept
{
    return &mFieldCollection;
}

IPluginV3* DWConv2DPluginCreator::createPlugin(
    char const* name, PluginFieldCollection const* fc, nvinfer1::TensorRTPhase /*phase*/) noexcept
{
    try
    {
        DWConv2DAttributes attributes{};
        std::string const error = parseAttributes(fc, &attributes);
        if (!error.empty())
        {
            logError(std::string(name != nullptr ? name : "<unnamed>") + ": " + error);
            return nullptr;
        }
        return new DWConv2DPlugin(attributes);
    }
    catch (std::exception const& e)
    {
        logError(std::string("createPlugin failed: ") + e.what());
    }
    return nullptr;
}

} // namespace plugin
} // namespace quantbench

// ---------------------------------------------------------------------------------------------
// Library entry points
// ---------------------------------------------------------------------------------------------

extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static quantbench::plugin::DWConv2DPluginCreator sCreator;
    static nvinfer1::IPluginCreatorInterface* const sCreators[] = {&sCreator};
    nbCreators = 1;
    return sCreators;
}

extern "C" void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    std::lock_guard<std::mutex> lock(quantbench::plugin::gLoggerMutex);
    if (quantbench::plugin::gLoggerFinder == nullptr && finder != nullptr)
    {
        quantbench::plugin::gLoggerFinder = finder;
    }
}
