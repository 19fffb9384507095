// The NCCL entry points Furnace calls, forwarding to libnccl loaded on first use
// (runtime/comm/nccl_library.h). Each definition is checked against nccl.h's declaration by the
// compiler; the list given to LazyLibrary names them all, so that a library lacking one fails to
// load as a whole.
#include "runtime/comm/nccl_library.h"

#include <nccl.h>

#include <string>

#include "kernels/cuda/lazy_library.h"

namespace furnace::comm {
namespace {

kernels::cuda::LazyLibrary& Nccl() {
  static kernels::cuda::LazyLibrary* const library =
      new kernels::cuda::LazyLibrary(  // never destroyed: calls may come late
          "libnccl.so." + std::to_string(NCCL_MAJOR), {FURNACE_NCCL_LIBRARY_DIR},
          {"ncclGetUniqueId", "ncclCommInitRankConfig", "ncclCommFinalize", "ncclCommDestroy",
           "ncclCommAbort", "ncclGetErrorString", "ncclGetLastError", "ncclCommGetAsyncError",
           "ncclBroadcast", "ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclSend",
           "ncclRecv", "ncclGroupStart", "ncclGroupEnd"});
  return *library;
}

}  // namespace

absl::Status LoadNccl() {
  const std::string& error = Nccl().Load();
  return error.empty() ? absl::OkStatus() : absl::FailedPreconditionError(error);
}

}  // namespace furnace::comm

// Forwards to the library's `name`, found once per entry point.
#define FURNACE_NCCL_FORWARD(name, ...)                          \
  static void* const real = furnace::comm::Nccl().Symbol(#name); \
  if (real == nullptr) return ncclSystemError;                   \
  return furnace::kernels::cuda::CallAs<ncclResult_t>(real __VA_OPT__(, ) __VA_ARGS__)

// For the two entry points that return a message: the load error where the library is absent.
#define FURNACE_NCCL_FORWARD_MESSAGE(name, ...)                     \
  static void* const real = furnace::comm::Nccl().Symbol(#name);    \
  if (real == nullptr) return furnace::comm::Nccl().Load().c_str(); \
  return furnace::kernels::cuda::CallAs<const char*>(real, __VA_ARGS__)

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  FURNACE_NCCL_FORWARD(ncclGetUniqueId, uniqueId);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  FURNACE_NCCL_FORWARD(ncclCommInitRankConfig, comm, nranks, commId, rank, config);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { FURNACE_NCCL_FORWARD(ncclCommFinalize, comm); }

ncclResult_t ncclCommDestroy(ncclComm_t comm) { FURNACE_NCCL_FORWARD(ncclCommDestroy, comm); }

ncclResult_t ncclCommAbort(ncclComm_t comm) { FURNACE_NCCL_FORWARD(ncclCommAbort, comm); }

const char* ncclGetErrorString(ncclResult_t result) {
  FURNACE_NCCL_FORWARD_MESSAGE(ncclGetErrorString, result);
}

const char* ncclGetLastError(ncclComm_t comm) {
  FURNACE_NCCL_FORWARD_MESSAGE(ncclGetLastError, comm);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  FURNACE_NCCL_FORWARD(ncclCommGetAsyncError, comm, asyncError);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  FURNACE_NCCL_FORWARD(ncclBroadcast, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  FURNACE_NCCL_FORWARD(ncclAllReduce, sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  FURNACE_NCCL_FORWARD(ncclReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, comm,
                       stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  FURNACE_NCCL_FORWARD(ncclAllGather, sendbuff, recvbuff, sendcount, datatype, comm, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  FURNACE_NCCL_FORWARD(ncclSend, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  FURNACE_NCCL_FORWARD(ncclRecv, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart() { FURNACE_NCCL_FORWARD(ncclGroupStart); }

ncclResult_t ncclGroupEnd() { FURNACE_NCCL_FORWARD(ncclGroupEnd); }

}  // extern "C"
