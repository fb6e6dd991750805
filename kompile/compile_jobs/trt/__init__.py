"""The TensorRT backend's parts: graph preparation on CPU (prep), optimization profiles (profiles),
plan header parsing (plan), timing-cache paths (cache) and the engine build and runner (engine).

Only `engine` imports TensorRT (lazily); the rest runs in CI without a GPU.
"""
