// deepinfer/engine/v4_backend.h — the DeepSeek-V4 (`deepseek_v4`) model behind
// the engine's ModelBackend interface (model/v4/model.h), on the same engine,
// cache pool, scheduler, sampler and server as V4.1. Engine::Open picks it
// when the model directory's config.json says model_type deepseek_v4.
#pragma once

#include <filesystem>
#include <memory>

#include "deepinfer/engine.h"

namespace deepinfer {

class ModelBackend;

// Opens the engine over a V4 model directory (config.json, safetensors,
// tokenizer.json when present). One process only: Error(kInvalidArgument)
// for --ep/--dp > 1 or --fp8-format e4m3-ieee, which the V4 path does not
// support yet; prefix caching is off for V4 (the backend does not offer it);
// model errors as V4Model::Load.
std::unique_ptr<Engine> OpenV4Engine(const EngineArgs& args);

// The V4 backend alone (engine/backend.h; tests of the drafter contract): its
// speculative rollback (window rings, compressor carries replayed from the
// capture) and, for method "mtp", the MTP drafter (EnableDrafter). Errors as
// V4Model::Load.
std::unique_ptr<ModelBackend> OpenV4Backend(const std::filesystem::path& model_dir);

}  // namespace deepinfer
