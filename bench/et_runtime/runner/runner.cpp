/*
 * composer_et_runner: load an ExecuTorch program (.pte) and its data files (.ptd) in
 * ExecuTorch's own C++ runtime (extension/module), run one method N times on inputs read from
 * a file, print the per-call times as one JSON line on stdout, and write the outputs.
 *
 *   composer_et_runner --model m.pte [--data a.ptd ...] --inputs in.bin --outputs out.bin
 *                      [--method forward] [--warmup 3] [--repeats 20] [--threads N]
 *                      [--step in1.bin out1.bin [--step in2.bin out2.bin ...]]
 *                      [--mempool-keep]
 *   composer_et_runner --list-kernels
 *
 * --list-kernels prints the operators this runtime has kernels for, one JSON line
 * ({"ok": true, "kernels": ["aten::add.out", ...]}), and exits: composer reads it to know which
 * undelegated operators a program may keep before it writes one that fails to load here.
 * --step runs the method once on each file's inputs, in order, right after loading and before
 * the timed calls, and writes that call's outputs: state the program keeps between calls (a KV
 * cache updated in place) carries from one step to the next, as in a decoding loop.
 * --mempool-keep sets the CUDA device's default memory pool (the one cudaMallocAsync draws on,
 * which the CUDA backend's tensors use) to keep freed memory instead of releasing it at each
 * synchronization (cudaMemPoolAttrReleaseThreshold = UINT64_MAX).
 *
 * Tensor file format (inputs and outputs; little-endian), read and written by client.py:
 *   "ETRUNIO1" | u32 count | count x ( i32 dtype (ExecuTorch ScalarType) | u32 ndim |
 *                                      i64 sizes[ndim] | u64 nbytes | nbytes of contiguous data )
 * A non-tensor output is written as dtype -1, ndim 0, nbytes 0.
 *
 * Each timed call is Module::execute(method, inputs): setting the inputs (copied into the
 * method's planned memory) and executing, outputs back on the host (the program's own
 * _d2h_copy ops are synchronous), as composer's LoadedProgram times the pip runtime.
 */
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/extension/threadpool/threadpool.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/runtime.h>

#ifdef COMPOSER_RUNNER_CUDA
#include <cuda_runtime.h>
#endif

using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::Error;
using executorch::runtime::EValue;
using executorch::aten::ScalarType;

namespace {

constexpr char kMagic[] = "ETRUNIO1";

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "composer_et_runner: %s\n", message.c_str());
  std::printf("{\"ok\": false, \"error\": \"%s\"}\n", message.c_str());
  std::fflush(stdout);
  std::exit(2);
}

size_t element_size(ScalarType dtype) {
  return executorch::runtime::elementSize(dtype);
}

struct HostTensor {
  int32_t dtype = 0;
  std::vector<int64_t> sizes;
  std::vector<uint8_t> data;
};

std::vector<HostTensor> read_tensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    die("cannot open " + path);
  }
  char magic[8];
  uint32_t count = 0;
  in.read(magic, 8);
  in.read(reinterpret_cast<char*>(&count), 4);
  if (!in || std::memcmp(magic, kMagic, 8) != 0) {
    die(path + " is not an ETRUNIO1 tensor file");
  }
  std::vector<HostTensor> tensors(count);
  for (auto& t : tensors) {
    uint32_t ndim = 0;
    uint64_t nbytes = 0;
    in.read(reinterpret_cast<char*>(&t.dtype), 4);
    in.read(reinterpret_cast<char*>(&ndim), 4);
    t.sizes.resize(ndim);
    in.read(reinterpret_cast<char*>(t.sizes.data()), 8 * ndim);
    in.read(reinterpret_cast<char*>(&nbytes), 8);
    t.data.resize(nbytes);
    in.read(reinterpret_cast<char*>(t.data.data()), nbytes);
    if (!in) {
      die("truncated tensor file " + path);
    }
  }
  return tensors;
}

