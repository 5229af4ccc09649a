"""Tokenizer utilities over HTTP: /tokenize, /detokenize, /apply-template (llama.cpp and vLLM shapes)."""
