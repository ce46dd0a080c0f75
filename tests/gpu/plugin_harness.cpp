// Plays TensorRT's part of the IPluginV3 protocol against the DWConv2D plugin, on a GPU.
//
// TensorRT cannot be installed where the plugin was written, so this program does what the ONNX
// parser, the builder and the runtime do with a V3 plugin, in their order: getCreators() ->
// getFieldNames() -> createPlugin(kBUILD) with ONNX-typed fields -> getCapabilityInterface() ->
// getOutputDataTypes / getOutputShapes (through an IExprBuilder with a symbolic batch) /
// supportsFormatCombination / configurePlugin -> getFieldsToSerialize() -> createPlugin(kRUNTIME)
// -> attachToContext() -> onShapeChange() -> enqueue(), and checks enqueue's output against a
// naive CPU convolution. It also checks that bad fields, types and shapes are refused and that
// errors go to the logger handed over by setLoggerFinder().
//
// It is an emulation: it proves the plugin keeps the interface's contract as the headers state it,
// not that a real TensorRT build accepts it. Build (headers of TensorRT 10.x needed, no library):
//   nvcc -std=c++17 -O2 -I$TENSORRT_ROOT/include -Iplugins/dwconv2d tests/gpu/plugin_harness.cpp
//        plugins/dwconv2d/DWConv2DPlugin.cpp plugins/dwconv2d/kernels/dwconv2d.cu
//        -gencode arch=compute_90,code=sm_90 -o build/dwconv2d_plugin_harness
// (one command line; or cmake -DDWCONV2D_BUILD_HARNESS=ON, see plugins/dwconv2d/CMakeLists.txt)
// With --protocol-only it needs no GPU and stops each scenario before enqueue.
// Output: one PASS/FAIL line per check, then "N passed, M failed"; exit status 1 on any failure.

#include "DWConv2DPlugin.h"

#include <NvInferRuntime.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace trt = nvinfer1;
using quantbench::plugin::DWConv2DPlugin;

namespace
{

int gPassed = 0;
int gFailed = 0;
bool gProtocolOnly = false; // --protocol-only: no GPU, stop each scenario before enqueue

void check(bool ok, std::string const& what, std::string const& detail = {})
{
    if (ok)
    {
        ++gPassed;
        std::printf("PASS %s\n", what.c_str());
    }
    else
    {
        ++gFailed;
        std::printf("FAIL %s%s%s\n", what.c_str(), detail.empty() ? "" : ": ", detail.c_str());
    }
}

// ---------------------------------------------------------------------------------------------
// A logger the plugin gets through setLoggerFinder(), remembering the last error.
// ---------------------------------------------------------------------------------------------

class CapturingLogger : public trt::ILogger
{
public:
    void log(Severity severity, trt::AsciiChar const* msg) noexcept override
    {
        if (severity <= Severity::kERROR)
        {
            lastError = msg;
            ++errors;
        }
    }
    std::string lastError;
    int errors{0};
};

class LoggerFinder : public trt::ILoggerFinder
{
public:
    explicit LoggerFinder(trt::ILogger* logger)
        : mLogger(logger)
    {
    }
    trt::ILogger* findLogger() override
    {
        return mLogger;
    }

private:
    trt::ILogger* mLogger;
};

// ---------------------------------------------------------------------------------------------
// IExprBuilder stand-in: expressions carry a value and whether TensorRT would know it at build
// time; a symbolic expression answers isConstant() == false like the real one.
// ---------------------------------------------------------------------------------------------

class ExprImpl : public trt::apiv::VDimensionExpr
{
public:
    ExprImpl(int64_t v, bool c)
        : value(v)
        , constant(c)
    {
    }
    bool isConstant() const override
    {
        return constant;
    }
    int64_t getConstantValue() const override
    {
        return constant ? value : std::numeric_limits<int64_t>::min();
    }
    bool isSizeTensor() const override
    {
        return false;
    }
    int64_t value;
    bool constant;
};

class Expr : public trt::IDimensionExpr
{
public:
    Expr(int64_t v, bool c)
        : impl(v, c)
    {
        mImpl = &impl;
    }
    ExprImpl impl;
};

int64_t floorDiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0)))
    {
        --q;
    }
    return q;
}

