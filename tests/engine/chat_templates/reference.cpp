// The reference renderer: llama.cpp's own chat pipeline (common/chat.cpp with minja), as its server runs it
// under --jinja. Reads one JSON case on stdin and writes, as JSON, the prompt llama.cpp renders, the chat
// format it picks, its grammar and what its parser makes of each sample output. Built from a llama.cpp
// checkout by make_expected.py; never part of Kafila.
#include "chat.h"
#include "json.hpp"

#include <cstdarg>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

using json = nlohmann::ordered_json;

int LLAMA_BUILD_NUMBER = 0;
const char * LLAMA_COMMIT = "reference";
const char * LLAMA_COMPILER = "";
const char * LLAMA_BUILD_TARGET = "";

extern "C" void ggml_abort(const char * file, int line, const char * fmt, ...) {
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s:%d: ", file, line);
    vfprintf(stderr, fmt, args);
    va_end(args);
    abort();
}

static json call_json(const common_chat_tool_call & call) {
    return json{{"name", call.name}, {"arguments", call.arguments}, {"id", call.id}};
}

static json render(const json & in);

int main() {
    std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    json out;
    try {
        out = render(json::parse(text));
    } catch (const std::exception & e) {  // llama.cpp refuses this case: the test expects a refusal too
        out = json{{"error", e.what()}};
    }
    std::cout << out.dump() << std::endl;
    return 0;
}

static json render(const json & in) {
    auto tmpls = common_chat_templates_init(nullptr, in.at("template").get<std::string>(),
                                            in.at("bos").get<std::string>(), in.at("eos").get<std::string>());
    common_chat_templates_inputs inputs;
    inputs.messages = common_chat_msgs_parse_oaicompat<json>(in.at("messages"));
    if (in.contains("tools") && !in.at("tools").is_null()) {
        inputs.tools = common_chat_tools_parse_oaicompat<json>(in.at("tools"));
    }
    inputs.tool_choice = common_chat_tool_choice_parse_oaicompat(in.value("tool_choice", std::string("auto")));
    inputs.parallel_tool_calls = in.value("parallel_tool_calls", false);
    inputs.add_generation_prompt = in.value("add_generation_prompt", true);
    inputs.use_jinja = true;
    auto params = common_chat_templates_apply(tmpls.get(), inputs);
    json parsed = json::array();
    for (const auto & output : in.value("outputs", json::array())) {
        try {
            auto msg = common_chat_parse(output.get<std::string>(), params.format);
            json calls = json::array();
            for (const auto & call : msg.tool_calls) {
                calls.push_back(call_json(call));
            }
            parsed.push_back(json{{"content", msg.content}, {"tool_calls", calls}});
        } catch (const std::exception & e) {  // this parser refuses this reply
            parsed.push_back(json{{"error", e.what()}});
        }
    }
    return json{{"prompt", params.prompt}, {"format", common_chat_format_name(params.format)},
                {"grammar", params.grammar}, {"grammar_lazy", params.grammar_lazy}, {"parsed", parsed}};
}