void write_tensors(const std::string& path, const std::vector<EValue>& values) {
  std::ofstream out(path, std::ios::binary);
  if (!out) {
    die("cannot write " + path);
  }
  uint32_t count = values.size();
  out.write(kMagic, 8);
  out.write(reinterpret_cast<const char*>(&count), 4);
  for (const auto& value : values) {
    int32_t dtype = -1;
    uint32_t ndim = 0;
    uint64_t nbytes = 0;
    if (!value.isTensor()) {
      out.write(reinterpret_cast<const char*>(&dtype), 4);
      out.write(reinterpret_cast<const char*>(&ndim), 4);
      out.write(reinterpret_cast<const char*>(&nbytes), 8);
      continue;
    }
    const auto& tensor = value.toTensor();
    dtype = static_cast<int32_t>(tensor.scalar_type());
    ndim = tensor.dim();
    nbytes = tensor.nbytes();
    std::vector<uint8_t> host(nbytes);
    const void* source = tensor.const_data_ptr();
#ifdef COMPOSER_RUNNER_CUDA
    cudaPointerAttributes attributes{};
    if (source != nullptr &&
        cudaPointerGetAttributes(&attributes, source) == cudaSuccess &&
        attributes.type == cudaMemoryTypeDevice) {
      if (cudaMemcpy(host.data(), source, nbytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
        die("cudaMemcpy of an output failed");
      }
      source = host.data();
    }
    cudaGetLastError(); // a host pointer leaves an error behind on some drivers
#endif
    if (source != host.data() && nbytes > 0) {
      std::memcpy(host.data(), source, nbytes);
    }
    out.write(reinterpret_cast<const char*>(&dtype), 4);
    out.write(reinterpret_cast<const char*>(&ndim), 4);
    for (auto size : tensor.sizes()) {
      int64_t wide = size;
      out.write(reinterpret_cast<const char*>(&wide), 8);
    }
    out.write(reinterpret_cast<const char*>(&nbytes), 8);
    out.write(reinterpret_cast<const char*>(host.data()), nbytes);
  }
}

// The inputs of a tensor file as EValues over buffers that `host` and `owners` keep alive.
std::vector<EValue> make_inputs(
    const std::string& path,
    std::vector<HostTensor>& host,
    std::vector<TensorPtr>& owners) {
  host = read_tensors(path);
  std::vector<EValue> values;
  for (auto& t : host) {
    std::vector<executorch::aten::SizesType> sizes(t.sizes.begin(), t.sizes.end());
    auto dtype = static_cast<ScalarType>(t.dtype);
    size_t numel = 1;
    for (auto s : t.sizes) {
      numel *= static_cast<size_t>(s);
    }
    if (numel * element_size(dtype) != t.data.size()) {
      die("an input's byte count does not match its shape and dtype");
    }
    owners.push_back(executorch::extension::from_blob(t.data.data(), sizes, dtype));
    values.emplace_back(*owners.back());
  }
  return values;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void list_kernels() {
  executorch::runtime::runtime_init();
  std::vector<std::string> names;
  for (const auto& kernel : executorch::runtime::get_registered_kernels()) {
    std::string name = kernel.name_;
    bool seen = false;
    for (const auto& known : names) {
      seen = seen || known == name;
    }
    if (!seen) {
      names.push_back(name);
    }
  }
  std::printf("{\"ok\": true, \"kernels\": [");
  for (size_t i = 0; i < names.size(); ++i) {
    std::printf("%s\"%s\"", i ? ", " : "", names[i].c_str());
  }
  std::printf("]}\n");
}

} // namespace

int main(int argc, char** argv) {
  std::string model, inputs_path, outputs_path, method = "forward";
  std::vector<std::string> data_files;
  std::vector<std::pair<std::string, std::string>> steps;
  bool mempool_keep = false;
  int warmup = 3, repeats = 20, threads = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        die("missing value after " + arg);
      }
      return argv[++i];
    };
    if (arg == "--model") {
      model = next();
    } else if (arg == "--data") {
      data_files.push_back(next());
    } else if (arg == "--inputs") {
      inputs_path = next();
    } else if (arg == "--outputs") {
      outputs_path = next();
    } else if (arg == "--method") {
      method = next();
    } else if (arg == "--warmup") {
      warmup = std::atoi(next().c_str());
    } else if (arg == "--repeats") {
      repeats = std::atoi(next().c_str());
    } else if (arg == "--threads") {
      threads = std::atoi(next().c_str());
    } else if (arg == "--step") {
      std::string in = next();
      steps.emplace_back(in, next());
    } else if (arg == "--mempool-keep") {
      mempool_keep = true;
    } else if (arg == "--list-kernels") {
      list_kernels();
      return 0;
    } else {
      die("unknown argument " + arg);
    }
  }
  if (model.empty() || (inputs_path.empty() && steps.empty())) {
    die("usage: --model m.pte [--data f.ptd]... --inputs in.bin [--outputs out.bin]");
  }
  executorch::runtime::runtime_init();
  if (mempool_keep) {
#ifdef COMPOSER_RUNNER_CUDA
    cudaMemPool_t pool = nullptr;
    uint64_t keep = UINT64_MAX;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess ||
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess) {
      die("cannot set the default memory pool's release threshold");
    }