class ExprBuilderImpl : public trt::apiv::VExprBuilder
{
public:
    Expr const* make(int64_t v, bool c)
    {
        pool.push_back(std::make_unique<Expr>(v, c));
        return pool.back().get();
    }
    trt::IDimensionExpr const* constant(int64_t value) override
    {
        return make(value, true);
    }
    trt::IDimensionExpr const* operation(
        trt::DimensionOperation op, trt::IDimensionExpr const& first, trt::IDimensionExpr const& second) override
    {
        auto const& a = static_cast<Expr const&>(first).impl;
        auto const& b = static_cast<Expr const&>(second).impl;
        int64_t v{0};
        switch (op)
        {
        case trt::DimensionOperation::kSUM: v = a.value + b.value; break;
        case trt::DimensionOperation::kPROD: v = a.value * b.value; break;
        case trt::DimensionOperation::kMAX: v = std::max(a.value, b.value); break;
        case trt::DimensionOperation::kMIN: v = std::min(a.value, b.value); break;
        case trt::DimensionOperation::kSUB: v = a.value - b.value; break;
        case trt::DimensionOperation::kEQUAL: v = a.value == b.value; break;
        case trt::DimensionOperation::kLESS: v = a.value < b.value; break;
        case trt::DimensionOperation::kFLOOR_DIV: v = floorDiv(a.value, b.value); break;
        case trt::DimensionOperation::kCEIL_DIV: v = -floorDiv(-a.value, b.value); break;
        }
        return make(v, a.constant && b.constant);
    }
    trt::IDimensionExpr const* declareSizeTensor(int32_t, trt::IDimensionExpr const&, trt::IDimensionExpr const&) override
    {
        return nullptr;
    }
    std::deque<std::unique_ptr<Expr>> pool;
};

class ExprBuilder : public trt::IExprBuilder
{
public:
    ExprBuilder()
    {
        mImpl = &impl;
    }
    ExprBuilderImpl impl;
};

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

enum class Mode
{
    kF32,
    kF16,
    kInt8ToInt8,
    kInt8ToF32
};

struct Scenario
{
    char const* name;
    int32_t n, c, h, w, k, kh, kw;
    int32_t strides[2];
    int32_t pads[4];
    int32_t dilations[2];
    int32_t group;
    bool perBatchWeight;
    int32_t biasMode; // DWCONV2D_BIAS_*
    Mode mode;
    float inputScale, weightScale, outputScale;

    int32_t outH() const
    {
        return (h + pads[0] + pads[2] - dilations[0] * (kh - 1) - 1) / strides[0] + 1;
    }
    int32_t outW() const
    {
        return (w + pads[1] + pads[3] - dilations[1] * (kw - 1) - 1) / strides[1] + 1;
    }
    bool int8() const
    {
        return mode == Mode::kInt8ToInt8 || mode == Mode::kInt8ToF32;
    }
    trt::DataType inType() const
    {
        return int8() ? trt::DataType::kINT8 : (mode == Mode::kF16 ? trt::DataType::kHALF : trt::DataType::kFLOAT);
    }
    trt::DataType biasType() const
    {
        return int8() ? trt::DataType::kFLOAT : inType();
    }
    trt::DataType outType() const
    {
        return mode == Mode::kInt8ToInt8 ? trt::DataType::kINT8
                                         : (mode == Mode::kF16 ? trt::DataType::kHALF : trt::DataType::kFLOAT);
    }
    int32_t nbInputs() const
    {
        return biasMode == DWCONV2D_BIAS_NONE ? 2 : 3;
    }
    trt::Dims xDims() const
    {
        trt::Dims d{};
        d.nbDims = 4;
        d.d[0] = n;
        d.d[1] = c;
        d.d[2] = h;
        d.d[3] = w;
        return d;
    }
    trt::Dims wDims() const
    {
        trt::Dims d{};
        int64_t const dims[] = {k, c / group, kh, kw};
        d.nbDims = perBatchWeight ? 5 : 4;
        int32_t i = 0;
        if (perBatchWeight)
        {
            d.d[i++] = n;
        }
        for (int64_t v : dims)
        {
            d.d[i++] = v;
        }
        return d;
    }
    trt::Dims bDims() const
    {
        trt::Dims d{};
        d.nbDims = biasMode == DWCONV2D_BIAS_PER_BATCH ? 2 : 1;
        d.d[0] = biasMode == DWCONV2D_BIAS_PER_BATCH ? n : k;
        d.d[1] = k;
        return d;
    }
    trt::Dims yDims() const
    {
        trt::Dims d{};
        d.nbDims = 4;
        d.d[0] = n;
        d.d[1] = k;
        d.d[2] = outH();
        d.d[3] = outW();
        return d;
    }
};

