// Routes ExecuTorch's log through our own PAL hook: messages below the chosen
// level are dropped, the rest go to stderr, and errors logged while a call is
// being made are captured so that call can return them in its error string.
#pragma once

#include <string>

namespace etserve {

void log_install();
void log_capture_begin();
std::string log_capture_end();

}  // namespace etserve
