// furnace certs init: the development CA, certificates and tokens of transport/dev_certs.h, and
// the flags that use them.
#include "absl/strings/str_cat.h"
#include "controller/cli/commands.h"
#include "controller/cli/exit_codes.h"
#include "google/protobuf/struct.pb.h"
#include "runtime/base/status.h"
#include "transport/dev_certs.h"

namespace furnace::cli {

absl::StatusOr<int> RunCertsInit(const CommandContext& ctx, const CertsInitOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("certs init: DIR is required");
  if (!ctx.json && ctx.err != nullptr) {
    *ctx.err << "making a development CA, certificates and tokens in " << options.dir << " ...\n";
  }
  transport::DevCertsOptions dev;
  dev.dir = options.dir;
  dev.hosts = options.hosts;
  dev.worker_hosts = options.worker_hosts;
  dev.force = options.force;
  absl::StatusOr<std::vector<std::string>> files = transport::WriteDevCerts(dev);
  if (!files.ok()) {
    if (absl::IsInvalidArgument(files.status())) return files.status();
    return LocalError(files.status());
  }
  if (ctx.json) {
    google::protobuf::Struct result;
    auto* list = (*result.mutable_fields())["files"].mutable_list_value();
    for (const std::string& f : *files) list->add_values()->set_string_value(f);
    RETURN_IF_ERROR(PrintJson(result, *ctx.out));
    return kExitOk;
  }
  for (const std::string& f : *files) *ctx.out << "wrote " << f << "\n";
  const std::string& d = options.dir;
  *ctx.out << "\nfurnace-controller --tls-cert " << d << "/controller.pem --tls-key " << d
           << "/controller.key --tls-ca " << d << "/ca.pem \\\n    --token-file " << d
           << "/tokens --join-token-file " << d << "/join.token ...\n"
           << "furnace-worker --tls-cert " << d << "/worker.pem --tls-key " << d
           << "/worker.key --tls-ca " << d << "/ca.pem --join-token-file " << d
           << "/join.token ...\n";
  for (const std::string& host : options.worker_hosts) {
    *ctx.out << "furnace-worker --tls-cert " << d << "/worker-" << host << ".pem --tls-key " << d
             << "/worker-" << host << ".key --id " << host << "/0 ...   # on " << host
             << " only: it may act only as worker " << host << " or " << host << "/<slot>\n";
  }
  *ctx.out << "furnace --tls-ca " << d << "/ca.pem --token-file " << d << "/admin.token jobs\n"
           << "(development only: keep ca.key off the cluster; see README \"Security\")\n";
  return kExitOk;
}

}  // namespace furnace::cli