// Fields exactly as the ONNX parser's fallback importer builds them: INTS -> kINT32,
// FLOAT -> kFLOAT32 (an INT8-less node carries no scale attributes at all).
std::vector<trt::PluginField> onnxFields(Scenario const& s)
{
    std::vector<trt::PluginField> f;
    f.emplace_back("strides", s.strides, trt::PluginFieldType::kINT32, 2);
    f.emplace_back("pads", s.pads, trt::PluginFieldType::kINT32, 4);
    f.emplace_back("dilations", s.dilations, trt::PluginFieldType::kINT32, 2);
    f.emplace_back("group", &s.group, trt::PluginFieldType::kINT32, 1);
    if (s.int8())
    {
        f.emplace_back("input_scale", &s.inputScale, trt::PluginFieldType::kFLOAT32, 1);
        f.emplace_back("weight_scale", &s.weightScale, trt::PluginFieldType::kFLOAT32, 1);
        f.emplace_back("output_scale", &s.outputScale, trt::PluginFieldType::kFLOAT32, 1);
    }
    return f;
}

trt::IPluginCreatorV3One* theCreator()
{
    int32_t nb = 0;
    trt::IPluginCreatorInterface* const* creators = getCreators(nb);
    if (nb != 1 || creators == nullptr || creators[0] == nullptr)
    {
        return nullptr;
    }
    return static_cast<trt::IPluginCreatorV3One*>(creators[0]);
}

DWConv2DPlugin* create(std::vector<trt::PluginField> const& fields, trt::TensorRTPhase phase)
{
    trt::PluginFieldCollection fc{};
    fc.nbFields = static_cast<int32_t>(fields.size());
    fc.fields = fields.data();
    return static_cast<DWConv2DPlugin*>(theCreator()->createPlugin("dwconv_node", &fc, phase));
}

trt::PluginTensorDesc desc(trt::Dims dims, trt::DataType type)
{
    trt::PluginTensorDesc d{};
    d.dims = dims;
    d.type = type;
    d.format = trt::TensorFormat::kLINEAR;
    d.scale = -1.0F;
    return d;
}

// ---------------------------------------------------------------------------------------------
// Host data and the CPU reference
// ---------------------------------------------------------------------------------------------

struct HostData
{
    std::vector<float> x, w, b; // real values (for INT8: the integers, as floats)
};

HostData makeData(Scenario const& s, uint32_t seed)
{
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0F, 1.0F);
    std::uniform_int_distribution<int> int8(-128, 127);
    size_t const xs = static_cast<size_t>(s.n) * s.c * s.h * s.w;
    size_t const ws = static_cast<size_t>(s.perBatchWeight ? s.n : 1) * s.k * (s.c / s.group) * s.kh * s.kw;
    size_t const bs = s.biasMode == DWCONV2D_BIAS_NONE ? 0 : (s.biasMode == DWCONV2D_BIAS_PER_BATCH ? s.n : 1) * s.k;
    HostData d;
    auto draw = [&](size_t count, float scale, bool integer) {
        std::vector<float> v(count);
        for (float& e : v)
        {
            e = integer ? static_cast<float>(int8(rng)) : normal(rng) * scale;
            if (s.mode == Mode::kF16 && !integer)
            {
                e = __half2float(__float2half(e)); // the values the kernel really sees
            }
        }
        return v;
    };
    d.x = draw(xs, 1.0F, s.int8());
    d.w = draw(ws, 0.2F, s.int8());
    d.b = draw(bs, 0.3F, false);
    return d;
}

