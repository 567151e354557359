// tandem: subcommand dispatch and the one place errors become exit codes.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include <c10/util/Exception.h>
#include <c10/util/Logging.h>

#include "tandem/checkpoint/hf_model.h"
#include "tandem/cli/commands.h"
#include "tandem/cli/flags.h"
#include "tandem/dist/communication_error.h"
#include "tandem/dist/process_group.h"
#include "tandem/launch/worker_error.h"
#include "tandem/util/env.h"
#include "tandem/util/file.h"
#include "tandem/util/message.h"
#include "tandem/version.h"

namespace tandem::cli {

// Note [library warnings]: when a peer stops answering, c10d's store logs
// each failed request as a warning with its C++ stack (14 lines of
// frames), beside tandem's own one-line account of the failure (Note [who
// did not come]). libtorch's own TORCH_WARN messages are not affected.
void quiet_library_logs() {
  if (!env::get("TORCH_CPP_LOG_LEVEL")) FLAGS_caffe2_log_level = 2;  // c10's ERROR
}

namespace {

std::string top_help() {
  return std::string(
             "usage: tandem <command> [flags]\n\n"
             "tandem trains neural networks on libtorch, on one or many devices.\n\n"
             "commands:\n"
             "  train     train and evaluate a model\n"
             "  eval      evaluate trained weights (--export-weights' file) on a data set\n"
             "  export    write a checkpoint's weights as one safetensors file\n"
             "  sample    generate text from a trained language model (--export-weights' file)\n"
             "  plan      predict each layout's memory, traffic, bubble and time for a job on a cluster\n"
             "  tokenize  turn text into token shards with a tokenizer.json or SentencePiece model\n"
             "  launch    run a command as N local workers of a distributed job\n"
             "  models    list the model names --model accepts\n"
             "  version   print the version\n\n"
             "`tandem <command> --help` describes one command. The train flags:\n\n") +
         train_help();
}

}  // namespace

namespace {

int run_command(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      std::printf("%s", top_help().c_str());
      return args.empty() ? 2 : 0;
    }
    std::string command = args[0];
    std::vector<std::string> rest(args.begin() + 1, args.end());
    if (command == "train") return train_command(rest);
    if (command == "eval") return eval_command(rest);
    if (command == "export") return export_command(rest);
    if (command == "sample") return sample_command(rest);
    if (command == "models") return models_command(rest);
    if (command == "plan") return plan_command(rest);
    if (command == "tokenize") return tokenize_command(rest);
    if (command == "launch") return launch_command(rest);
    if (command == "version" || command == "--version") {
      std::printf("tandem %s\n", TANDEM_VERSION);
      return 0;
    }
    throw UsageError("unknown command '" + command + "' (commands: train, eval, export, sample, plan, tokenize, launch, models, version)");
  } catch (const UsageError& e) {
    const std::string message = printable(e.what());  // one line, whatever names it holds
    std::fprintf(stderr, "tandem: error: %s\n", message.c_str());
    launch::report_worker_error(message, false);  // Note [first failure]
    return 2;
  } catch (const std::exception& e) {
    // One line (a name holding a newline is escaped; libtorch's stack
    // trace is left out).
    const std::string message = printable(message_of(e));
    std::fprintf(stderr, "\ntandem: error: %s\n", message.c_str());
    // Note [first failure]: for a launcher that asked (TANDEM_ERROR_FILE),
    // with the ranks a failed collective found not answering.
    const auto* failed = dynamic_cast<const dist::CommunicationError*>(&e);
    launch::report_worker_error(message, failed != nullptr || dist::is_communication_failure(message),
                                failed != nullptr ? failed->unanswered() : std::vector<int64_t>{});
    // libtorch's allocators name bytes, not the flags that asked for them.
    if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr || dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
        message.find("can't allocate memory") != std::string::npos) {
      std::fprintf(stderr, "tandem: out of memory: a smaller --batch-size, --image-size or model needs less, "
                           "as do --grad-accum K and --checkpoint-activations N (for more time)\n");
    }
    // libtorch's BatchNorm names a tensor shape, not the batch of one that
    // gave it (the last of an epoch: --batch-size 299 over 300 images).
    if (message.find("Expected more than 1 value per channel when training") != std::string::npos) {
      std::fprintf(stderr, "tandem: a BatchNorm layer got one value per channel: a batch (or micro-batch, or "
                           "an epoch's last batch) of one sample whose feature map is 1 x 1 there; another "
                           "--batch-size, fewer --micro-batches or a larger --image-size avoids it\n");
    }
    return 1;
  }
}

}  // namespace

int main_command(int argc, char** argv) {
  checkpoint::enable_hf_models();  // --model hf:DIR
  const int code = run_command(argc, argv);
  // What was printed must have arrived: a full disk or a closed stdout
  // lost the result table with exit 0 (a sweep's find).
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "tandem: error: cannot write to standard output: %s\n", std::strerror(errno));
    return code != 0 ? code : 1;
  }
  return code;
}

}  // namespace tandem::cli
