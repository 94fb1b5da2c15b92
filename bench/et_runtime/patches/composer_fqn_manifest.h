/*
 * composer bench patch for ExecuTorch main of 2026-08-22 (cff6f4dd), copied by build.sh to
 * backends/cuda/runtime/composer_fqn_manifest.h and included by cuda_backend.cpp (see
 * cuda_backend.patch).
 *
 * Why: the ExecuTorch 1.5.1 wheel's CudaBackend (backends/cuda/cuda_weight_collector.py)
 * writes each delegate's processed bytes as a per-FQN weight manifest:
 *
 *   "ETCUDAFQN3" | str so_blob_key | u32 count |
 *   count x ( str fqn | str storage_key | u64 storage_nbytes | i32 dtype | i32 device_type |
 *             i64 storage_offset | u32 ndim | i64 sizes[ndim] | i64 strides[ndim] )
 *   (str = u32 length + UTF-8 bytes; all little-endian)
 *
 * with one named-data entry (in the .ptd) per weight storage. The runtime of the source the
 * mirror has reads only "<so_key>\n<weights_key>" and one AOTInductor weights blob. This
 * reads the manifest, uploads each storage once to where the manifest says (CUDA or CPU), views
 * it with the manifest's sizes/strides/offset, and hands the views to the .so's container as
 * user-managed constants, keyed by the container's own constant names through their original
 * FQNs (falling back to the name itself, as composer's libtorch host does).
 *
 * The storages live for the process (as the upstream runtime never deletes its containers).
 */
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

#include <executorch/backends/cuda/runtime/cuda_delegate_handle.h>
#include <executorch/backends/cuda/runtime/platform/platform.h>
#include <executorch/backends/cuda/runtime/shims/memory.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/named_data_map.h>
#include <executorch/runtime/platform/log.h>

namespace executorch::backends::cuda::composer_patch {

constexpr char kMagic[] = "ETCUDAFQN3";
constexpr size_t kMagicSize = sizeof(kMagic) - 1;

struct FqnEntry {
  std::string fqn;
  std::string storage_key;
  uint64_t storage_nbytes = 0;
  int32_t dtype = 0;
  int32_t device_type = 0;
  int64_t storage_offset = 0;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
};

struct FqnManifest {
  std::string so_blob_key;
  std::vector<FqnEntry> entries;
};

inline bool is_fqn_manifest(const void* data, size_t size) {
  return data != nullptr && size >= kMagicSize &&
      std::memcmp(data, kMagic, kMagicSize) == 0;
}

class ManifestCursor {
 public:
  ManifestCursor(const void* data, size_t size)
      : at_(static_cast<const uint8_t*>(data)),
        end_(static_cast<const uint8_t*>(data) + size) {}
  bool bytes(void* out, size_t n) {
    if (static_cast<size_t>(end_ - at_) < n) {
      return false;
    }
    std::memcpy(out, at_, n); // x86-64 and the writer are little-endian
    at_ += n;
    return true;
  }
  template <typename T>
  bool value(T& out) {
    return bytes(&out, sizeof(T));
  }
  bool str(std::string& out) {
    uint32_t n = 0;
    if (!value(n) || static_cast<size_t>(end_ - at_) < n) {
      return false;
    }
    out.assign(reinterpret_cast<const char*>(at_), n);
    at_ += n;
    return true;
  }
  bool done() const {
    return at_ == end_;
  }