// y[n, k, oh, ow] in double (for INT8: the exact integer sums plus bias through the float epilogue).
std::vector<double> reference(Scenario const& s, HostData const& d)
{
    int32_t const oh = s.outH();
    int32_t const ow = s.outW();
    int32_t const cg = s.c / s.group;
    int32_t const kg = s.k / s.group;
    std::vector<double> y(static_cast<size_t>(s.n) * s.k * oh * ow);
    float const accScale = s.inputScale * s.weightScale;
    for (int32_t n = 0; n < s.n; ++n)
        for (int32_t k = 0; k < s.k; ++k)
            for (int32_t i = 0; i < oh; ++i)
                for (int32_t j = 0; j < ow; ++j)
                {
                    double acc = 0.0;
                    int32_t const g = k / kg;
                    for (int32_t ci = 0; ci < cg; ++ci)
                        for (int32_t a = 0; a < s.kh; ++a)
                            for (int32_t b = 0; b < s.kw; ++b)
                            {
                                int32_t const ih = i * s.strides[0] - s.pads[0] + a * s.dilations[0];
                                int32_t const iw = j * s.strides[1] - s.pads[1] + b * s.dilations[1];
                                if (ih < 0 || ih >= s.h || iw < 0 || iw >= s.w)
                                {
                                    continue;
                                }
                                size_t const xi = ((static_cast<size_t>(n) * s.c + g * cg + ci) * s.h + ih) * s.w + iw;
                                size_t const wi
                                    = (((static_cast<size_t>(s.perBatchWeight ? n : 0) * s.k + k) * cg + ci) * s.kh + a)
                                        * s.kw
                                    + b;
                                acc += static_cast<double>(d.x[xi]) * d.w[wi];
                            }
                    float bias = 0.0F;
                    if (s.biasMode == DWCONV2D_BIAS_SHARED)
                    {
                        bias = d.b[k];
                    }
                    else if (s.biasMode == DWCONV2D_BIAS_PER_BATCH)
                    {
                        bias = d.b[static_cast<size_t>(n) * s.k + k];
                    }
                    size_t const yi = ((static_cast<size_t>(n) * s.k + k) * oh + i) * ow + j;
                    if (!s.int8())
                    {
                        y[yi] = acc + bias;
                        continue;
                    }
                    float const prod = static_cast<float>(static_cast<int64_t>(acc)) * accScale;
                    float const v = prod + bias;
                    if (s.mode == Mode::kInt8ToF32)
                    {
                        y[yi] = v;
                        continue;
                    }
                    float const q = std::nearbyint(v / s.outputScale);
                    y[yi] = std::fmin(std::fmax(q, -128.0F), 127.0F);
                }
    return y;
}

template <class T>
T* toDevice(std::vector<T> const& host)
{
    T* ptr{nullptr};
    if (host.empty() || cudaMalloc(&ptr, host.size() * sizeof(T)) != cudaSuccess)
    {
        return nullptr;
    }
    cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return ptr;
}

// Device buffers in the scenario's types (converted from the float host values).
void* deviceTensor(std::vector<float> const& values, trt::DataType type)
{
    if (values.empty())
    {
        return nullptr;
    }
    if (type == trt::DataType::kFLOAT)
    {
        return toDevice(values);
    }
    if (type == trt::DataType::kHALF)
    {
        std::vector<__half> h(values.size());
        for (size_t i = 0; i < values.size(); ++i)
        {
            h[i] = __float2half(values[i]);
        }
        return toDevice(h);
    }
    std::vector<int8_t> q(values.size());
    for (size_t i = 0; i < values.size(); ++i)
    {
        q[i] = static_cast<int8_t>(values[i]);
    }
    return toDevice(q);
}

