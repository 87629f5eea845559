# Included after each project() of a llama-cpp-python source build (CMAKE_PROJECT_INCLUDE, set by the
# Makefile's setup and by kafila/engine/variant.py). llama-cpp-python 0.3.36 forces LLAMA_BUILD_COMMON
# on, yet ships nothing of it: `common` (the llama.cpp tools' helpers, with cpp-httplib) is most of the
# build's compile time, and no library llama_cpp loads links it. A normal variable shadows that forced
# cache entry in every directory below (policies CMP0126 and CMP0077, both NEW there), so llama.cpp's
# own option() leaves it off. -DLLAVA_BUILD=OFF, beside this, skips libmtmd (multimodal; unused).
set(LLAMA_BUILD_COMMON OFF)