 private:
  const uint8_t* at_;
  const uint8_t* end_;
};

inline runtime::Error
parse_fqn_manifest(const void* data, size_t size, FqnManifest& manifest) {
  using runtime::Error;
  ManifestCursor cursor(data, size);
  char magic[kMagicSize];
  uint32_t count = 0;
  if (!cursor.bytes(magic, kMagicSize) ||
      std::memcmp(magic, kMagic, kMagicSize) != 0 ||
      !cursor.str(manifest.so_blob_key) || manifest.so_blob_key.empty() ||
      !cursor.value(count) || count > (1u << 20)) {
    return Error::InvalidProgram;
  }
  manifest.entries.resize(count);
  for (auto& entry : manifest.entries) {
    uint32_t ndim = 0;
    if (!cursor.str(entry.fqn) || !cursor.str(entry.storage_key) ||
        !cursor.value(entry.storage_nbytes) || !cursor.value(entry.dtype) ||
        !cursor.value(entry.device_type) || !cursor.value(entry.storage_offset) ||
        !cursor.value(ndim) || ndim > 64) {
      return Error::InvalidProgram;
    }
    entry.sizes.resize(ndim);
    entry.strides.resize(ndim);
    for (auto& v : entry.sizes) {
      if (!cursor.value(v) || v < 0) {
        return Error::InvalidProgram;
      }
    }
    for (auto& v : entry.strides) {
      if (!cursor.value(v) || v < 0) {
        return Error::InvalidProgram;
      }
    }
    if (entry.fqn.empty() || entry.storage_key.empty() ||
        entry.storage_offset < 0 ||
        (entry.device_type != 0 && entry.device_type != 1)) {
      return Error::InvalidProgram;
    }
  }
  return cursor.done() ? Error::Ok : Error::InvalidProgram;
}

// AOTInductorModelContainerUpdateUserManagedConstantBuffer (the map form, present in
// torch 2.6+; the Pairs form may be missing from .so files of older torch).
using UpdateUserManagedConstantBufferMapFunc = aoti::AOTIRuntimeError (*)(
    aoti::AOTInductorModelContainerHandle,
    aoti::AOTInductorConstantMapHandle,
    bool use_inactive,
    bool validate_full_update);

inline runtime::Error bind_fqn_manifest_constants(
    CudaDelegateHandle* handle,
    const runtime::NamedDataMap* named_data_map,
    const FqnManifest& manifest) {
  using runtime::Error;
  ET_CHECK_OR_RETURN_ERROR(
      named_data_map != nullptr,
      InvalidArgument,
      "ETCUDAFQN3 weights need the program's named data (.ptd)");
  ET_CHECK_OR_RETURN_ERROR(
      handle->get_num_constants != nullptr &&
          handle->get_constant_name != nullptr &&
          handle->get_constant_original_fqn != nullptr,
      NotSupported,
      "the AOTI .so lacks the constant enumeration API");

  std::unordered_map<std::string, const FqnEntry*> by_fqn;
  for (const auto& entry : manifest.entries) {
    by_fqn.emplace(entry.fqn, &entry);
  }

  size_t num_constants = 0;
  ET_CHECK_OK_OR_RETURN_ERROR(
      handle->get_num_constants(handle->container_handle, &num_constants));

  std::unordered_map<std::string, void*> storages; // storage_key -> data
  std::vector<std::string> names;
  std::vector<aoti::AtenTensorHandle> tensors;
  for (size_t i = 0; i < num_constants; ++i) {
    const char* name = nullptr;
    const char* fqn = nullptr;
    ET_CHECK_OK_OR_RETURN_ERROR(
        handle->get_constant_name(handle->container_handle, i, &name));
    ET_CHECK_OK_OR_RETURN_ERROR(handle->get_constant_original_fqn(
        handle->container_handle, i, &fqn));
    auto found = by_fqn.end();
    if (fqn != nullptr && fqn[0] != '\0') {
      found = by_fqn.find(fqn);
    }
    if (found == by_fqn.end() && name != nullptr) {
      found = by_fqn.find(name);
    }
    ET_CHECK_OR_RETURN_ERROR(
        found != by_fqn.end(),
        NotFound,
        "constant %s (%s) of the .so is not in its ETCUDAFQN3 manifest",
        name ? name : "?",
        fqn ? fqn : "?");
    const FqnEntry& entry = *found->second;

    void*& data = storages[entry.storage_key];
    if (data == nullptr) {
      auto host = named_data_map->get_data(entry.storage_key.c_str());
      ET_CHECK_OR_RETURN_ERROR(
          host.ok(),
          NotFound,
          "weight storage '%s' is not in the named data (.ptd)",
          entry.storage_key.c_str());
      ET_CHECK_OR_RETURN_ERROR(
          host->size() == entry.storage_nbytes,
          InvalidProgram,
          "weight storage '%s' has %zu bytes, the manifest says %llu",
          entry.storage_key.c_str(),
          host->size(),
          static_cast<unsigned long long>(entry.storage_nbytes));
      const size_t nbytes = static_cast<size_t>(entry.storage_nbytes);
      const size_t allocated = nbytes > 0 ? nbytes : 1;
      if (entry.device_type == 1) {
        ET_CHECK_OR_RETURN_ERROR(
            cudaMalloc(&data, allocated) == cudaSuccess,
            MemoryAllocationFailed,
            "cudaMalloc(%zu) for '%s' failed",
            allocated,
            entry.storage_key.c_str());
        if (nbytes > 0) {
          ET_CHECK_OR_RETURN_ERROR(
              cudaMemcpy(data, host->data(), nbytes, cudaMemcpyHostToDevice) ==
                  cudaSuccess,
              Internal,
              "cudaMemcpy for '%s' failed",
              entry.storage_key.c_str());
        }
      } else {
        data = std::malloc(allocated);
        ET_CHECK_OR_RETURN_ERROR(
            data != nullptr, MemoryAllocationFailed, "malloc failed");
        if (nbytes > 0) {
          std::memcpy(data, host->data(), nbytes);
        }
      }
      host->Free();
    }

    SlimTensor* tensor = nullptr;
    ET_CHECK_OK_OR_RETURN_ERROR(aoti_torch_create_tensor_from_blob_v2(
        data,
        static_cast<int64_t>(entry.sizes.size()),
        entry.sizes.data(),
        entry.strides.data(),
        entry.storage_offset,
        entry.dtype,
        entry.device_type,
        0,
        &tensor,
        0,
        nullptr,
        0));
    names.emplace_back(name);
    tensors.push_back(reinterpret_cast<aoti::AtenTensorHandle>(tensor));
  }
  if (names.empty()) {
    return Error::Ok;
  }

  if (handle->update_user_managed_constant_buffer_pairs != nullptr) {
    std::vector<aoti::AOTInductorConstantMapEntry> pairs;
    for (size_t i = 0; i < names.size(); ++i) {
      pairs.push_back({names[i].c_str(), tensors[i]});
    }
    ET_CHECK_OK_OR_RETURN_ERROR(handle->update_user_managed_constant_buffer_pairs(
        handle->container_handle,
        pairs.data(),
        pairs.size(),
        /*use_inactive=*/false,
        /*validate_full_update=*/true));
  } else {
    auto symbol = get_function(
        handle->so_handle,
        "AOTInductorModelContainerUpdateUserManagedConstantBuffer");
    ET_CHECK_OR_RETURN_ERROR(
        symbol.ok(),
        NotSupported,
        "the AOTI .so has no UpdateUserManagedConstantBuffer(Pairs)");
    std::unordered_map<std::string, aoti::AtenTensorHandle> map;
    for (size_t i = 0; i < names.size(); ++i) {
      map.emplace(names[i], tensors[i]);
    }
    auto update =
        reinterpret_cast<UpdateUserManagedConstantBufferMapFunc>(symbol.get());
    ET_CHECK_OK_OR_RETURN_ERROR(update(
        handle->container_handle,
        reinterpret_cast<aoti::AOTInductorConstantMapHandle>(&map),
        /*use_inactive=*/false,
        /*validate_full_update=*/true));
  }
  ET_LOG(
      Info,
      "bound %zu constants (%zu storages) from the ETCUDAFQN3 manifest",
      names.size(),
      storages.size());
  return Error::Ok;
}

} // namespace executorch::backends::cuda::composer_patch