std::vector<double> fromDevice(void const* ptr, size_t count, trt::DataType type)
{
    std::vector<double> out(count);
    if (type == trt::DataType::kFLOAT)
    {
        std::vector<float> h(count);
        cudaMemcpy(h.data(), ptr, count * sizeof(float), cudaMemcpyDeviceToHost);
        std::copy(h.begin(), h.end(), out.begin());
    }
    else if (type == trt::DataType::kHALF)
    {
        std::vector<__half> h(count);
        cudaMemcpy(h.data(), ptr, count * sizeof(__half), cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < count; ++i)
        {
            out[i] = __half2float(h[i]);
        }
    }
    else
    {
        std::vector<int8_t> h(count);
        cudaMemcpy(h.data(), ptr, count, cudaMemcpyDeviceToHost);
        std::copy(h.begin(), h.end(), out.begin());
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// The protocol, one scenario
// ---------------------------------------------------------------------------------------------

void buildPhase(Scenario const& s, DWConv2DPlugin& plugin)
{
    std::string const tag = std::string(s.name) + ": ";
    auto* build = static_cast<trt::IPluginV3OneBuild*>(plugin.getCapabilityInterface(trt::PluginCapabilityType::kBUILD));
    check(build != nullptr && std::strcmp(build->getInterfaceInfo().kind, "PLUGIN_V3ONE_BUILD") == 0,
        tag + "kBUILD capability is IPluginV3OneBuild");
    if (build == nullptr)
    {
        return;
    }
    check(build->getNbOutputs() == 1, tag + "one output");

    trt::DataType const inTypes[] = {s.inType(), s.inType(), s.biasType()};
    trt::DataType outType{trt::DataType::kBOOL};
    check(build->getOutputDataTypes(&outType, 1, inTypes, s.nbInputs()) == 0 && outType == s.outType(),
        tag + "getOutputDataTypes");

    // Shapes: the batch is symbolic (a dynamic dimension), everything else a build-time constant.
    ExprBuilder eb;
    trt::DimsExprs in[3]{};
    trt::Dims const dims[] = {s.xDims(), s.wDims(), s.bDims()};
    for (int32_t t = 0; t < s.nbInputs(); ++t)
    {
        in[t].nbDims = dims[t].nbDims;
        for (int32_t i = 0; i < dims[t].nbDims; ++i)
        {
            bool const isBatch = (t == 0 && i == 0) || (t == 1 && s.perBatchWeight && i == 0)
                || (t == 2 && s.biasMode == DWCONV2D_BIAS_PER_BATCH && i == 0);
            in[t].d[i] = eb.impl.make(dims[t].d[i], !isBatch);
        }
    }
    trt::DimsExprs out[1]{};
    int32_t const rc = build->getOutputShapes(in, s.nbInputs(), nullptr, 0, out, 1, eb);
    auto value = [](trt::IDimensionExpr const* e) { return static_cast<Expr const*>(e)->impl.value; };
    bool shapeOk = rc == 0 && out[0].nbDims == 4 && !out[0].d[0]->isConstant() && value(out[0].d[0]) == s.n
        && out[0].d[1]->isConstant() && out[0].d[1]->getConstantValue() == s.k && out[0].d[2]->isConstant()
        && out[0].d[2]->getConstantValue() == s.outH() && out[0].d[3]->isConstant()
        && out[0].d[3]->getConstantValue() == s.outW();
    check(shapeOk, tag + "getOutputShapes: [N (symbolic), K, Ho, Wo]");

    // Formats: the scenario's combination is accepted position by position; others are not.
    trt::DynamicPluginTensorDesc io[4]{};
    trt::DataType const ioTypes[] = {s.inType(), s.inType(), s.biasType()};
    int32_t const nb = s.nbInputs();
    for (int32_t t = 0; t < nb; ++t)
    {
        io[t].desc = desc(dims[t], ioTypes[t]);
    }
    io[nb].desc = desc(s.yDims(), s.outType());
    bool allAccepted = true;
    for (int32_t pos = 0; pos <= nb; ++pos)
    {
        allAccepted = allAccepted && build->supportsFormatCombination(pos, io, nb, 1);
    }
    check(allAccepted, tag + "supportsFormatCombination accepts the scenario's types");
    trt::DynamicPluginTensorDesc wrong[4];
    std::copy(io, io + 4, wrong);
    wrong[nb].desc.type = s.outType() == trt::DataType::kINT8 ? trt::DataType::kFLOAT : trt::DataType::kINT8;
    bool const rejectsOutput = !build->supportsFormatCombination(nb, wrong, nb, 1);
    std::copy(io, io + 4, wrong);
    wrong[0].desc.format = trt::TensorFormat::kCHW32;
    bool const rejectsFormat = !build->supportsFormatCombination(0, wrong, nb, 1);
    std::copy(io, io + 4, wrong);
    wrong[0].desc.type = trt::DataType::kINT32;
    bool const rejectsType = !build->supportsFormatCombination(0, wrong, nb, 1);
    check(rejectsOutput && rejectsFormat && rejectsType, tag + "supportsFormatCombination rejects others");

    // configurePlugin sees -1 for the dynamic batch.
    trt::DynamicPluginTensorDesc cfg[4];
    std::copy(io, io + 4, cfg);
    for (int32_t t = 0; t <= nb; ++t)
    {
        bool const batchFirst = t == 0 || t == nb || (t == 1 && s.perBatchWeight)
            || (t == 2 && s.biasMode == DWCONV2D_BIAS_PER_BATCH);
        if (batchFirst)
        {
            cfg[t].desc.dims.d[0] = -1;
        }
        cfg[t].min = cfg[t].max = cfg[t].opt = io[t].desc.dims;
    }
    check(build->configurePlugin(cfg, nb, cfg + nb, 1) == 0, tag + "configurePlugin with a dynamic batch");
}

void runtimePhase(Scenario const& s, DWConv2DPlugin& built, uint32_t seed)
{
    std::string const tag = std::string(s.name) + ": ";
    auto* runtime
        = static_cast<trt::IPluginV3OneRuntime*>(built.getCapabilityInterface(trt::PluginCapabilityType::kRUNTIME));
    trt::PluginFieldCollection const* fields = runtime->getFieldsToSerialize();
    check(fields != nullptr && fields->nbFields == 7, tag + "getFieldsToSerialize: 7 fields");
    if (fields == nullptr)
    {
        return;
    }
    // The engine stores the fields; deserialization hands them back to createPlugin(kRUNTIME).
    std::vector<trt::PluginField> stored(fields->fields, fields->fields + fields->nbFields);
    std::unique_ptr<DWConv2DPlugin> deserialized(create(stored, trt::TensorRTPhase::kRUNTIME));
    check(deserialized != nullptr, tag + "createPlugin(kRUNTIME) from the serialized fields");
    if (!deserialized)
    {
        return;
    }
    auto* core = static_cast<trt::IPluginV3OneCore*>(deserialized->getCapabilityInterface(trt::PluginCapabilityType::kCORE));
    check(core != nullptr && std::strcmp(core->getPluginName(), "DWConv2D") == 0
            && std::strcmp(core->getPluginVersion(), "1") == 0
            && std::strcmp(core->getPluginNamespace(), "quantbench") == 0,
        tag + "core: DWConv2D / 1 / quantbench");
    auto* rt = static_cast<trt::IPluginV3OneRuntime*>(
        deserialized->getCapabilityInterface(trt::PluginCapabilityType::kRUNTIME));
    std::unique_ptr<DWConv2DPlugin> context(static_cast<DWConv2DPlugin*>(rt->attachToContext(nullptr)));
    check(context != nullptr, tag + "attachToContext returns a clone");
    if (!context)
    {
        return;
    }
    auto* ctx = static_cast<trt::IPluginV3OneRuntime*>(context->getCapabilityInterface(trt::PluginCapabilityType::kRUNTIME));

    int32_t const nb = s.nbInputs();
    trt::PluginTensorDesc inDesc[3] = {desc(s.xDims(), s.inType()), desc(s.wDims(), s.inType()),
        desc(s.bDims(), s.biasType())};
    trt::PluginTensorDesc outDesc[1] = {desc(s.yDims(), s.outType())};
    check(ctx->onShapeChange(inDesc, nb, outDesc, 1) == 0, tag + "onShapeChange");
    if (gProtocolOnly)
    {
        return;
    }

    HostData const data = makeData(s, seed);
    void* dx = deviceTensor(data.x, s.inType());
    void* dw = deviceTensor(data.w, s.inType());
    void* db = deviceTensor(data.b, s.biasType());
    size_t const outCount = static_cast<size_t>(s.n) * s.k * s.outH() * s.outW();
    size_t const outBytes = outCount * (s.outType() == trt::DataType::kINT8 ? 1 : s.outType() == trt::DataType::kHALF ? 2 : 4);
    void* dy{nullptr};
    cudaMalloc(&dy, outBytes);
    cudaMemset(dy, 0x7F, outBytes); // poison: 127 as int8, a large value as float/half
    cudaStream_t stream{};
    cudaStreamCreate(&stream);
    void const* inputs[3] = {dx, dw, db};
    void* outputs[1] = {dy};
    int32_t const rc = ctx->enqueue(inDesc, outDesc, inputs, outputs, nullptr, stream);
    cudaError_t const sync = cudaStreamSynchronize(stream);
    check(rc == 0 && sync == cudaSuccess, tag + "enqueue", cudaGetErrorString(sync));

    std::vector<double> const got = fromDevice(dy, outCount, s.outType());
    std::vector<double> const want = reference(s, data);
    double maxRef = 0.0;
    double maxErr = 0.0;
    for (size_t i = 0; i < outCount; ++i)
    {
        maxRef = std::fmax(maxRef, std::fabs(want[i]));
        maxErr = std::fmax(maxErr, std::fabs(got[i] - want[i]));
    }
    double const tolerance = s.int8() ? 0.0 : (s.mode == Mode::kF16 ? 2e-3 : 1e-5) * maxRef;
    char detail[128];
    std::snprintf(detail, sizeof(detail), "max |err| %.3g, max |ref| %.3g", maxErr, maxRef);
    check(maxErr <= tolerance, tag + "enqueue output matches the CPU reference (" + detail + ")", detail);

    cudaStreamDestroy(stream);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(db);
    cudaFree(dy);
}

void runScenario(Scenario const& s, uint32_t seed)
{
    std::unique_ptr<DWConv2DPlugin> plugin(create(onnxFields(s), trt::TensorRTPhase::kBUILD));
    check(plugin != nullptr, std::string(s.name) + ": createPlugin(kBUILD) from ONNX-typed fields");
    if (!plugin)
    {
        return;
    }
    buildPhase(s, *plugin);
    std::unique_ptr<DWConv2DPlugin> cloned(static_cast<DWConv2DPlugin*>(plugin->clone()));
    check(cloned != nullptr, std::string(s.name) + ": clone");
    runtimePhase(s, cloned ? *cloned : *plugin, seed);
}

// ---------------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------------

void refusals(Scenario const& base, CapturingLogger& logger)
{
    auto refusedWithLog = [&](auto&& attempt, char const* what) {
        int const before = logger.errors;
        bool const refused = attempt();
        check(refused, std::string("refuses ") + what);
        check(logger.errors > before || !refused, std::string("logs an error for ") + what, logger.lastError);
    };

    {
        int32_t const pads2[2] = {1, 1};
        std::vector<trt::PluginField> f = onnxFields(base);
        f[1] = trt::PluginField("pads", pads2, trt::PluginFieldType::kINT32, 2);
        int const before = logger.errors;
        std::unique_ptr<DWConv2DPlugin> p(create(f, trt::TensorRTPhase::kBUILD));
        check(p == nullptr, "refuses pads of length 2");
        check(logger.errors > before, "logs an error for pads of length 2", logger.lastError);
    }
    {
        float const scale = 0.1F;
        std::vector<trt::PluginField> f = onnxFields(base);
        f.emplace_back("input_scale", &scale, trt::PluginFieldType::kFLOAT32, 1);
        std::unique_ptr<DWConv2DPlugin> p(create(f, trt::TensorRTPhase::kBUILD));
        check(p == nullptr, "refuses input_scale without weight_scale");
    }
    {
        int64_t const strides64[2] = {2, 2};
        std::vector<trt::PluginField> f = onnxFields(base);
        f[0] = trt::PluginField("strides", strides64, trt::PluginFieldType::kINT64, 2);
        std::unique_ptr<DWConv2DPlugin> p(create(f, trt::TensorRTPhase::kBUILD));
        check(p != nullptr && p->attributes().strides[0] == 2 && p->attributes().strides[1] == 2,
            "accepts INT64 strides (as Python callers build them)");
    }
    {
        Scenario s = base;
        s.mode = Mode::kInt8ToInt8;
        s.inputScale = 0.02F;
        s.weightScale = 0.01F;
        s.outputScale = 0.05F;
        std::unique_ptr<DWConv2DPlugin> p(create(onnxFields(s), trt::TensorRTPhase::kBUILD));
        trt::DataType const floatIn[] = {trt::DataType::kFLOAT, trt::DataType::kFLOAT, trt::DataType::kFLOAT};
        trt::DataType out{};
        refusedWithLog([&] { return p && p->getOutputDataTypes(&out, 1, floatIn, 3) != 0; }, "FP32 inputs to an INT8 plugin");
    }
    {
        std::unique_ptr<DWConv2DPlugin> p(create(onnxFields(base), trt::TensorRTPhase::kRUNTIME));
        trt::PluginTensorDesc in[3] = {desc(base.xDims(), base.inType()), desc(base.wDims(), base.inType()),
            desc(base.bDims(), base.biasType())};
        trt::PluginTensorDesc out[1] = {desc(base.yDims(), base.outType())};
        void const* inputs[3] = {nullptr, nullptr, nullptr};
        void* outputs[1] = {nullptr};
        refusedWithLog([&] { return p && p->enqueue(in, out, inputs, outputs, nullptr, nullptr) != 0; }, "enqueue before onShapeChange");
        trt::PluginTensorDesc badOut[1] = {out[0]};
        badOut[0].dims.d[2] += 1;
        refusedWithLog([&] { return p && p->onShapeChange(in, base.nbInputs(), badOut, 1) != 0; }, "a wrong output shape");
        trt::PluginTensorDesc badIn[3] = {in[0], in[1], in[2]};
        badIn[0].dims.d[1] += 1; // channels no longer C/group * group
        refusedWithLog([&] { return p && p->onShapeChange(badIn, base.nbInputs(), out, 1) != 0; }, "mismatched channels");
    }
    {
        Scenario s = base;
        s.perBatchWeight = true;
        std::unique_ptr<DWConv2DPlugin> p(create(onnxFields(s), trt::TensorRTPhase::kRUNTIME));
        trt::Dims w = s.wDims();
        w.d[0] = s.n + 1;
        trt::PluginTensorDesc in[3] = {desc(s.xDims(), s.inType()), desc(w, s.inType()), desc(s.bDims(), s.biasType())};
        trt::PluginTensorDesc out[1] = {desc(s.yDims(), s.outType())};
        refusedWithLog([&] { return p && p->onShapeChange(in, s.nbInputs(), out, 1) != 0; }, "per-batch W with another batch size");
    }
    {
        Scenario s = base;
        s.kh = s.kw = s.h + s.pads[0] + s.pads[2] + 1;
        std::unique_ptr<DWConv2DPlugin> p(create(onnxFields(s), trt::TensorRTPhase::kBUILD));
        ExprBuilder eb;
        trt::DimsExprs in[2]{};
        trt::Dims const dims[] = {s.xDims(), s.wDims()};
        for (int32_t t = 0; t < 2; ++t)
        {
            in[t].nbDims = dims[t].nbDims;
            for (int32_t i = 0; i < dims[t].nbDims; ++i)
            {
                in[t].d[i] = eb.impl.make(dims[t].d[i], true);
            }
        }
        trt::DimsExprs out[1]{};
        refusedWithLog([&] { return p && p->getOutputShapes(in, 2, nullptr, 0, out, 1, eb) != 0; }, "a kernel larger than the input");
    }
}

} // namespace

int main(int argc, char** argv)
{
    gProtocolOnly = argc > 1 && std::strcmp(argv[1], "--protocol-only") == 0;
    int device = 0;
    if (!gProtocolOnly && (cudaGetDeviceCount(&device) != cudaSuccess || device == 0))
    {
        std::printf("no CUDA device (use --protocol-only to check the calls without one)\n");
        return 2;
    }
    CapturingLogger logger;
    LoggerFinder finder(&logger);
    setLoggerFinder(&finder);

    trt::IPluginCreatorV3One* creator = theCreator();
    check(creator != nullptr, "getCreators returns one creator");
    if (creator == nullptr)
    {
        return 1;
    }
    check(std::strcmp(creator->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") == 0, "creator kind PLUGIN CREATOR_V3ONE");
    check(std::strcmp(creator->getPluginName(), "DWConv2D") == 0 && std::strcmp(creator->getPluginVersion(), "1") == 0
            && std::strcmp(creator->getPluginNamespace(), "quantbench") == 0,
        "creator: DWConv2D / 1 / quantbench");
    trt::PluginFieldCollection const* names = creator->getFieldNames();
    std::string joined;
    for (int32_t i = 0; names != nullptr && i < names->nbFields; ++i)
    {
        joined += std::string(names->fields[i].name) + " ";
    }
    check(joined == "strides pads dilations group input_scale weight_scale output_scale ", "getFieldNames", joined);

    // name, N C H W K kH kW, strides, pads (t l b r), dilations, group, per-batch W, bias, mode, scales
    Scenario const scenarios[] = {
        {"depthwise_f32_shared_bias", 2, 32, 17, 19, 32, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 32, false,
            DWCONV2D_BIAS_SHARED, Mode::kF32, -1, -1, -1},
        {"dense_f16_per_batch_w_b", 2, 16, 15, 15, 32, 3, 3, {2, 2}, {0, 1, 1, 0}, {1, 1}, 1, true,
            DWCONV2D_BIAS_PER_BATCH, Mode::kF16, -1, -1, -1},
        {"grouped_int8_to_int8", 3, 16, 12, 12, 24, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 4, false,
            DWCONV2D_BIAS_SHARED, Mode::kInt8ToInt8, 0.02F, 0.01F, 0.6F},
        {"depthwise_int8_to_f32_per_batch_w", 2, 24, 20, 20, 24, 5, 5, {1, 1}, {4, 4, 4, 4}, {2, 2}, 24, true,
            DWCONV2D_BIAS_NONE, Mode::kInt8ToF32, 0.02F, 0.01F, -1},
    };
    uint32_t seed = 11;
    for (Scenario const& s : scenarios)
    {
        runScenario(s, seed++);
    }
    refusals(scenarios[0], logger);

    std::printf("%d passed, %d failed\n", gPassed, gFailed);
    return gFailed == 0 ? 0 : 1;
}