#else
    die("--mempool-keep needs a CUDA build");
#endif
  }
  if (threads > 0) {
    auto* pool = executorch::extension::threadpool::get_threadpool();
    if (pool != nullptr) {
      pool->_unsafe_reset_threadpool(threads);
    }
  }

  auto start = std::chrono::steady_clock::now();
  Module module(model, data_files, Module::LoadMode::File);
  Error error = module.load();
  if (error != Error::Ok) {
    die("loading the program failed: error " + std::to_string(static_cast<int>(error)));
  }
  const double program_load_s = seconds_since(start);
  start = std::chrono::steady_clock::now();
  error = module.load_method(method);
  if (error != Error::Ok) {
    die("loading method " + method + " failed: error " +
        std::to_string(static_cast<int>(error)));
  }
  const double method_load_s = seconds_since(start);

  for (const auto& [step_in, step_out] : steps) {
    std::vector<HostTensor> host;
    std::vector<TensorPtr> owners;
    auto values = make_inputs(step_in, host, owners);
    auto result = module.execute(method, values);
    if (!result.ok()) {
      die("execute failed at step " + step_in + ": error " +
          std::to_string(static_cast<int>(result.error())));
    }
    write_tensors(step_out, result.get());
  }
  if (inputs_path.empty()) {
    std::printf("{\"ok\": true, \"executor\": \"ExecuTorch C++ runtime (extension/module)\", "
                "\"program_load_s\": %.6f, \"method_load_s\": %.6f, \"steps\": %zu, "
                "\"times_s\": []}\n", program_load_s, method_load_s, steps.size());
    return 0;
  }
  std::vector<HostTensor> host_inputs;
  std::vector<TensorPtr> tensors;
  std::vector<EValue> inputs = make_inputs(inputs_path, host_inputs, tensors);

  std::vector<double> times;
  std::vector<EValue> last;
  for (int call = 0; call < warmup + repeats; ++call) {
    start = std::chrono::steady_clock::now();
    auto result = module.execute(method, inputs);
#ifdef COMPOSER_RUNNER_CUDA
    cudaDeviceSynchronize();
#endif
    const double elapsed = seconds_since(start);
    if (!result.ok()) {
      die("execute failed at call " + std::to_string(call) + ": error " +
          std::to_string(static_cast<int>(result.error())));
    }
    if (call >= warmup) {
      times.push_back(elapsed);
    }
    if (call == warmup + repeats - 1) {
      last = std::move(result.get());
    }
  }
  if (!outputs_path.empty()) {
    write_tensors(outputs_path, last);
  }
  std::printf(
      "{\"ok\": true, \"executor\": \"ExecuTorch C++ runtime (extension/module)\", "
      "\"program_load_s\": %.6f, \"method_load_s\": %.6f, \"outputs\": %zu, \"times_s\": [",
      program_load_s,
      method_load_s,
      last.size());
  for (size_t i = 0; i < times.size(); ++i) {
    std::printf("%s%.9f", i ? ", " : "", times[i]);
  }
  std::printf("]}\n");
  std::fflush(stdout);
  return 0;
}
