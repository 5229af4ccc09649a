"""POST /completion (and /completions): llama.cpp's own text completion route (Continue's
llama.cpp provider, llama.cpp's scripts and bindings)."""
